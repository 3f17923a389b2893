"""The heads draft: the target's hidden state, propose's draws, a 1-char prompt, the cache,
deterministic training, and the trial's hooks (cache_kwargs, k <= n_heads).

The per-position exactness and greedy-equality tests run heads like every draft in conf/draft/
(tests/engine/decoding/test_exactness.py, tests/engine/decoding/test_decode.py); test_exactness.py also ties the loop's
proposals to the law those tests use, with a misplaced hidden row as the negative control.
"""
from __future__ import annotations

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, generate_speculative, prefill
from src.engine.drafts import BigramDraft, HeadsDraft
from src.engine.drafts import heads as heads_module
from src.engine.errors import SpecsweepError
from src.engine.measuring.measure import measure_cost
from tests.chisquare import varying_multinomial_test
from src.trial.spec import trial_spec
from tests.conftest import draft_options

ALPHA = 1e-4  # per chi-square test; 5 tests here: a correct sampler fails with probability < 5e-4
FAST = draft_options("heads", n_heads=3, steps=4, rows=64, pool_windows=4)  # a few seconds of training at most


def ids_of(corpus, target):
    return target.tokenizer.encode(corpus.split(0.1)[0])


def test_return_hidden_gives_the_logits_and_their_hidden_state(tiny):
    _, corpus, target = tiny
    m = target.model
    x = ids_of(corpus, target)[:40].unsqueeze(0)                           # (1, 40)
    with torch.no_grad(), m.cache_set_aside():
        logits = m(x)
        logits2, hidden = m(x, return_hidden=True)
    assert hidden.shape == (1, 40, m.cfg.d_model)
    assert torch.equal(logits, logits2)
    torch.testing.assert_close(hidden @ m.head.weight.T, logits)          # the unembedding has no bias


def test_propose_draws_each_draft_from_its_q(tiny, drafts):
    """N proposals from one observed state: draft i's histogram against q_i, per position; the
    negative control (draft 2's draws against q_1) must be rejected."""
    cfg, _, target = tiny
    heads = drafts["heads"]
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    _, h = prefill(target.model, prompt, return_hidden=True)
    heads.reset()
    heads.observe(h, prompt[-1])
    gen, k, N = torch.Generator().manual_seed(21), 4, 2000
    draws, qs = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as trials run; tiny ops on 2 threads crawl on a busy machine
    try:
        for _ in range(N):
            d, q = heads.propose(prompt, k, 1.0, gen)
            draws.append(d)
            qs.append(q)
    finally:
        torch.set_num_threads(threads)
    draws = torch.tensor(draws)                                              # (N, k)
    q = qs[0]
    assert all(torch.equal(q, other) for other in qs)                       # the state does not drift
    for i in range(k):
        _, _, pv = varying_multinomial_test(draws[:, i], q[i].expand(N, -1))
        assert pv > ALPHA, f"draft {i + 1} is not drawn from q_{i + 1} (p = {pv:.2e})"
    _, _, pv = varying_multinomial_test(draws[:, 1], q[0].expand(N, -1))
    assert pv < 1e-6, f"the test cannot tell q_2's draws from q_1 (p = {pv:.2e})"


def test_propose_needs_the_observed_row(tiny, drafts):
    cfg, _, target = tiny
    heads = drafts["heads"]
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    heads.reset()
    with pytest.raises(RuntimeError, match="observe"):
        heads.propose(prompt, 2, 1.0, torch.Generator())
    heads.observe(torch.zeros(target.model.cfg.d_model), prompt[-1])
    with pytest.raises(ValueError, match="exceeds"):
        heads.propose(prompt, heads.n_heads + 1, 1.0, torch.Generator())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_char_prompt_starts_with_a_plain_pass(tiny, drafts, temperature):
    """No prefill: the first pass is a plain target pass (counted, no drafts) that gives the
    heads their first row. Greedy output equals the baseline's."""
    _, _, target = tiny
    prompt = target.tokenizer.encode("t").tolist()
    g = generate_speculative(target.model, drafts["heads"], prompt, 50, 2, temperature,
                             torch.Generator().manual_seed(0))
    assert len(g.tokens) == 50
    assert g.chars_emitted == g.target_passes + g.accepted
    assert g.draft_calls == g.target_passes - 1 and g.proposed == 2 * g.draft_calls
    if temperature == 0.0:
        base = generate_baseline(target.model, prompt, 50, 0.0, torch.Generator().manual_seed(0))
        assert g.tokens == base.tokens
    cost = measure_cost(target.model, drafts["heads"], prompt, 2, temperature, reps=2, device="cpu", rounds=1)
    assert cost["draft_char_us"] > 0


def test_probs_is_head_one_and_sample_chain_needs_two_chars(tiny, drafts):
    cfg, _, target = tiny
    heads = drafts["heads"]
    prompt = target.tokenizer.encode(cfg.prompt)
    P = len(prompt)
    probs = heads.probs(prompt.unsqueeze(0), 1.0)[0]                         # (P, V)
    _, q = heads.sample_chain(prompt.unsqueeze(0), 3, 1.0, torch.Generator().manual_seed(0))
    torch.testing.assert_close(probs[-1], q[0, 0])                           # row P-1: d_1's law
    with torch.no_grad(), target.model.cache_set_aside():
        p0 = torch.softmax(target.model(prompt[:1].unsqueeze(0))[0, 0], -1)
    torch.testing.assert_close(probs[0], p0)                                 # row 0: the plain pass's law
    assert probs.shape == (P, target.tokenizer.vocab_size)
    with pytest.raises(ValueError, match="2 chars"):
        heads.sample_chain(prompt[:1].unsqueeze(0), 2, 1.0, torch.Generator())


def test_training_is_deterministic_given_the_seed(tiny):
    _, corpus, target = tiny
    ids = ids_of(corpus, target)
    a, b = (HeadsDraft(target.model, ids, **{**FAST, "seed": 1}) for _ in range(2))
    c = HeadsDraft(target.model, ids, **{**FAST, "seed": 2})
    sa, sb, sc = a.heads.state_dict(), b.heads.state_dict(), c.heads.state_dict()
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    assert not all(torch.equal(sa[n], sc[n]) for n in sa)
    assert a.kl == b.kl and len(a.kl) == 3


def test_heads_are_cached_by_target_and_settings(tiny, tmp_path, monkeypatch):
    _, corpus, target = tiny
    ids = ids_of(corpus, target)
    first = HeadsDraft(target.model, ids, **FAST, cache_dir=tmp_path, target_key="t1")
    files = sorted(tmp_path.glob("heads-*.pt"))
    assert len(files) == 1 and files[0].with_name(files[0].name + ".sha256").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("trained although the heads are cached")
    monkeypatch.setattr(heads_module, "distill", no_training)
    again = HeadsDraft(target.model, ids, **FAST, cache_dir=tmp_path, target_key="t1")
    assert all(torch.equal(v, again.heads.state_dict()[n]) for n, v in first.heads.state_dict().items())
    assert again.kl == first.kl and again.train_seconds == first.train_seconds
    monkeypatch.undo()
    HeadsDraft(target.model, ids, **{**FAST, "steps": 5}, cache_dir=tmp_path, target_key="t1")  # a setting
    HeadsDraft(target.model, ids, **FAST, cache_dir=tmp_path, target_key="t2")                  # a target
    assert len(list(tmp_path.glob("heads-*.pt"))) == 3
    files[0].write_bytes(files[0].read_bytes()[:-10])                        # truncated
    with pytest.raises(SpecsweepError, match="checksum"):
        HeadsDraft(target.model, ids, **FAST, cache_dir=tmp_path, target_key="t1")


@pytest.mark.parametrize("bad", [{"n_heads": 0}, {"steps": 1.5}, {"lr": 0}])
def test_bad_settings_are_refused(tiny, bad):
    _, corpus, target = tiny
    with pytest.raises(ValueError, match="heads"):
        HeadsDraft(target.model, ids_of(corpus, target), **{**FAST, **bad})


def test_trial_offers_cache_and_key_only_to_drafts_that_take_them(tiny):
    from src.trial.load import cache_kwargs
    cfg, _, target = tiny
    spec = trial_spec(cfg)
    assert cache_kwargs(BigramDraft, spec.target, target) == {}
    kw = cache_kwargs(HeadsDraft, spec.target, target)
    assert kw["target_key"] == target.key and kw["cache_dir"].endswith("drafts")


def test_k_past_the_heads_is_refused_before_work(tiny):
    from tests.conftest import compose_cfg
    cfg, _, _ = tiny
    trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=heads", "k=8"))
    with pytest.raises(SpecsweepError, match="heads"):
        trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=heads", "k=9"))
