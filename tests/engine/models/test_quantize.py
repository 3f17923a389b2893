"""Fake quantization: the error bound the bit width implies, the grid size, the memory report."""
import pytest
import torch

from src.engine.models.model import ModelConfig, Transformer
from src.engine.models.quantize import fake_quantize, quantized_copy


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("granularity", ["tensor", "channel", "group"])
def test_error_within_half_a_step_and_levels_within_the_grid(bits, granularity):
    w = torch.randn(64, 96, generator=torch.Generator().manual_seed(bits))
    w_dq, scales = fake_quantize(w, bits, granularity, group_size=32)
    qmax = 2 ** (bits - 1) - 1
    n_scales = {"tensor": 1, "channel": 64, "group": 64 * 3}[granularity]
    assert scales.numel() == n_scales
    # every element within half a step of its scale: |w - w_dq| <= scale / 2
    if granularity == "tensor":
        scale_per_elem = scales.expand(64, 96)
    elif granularity == "channel":
        scale_per_elem = scales.view(64, 1).expand(64, 96)
    else:
        scale_per_elem = scales.view(64, 3, 1).expand(64, 3, 32).reshape(64, 96)
    assert ((w - w_dq).abs() <= scale_per_elem / 2 + 1e-6).all()
    # at most 2 qmax + 1 distinct integer levels
    ints = (w_dq / scale_per_elem).round()
    assert ints.abs().max() <= qmax
    assert torch.allclose(ints * scale_per_elem, w_dq, atol=1e-6)


def test_finer_grids_have_smaller_error():
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    err = {b: (w - fake_quantize(w, b)[0]).abs().mean().item() for b in (8, 4, 2)}
    assert err[8] < err[4] < err[2]
    # per-channel is no worse than per-tensor on rows of different scales
    w = w * torch.linspace(0.1, 5, 64).unsqueeze(1)
    assert (w - fake_quantize(w, 4, "channel")[0]).abs().mean() < (w - fake_quantize(w, 4, "tensor")[0]).abs().mean()


def test_memory_report_and_original_untouched():
    torch.manual_seed(0)
    m = Transformer(ModelConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, d_model=32, dropout=0.0))
    before = {n: p.clone() for n, p in m.state_dict().items()}
    q8, rep8 = quantized_copy(m, 8)
    q4, rep4 = quantized_copy(m, 4)
    assert all(torch.equal(before[n], p) for n, p in m.state_dict().items())
    assert rep8["float32_bytes"] == 4 * m.n_params()
    assert rep4["packed_bytes"] < rep8["packed_bytes"] < rep8["float32_bytes"] / 3
    assert not torch.equal(q4.head.weight, m.head.weight)
    assert torch.equal(q4.ln_f.weight, m.ln_f.weight)   # LayerNorm stays float32


def test_bad_quantization_arguments():
    w = torch.randn(4, 6)
    with pytest.raises(ValueError, match="bits"):
        fake_quantize(w, 1)
    with pytest.raises(ValueError, match="group_size"):
        fake_quantize(w, 4, "group", group_size=4)
    with pytest.raises(ValueError, match="granularity"):
        fake_quantize(w, 4, "row")
