"""The KV-cached forward equals the full-sequence forward, including after rewinds."""
import torch

from src.engine.models.model import ModelConfig, Transformer


def test_cached_logits_equal_full_sequence_logits():
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, d_model=16, dropout=0.0)).eval()
    idx = torch.randint(0, 11, (1, 30))
    with torch.no_grad():
        full = m(idx)  # (1, 30, V)
        m.setup_cache(1)
        pos = torch.arange(32)
        chunks, start = [7, 1, 5, 3, 1, 9, 4], 0  # uneven chunks, as prefill + verify passes
        got = []
        for c in chunks:
            got.append(m(idx[:, start:start + c], pos[start:start + c]))
            start += c
        cached = torch.cat(got, dim=1)
    assert cached.shape == full.shape
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)


def test_rewind_overwrites_stale_cache_entries():
    """Write garbage at positions 10..14, rewind to 10, write the true tokens: same logits."""
    torch.manual_seed(1)
    m = Transformer(ModelConfig(vocab_size=11, block_size=32, n_layer=2, n_head=2, d_model=16, dropout=0.0)).eval()
    idx = torch.randint(0, 11, (1, 20))
    pos = torch.arange(32)
    with torch.no_grad():
        full = m(idx)
        m.setup_cache(1)
        m(idx[:, :10], pos[:10])
        m((idx[:, 10:15] + 1) % 11, pos[10:15])          # rejected drafts
        tail = m(idx[:, 10:12], pos[10:12])              # only 2 of them re-written
    torch.testing.assert_close(tail, full[:, 10:12], atol=1e-5, rtol=1e-5)


def test_forward_with_cache_requires_positions():
    m = Transformer(ModelConfig(vocab_size=5, block_size=8, n_layer=1, n_head=1, d_model=8, dropout=0.0)).eval()
    m.setup_cache(1)
    try:
        m(torch.zeros(1, 2, dtype=torch.long))
    except ValueError as e:
        assert "input_pos" in str(e)
    else:
        raise AssertionError("forward without positions must be refused while a cache is set up")


def test_training_runs_on_every_core_unless_capped(monkeypatch):
    """all_cores: every core, or SPECSWEEP_TRAIN_THREADS of them (the tests' cap), and the caller's
    thread count back afterwards."""
    import os
    from src.engine.models.train import all_cores
    cores = os.cpu_count() or 1
    torch.set_num_threads(1)
    for cap, expected in ((None, cores), ("1", 1), (str(cores + 5), cores), ("none", cores), ("0", cores)):
        if cap is None:
            monkeypatch.delenv("SPECSWEEP_TRAIN_THREADS", raising=False)
        else:
            monkeypatch.setenv("SPECSWEEP_TRAIN_THREADS", cap)
        with all_cores():
            assert torch.get_num_threads() == expected, cap
        assert torch.get_num_threads() == 1
