"""Draft-length policies (src/engine/decoding/policy.py) keep the target's law, and do what they say.

1. The rules: the heuristic schedule's lengths, the confidence stop, the cost rule's decisions
   against its inequality S_i a T(i) > (b + c) E(i), the acceptance map's bins, all exact.
2. The law: the production loop under every adaptive policy with a table draft and a model
   draft (FAST_DRAFTS: bigram, int8), and under one adaptive policy each (in turn) with every
   other shipped draft (marked slow), passes of varying length, emits chars whose law at every
   position of a pass, the bonus position included, is the target's given the emitted prefix (a
   chi-square per position against exact distributions; ALPHA as in test_exactness.py). The
   test first checks that the policy did vary the lengths (the cost rule's on the bigram). Negative
   control: a policy that peeks at the target, ending a pass at its first rejected draft without
   drawing the residual (rejected at p < 1e-6, on a near-uniform bigram where the production rule
   passes the same test).
3. Greedy: at temperature 0 every policy and draft gives the baseline's chars.
4. The cost policy's calibration: its acceptance map is exact given its seed, and a bin's value is
   the mean acceptance min(1, p / q) of the draws whose q(d) fell in it.

False-failure rate: under 100 tests at ALPHA = 1e-4 here: < 1% for a random seed; the seeds are fixed.
"""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

import src.engine.decoding.decode as decode_mod
from src.engine.measuring.acceptance import acceptance_map
from src.engine.decoding.decode import generate_baseline, generate_speculative
from src.engine.decoding.policy import (AcceptanceMap, ConfidencePolicy, CostPolicy, HeuristicPolicy, Policy, make_policy)
from src.engine.sampling import speculative_accept
from tests.chisquare import varying_multinomial_test
from tests.engine.decoding.test_batch import FLAT, batch_draft
from tests.engine.decoding.test_exactness import ALPHA, DRAFT_NAMES, FAST_DRAFTS

RUNS = 1000         # runs of the loop per law test (1,500 for the negative control, for its power)
CONTROL_RUNS = 1500
CAP = 3
FLAT_MAP = AcceptanceMap((0.2, 0.5), (0.3, 0.6, 0.9))   # q(d) < 0.2: 0.3; < 0.5: 0.6; else 0.9


# ---- 1. the rules --------------------------------------------------------------------------------

def test_the_heuristic_schedule():
    p = HeuristicPolicy(2)
    p.reset(6)
    seen = []
    for kept_all in (True, True, True, False, False, False, False, True):
        j = p.length()
        seen.append(j)
        p.update(j, j if kept_all else j - 1)
    assert seen == [2, 4, 6, 6, 5, 4, 3, 2]
    for _ in range(6):                                   # 4 (after the last full accept), then 3, 2, 1, 1, 1
        p.update(p.length(), 0)
    assert p.length() == 1                               # never below 1
    q = make_policy("heuristic", {"start": None}, 8)
    q.reset(8)
    assert q.length() == 8                               # start null: the cap


def test_the_confidence_stop():
    stop = ConfidencePolicy(0.4).stopper()
    assert [stop(x) for x in (0.9, 0.4, 0.39, 0.0)] == [False, False, True, True]
    assert Policy().stopper() is None and HeuristicPolicy(1).stopper() is None


def test_the_cost_rule_follows_its_inequality():
    c, b, o = 0.1, 0.2, 0.15
    stop = CostPolicy(FLAT_MAP, c, b, o).stopper()
    S, E = 1.0, 1.0
    for i, qd in enumerate((0.9, 0.6, 0.3, 0.1, 0.9), start=1):
        a = FLAT_MAP(qd)
        S *= a
        E += S
        T = 1 + o + (b + c) * i
        assert stop(qd) == (S * a * T <= (b + c) * E), i
    # a nearly free draft and verify: keep drafting while the draft is confident; a costly draft stops at once
    cheap, dear = CostPolicy(FLAT_MAP, 0.01, 0.01).stopper(), CostPolicy(FLAT_MAP, 1.0, 0.5).stopper()
    assert not cheap(0.9) and not cheap(0.9) and dear(0.9)


def test_the_acceptance_map_bins():
    assert [FLAT_MAP(x) for x in (0.0, 0.19, 0.2, 0.49, 0.5, 1.0)] == [0.3, 0.3, 0.6, 0.6, 0.9, 0.9]
    with pytest.raises(ValueError):
        make_policy("cost", {}, 4)
    with pytest.raises(ValueError):
        HeuristicPolicy(0)
    with pytest.raises(ValueError):
        ConfidencePolicy(1.5)


# ---- 2. the law ----------------------------------------------------------------------------------

def policy_for(name: str, tiny, draft) -> Policy:
    """The policy under test, set so that its lengths vary on the tiny target: the heuristic from 1,
    the confidence stop at q(d) < 0.5, the cost rule with its map calibrated here and costs at which
    drafting a char of estimated acceptance below about 0.6 does not pay."""
    cfg, _, target = tiny
    if name == "heuristic":
        return HeuristicPolicy(1)
    if name == "confidence":
        return ConfidencePolicy(0.5)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    amap = acceptance_map(target.model, draft, prompt, 1.0, 16, 40, 11, 6)
    return CostPolicy(amap, 0.3, 0.3, 0.0)


POLICIES = ("heuristic", "confidence", "cost")
# every policy with the fast drafts (a table and a model draft); each other draft with one policy,
# in turn, so that every policy also runs with drafts of each other kind
LAW_CASES = ([(name, policy) for name in FAST_DRAFTS for policy in POLICIES]
             + [pytest.param(name, POLICIES[i % len(POLICIES)], marks=pytest.mark.slow)
                for i, name in enumerate(n for n in DRAFT_NAMES if n not in FAST_DRAFTS)])


def loop_runs(target_model, draft, prompt, policy, k, n_chars, runs, temperature=1.0):
    return [generate_speculative(target_model, draft, prompt, n_chars, k, temperature, torch.Generator().manual_seed(s),
                                 track_overlap=False, policy=policy) for s in range(runs)]


def pass_position_p_values(target_model, prompt, gens) -> dict:
    """Per position m of a pass (1 .. its drafted length + 1): the chi-square p-value of the chars
    emitted there over every pass of every run, against the target's law given the emitted prefix."""
    P = len(prompt)
    seqs = [g.tokens for g in gens]
    with torch.no_grad(), target_model.cache_set_aside():
        p = torch.softmax(target_model(torch.tensor([prompt + s for s in seqs])), -1)[:, P - 1:]   # (runs, n+1, V)
    chars, probs = defaultdict(list), defaultdict(list)
    for r, g in enumerate(gens):
        at = 0
        for _, kept in g.passes_log:
            for m in range(kept + 1):
                if at + m < len(seqs[r]):   # the last pass may run past n_chars: its tail was cut
                    chars[m + 1].append(seqs[r][at + m])
                    probs[m + 1].append(p[r, at + m])
            at += kept + 1
    return {m: varying_multinomial_test(torch.tensor(chars[m]), torch.stack(probs[m]))[2]
            for m in sorted(chars) if len(chars[m]) >= 50}


def first_passes_vary(gens) -> bool:
    lengths = {j for g in gens for j, _ in g.passes_log}
    return len(lengths) >= 2


@pytest.mark.parametrize("name,policy_name", LAW_CASES)
def test_every_policy_keeps_the_targets_law(tiny, drafts, name, policy_name):
    cfg, _, target = tiny
    draft = drafts[name]
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    policy = policy_for(policy_name, tiny, draft)
    gens = loop_runs(target.model, draft, prompt, policy, CAP, 6, RUNS)
    if policy_name != "cost" or name == "bigram":   # the cost rule drafts the cap where acceptance is near 1 (int8)
        assert first_passes_vary(gens), f"{policy_name} drafted one length only"
    pv = pass_position_p_values(target.model, prompt, gens)
    assert 1 in pv and 2 in pv, pv
    for m, v in pv.items():
        assert v > ALPHA, f"{name} {policy_name}: pass position {m} p = {v:.2e}"


def peeking_accept(p, q, drafts, u):
    """NEGATIVE CONTROL: a policy that peeks at the target: a pass ends at its first rejected draft
    and keeps the drafts before it, without the residual char (after a first-draft rejection it
    must emit something: the residual). Run with k chars drafted every pass, so truncations are
    frequent: a pass's char at position 2 or later is then always an accepted draft, whose law is
    min(p, q) normalized, not p."""
    n, nxt = speculative_accept(p, q, drafts, u)
    if 0 < n < len(drafts):
        return n - 1, drafts[n - 1]
    return n, nxt


@pytest.mark.slow
def test_the_law_test_catches_a_policy_that_peeks_at_the_target(tiny, monkeypatch):
    """With a near-uniform bigram (most drafts rejected), where an accepted draft's law
    min(p, q) / beta is far from p: the production rule passes the test, the peeking one fails it."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    flat = batch_draft(tiny, *FLAT)
    honest = loop_runs(target.model, flat, prompt, Policy(), CAP, 12, CONTROL_RUNS)
    assert min(pass_position_p_values(target.model, prompt, honest).values()) > ALPHA
    monkeypatch.setattr(decode_mod, "speculative_accept", peeking_accept)
    gens = loop_runs(target.model, flat, prompt, Policy(), CAP, 12, CONTROL_RUNS)
    assert min(pass_position_p_values(target.model, prompt, gens).values()) < 1e-6


# ---- 3. greedy -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", DRAFT_NAMES)
def test_greedy_under_every_policy_equals_the_baseline(tiny, drafts, name):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    base = generate_baseline(target.model, prompt, 40, 0.0, torch.Generator().manual_seed(0)).tokens
    for policy_name in ("fixed",) + POLICIES:
        policy = Policy() if policy_name == "fixed" else policy_for(policy_name, tiny, drafts[name])
        g = generate_speculative(target.model, drafts[name], prompt, 40, CAP, 0.0, torch.Generator().manual_seed(0),
                                 policy=policy)
        assert g.tokens == base, policy_name
        assert g.proposed == sum(j for j, _ in g.passes_log) and all(1 <= j <= CAP for j, _ in g.passes_log)


# ---- 4. calibration ------------------------------------------------------------------------------

def test_the_acceptance_map_is_its_bins_mean_acceptance(tiny, drafts):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    draft = drafts["bigram"]
    amap = acceptance_map(target.model, draft, prompt, 1.0, 8, 30, 5, 4)
    assert amap == acceptance_map(target.model, draft, prompt, 1.0, 8, 30, 5, 4)   # exact given its seed
    assert list(amap.edges) == sorted(amap.edges) and len(amap.values) == len(amap.edges) + 1
    assert all(0 <= v <= 1 for v in amap.values)
    # recompute one bin by hand from the same draws
    from src.engine.measuring.acceptance import sample_text
    seq, p = sample_text(target.model, prompt, 8, 30, 5, 1.0)
    q = draft.probs(seq, 1.0)[:, len(prompt) - 1:len(prompt) - 1 + 30].reshape(-1, p.shape[-1]).double()
    d = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(6))
    qd = q.gather(-1, d)[:, 0]
    r = (p.reshape(-1, p.shape[-1]).double().gather(-1, d)[:, 0] / qd).clamp(max=1.0)
    top = qd >= amap.edges[-1]
    assert amap.values[-1] == pytest.approx(float(r[top].mean()), abs=1e-12)
