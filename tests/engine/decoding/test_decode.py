"""Decoding loops: greedy equality, full acceptance of an identical draft, counted vs analytic
acceptance, determinism."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from src.engine.decoding.decode import PassInputs, generate_baseline, generate_speculative
from src.engine.drafts import ModelDraft
from tests.engine.decoding.test_exactness import DRAFT_NAMES
from src.trial.spec import trial_spec
from src.trial.trial import run_trial


@pytest.mark.parametrize("k", [1, 2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", DRAFT_NAMES)
def test_greedy_speculative_equals_greedy_baseline(tiny, drafts, name, k):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    base = generate_baseline(target.model, prompt, 100, 0.0, torch.Generator().manual_seed(0))
    spec = generate_speculative(target.model, drafts[name], prompt, 100, k, 0.0, torch.Generator().manual_seed(0))
    assert spec.tokens == base.tokens
    assert spec.target_passes <= base.target_passes
    assert spec.chars_emitted == spec.target_passes + spec.accepted  # one correction/bonus per pass


def test_identical_draft_accepts_everything(tiny):
    """p and q agree up to float rounding (1 vs k+1 tokens per pass), so a rejection needs
    u > p/q with p/q = 1 - O(1e-7): probability ~1e-5 over this run."""
    cfg, corpus, target = tiny
    draft = ModelDraft(target.model, None, name="same", model=copy.deepcopy(target.model))
    prompt = target.tokenizer.encode(cfg.prompt)
    g = generate_speculative(target.model, draft, prompt, 100, 4, 1.0, torch.Generator().manual_seed(1))
    assert g.accepted == g.proposed
    assert g.target_passes == 20 and g.chars_emitted == 100   # 5 chars per pass exactly
    assert abs(g.overlap_sum / g.tested - 1.0) < 1e-5


@pytest.mark.parametrize("name", ["bigram", "int4"])
def test_counted_acceptance_matches_analytic_at_k1(tiny, drafts, name):
    """At k=1 each pass tests one draft, accepted with probability beta_t = sum_x min(p, q).
    accepted - sum beta_t is a sum of independent zero-mean terms with variance
    sum beta_t (1 - beta_t) <= N beta (1 - beta) (Jensen), so |z| < 4 with the bound fails a
    correct sampler with probability < 1e-4."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    accepted = tested = 0
    overlap_sum = 0.0
    for seed in range(20):
        g = generate_speculative(target.model, drafts[name], prompt, 100, 1, 1.0, torch.Generator().manual_seed(seed))
        accepted, tested, overlap_sum = accepted + g.accepted, tested + g.tested, overlap_sum + g.overlap_sum
    beta = overlap_sum / tested
    z = (accepted - overlap_sum) / math.sqrt(tested * beta * (1 - beta))
    assert tested >= 1000
    assert abs(z) < 4, f"counted {accepted / tested:.4f} vs analytic {beta:.4f} (z = {z:.2f})"


@pytest.mark.parametrize("name", ["bigram", "int8"])
def test_same_seed_same_chars_and_counters(tiny, drafts, name):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    runs = [generate_speculative(target.model, drafts[name], prompt, 80, 4, 1.0, torch.Generator().manual_seed(s))
            for s in (3, 3, 4)]
    assert runs[0] == runs[1]           # every counter and every char
    assert runs[0].tokens != runs[2].tokens
    b = [generate_baseline(target.model, prompt, 80, 1.0, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert b[0] == b[1]


def test_trial_counters_are_deterministic(tiny):
    from tests.conftest import compose_cfg
    cfg, _, _ = tiny
    trial_cfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2")
    r1, r2 = run_trial(trial_spec(trial_cfg), progress=False), run_trial(trial_spec(trial_cfg), progress=False)
    counters = ["acceptance", "position_acceptance", "analytic_acceptance", "chars_per_pass", "target_passes",
                "draft_calls", "proposed", "accepted", "acceptance_pos_1", "acceptance_pos_2"]
    assert {c: r1.metrics[c] for c in counters} == {c: r2.metrics[c] for c in counters}
    assert r1.text == r2.text and len(r1.text) == trial_cfg.n_chars
    # the seed's identity: every pass emits its accepted drafts plus one char
    assert r1.metrics["chars_per_pass"] == pytest.approx(1 + 2 * r1.metrics["acceptance"])


def test_pass_inputs_are_the_ids_and_positions_of_the_pass():
    """The buffer holds exactly the ids of the latest call, the positions are the window at start."""
    positions = torch.arange(12)
    inputs = PassInputs(positions, 3)
    x, pos = inputs([5, 7, 9], 4)
    assert x.tolist() == [[5, 7, 9]] and x.dtype == torch.long and pos.tolist() == [4, 5, 6]
    x2, pos2 = inputs([1, 2, 3], 9)
    assert x2.tolist() == [[1, 2, 3]] and pos2.tolist() == [9, 10, 11]
