"""The policy ceiling bench's arithmetic (src/bench/policy_ceiling.py) and the chains it reads
(src/engine/measuring/acceptance.py `chain_acceptance`): exact on small cases, the oracle against brute
force, and r's expectation against beta on a real draft."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from src.bench.policy_ceiling import (fixed_rates, greedy_lengths, lengths_rate, oracle_lengths, pass_chars,
                                      pass_cost)
from src.engine.measuring.acceptance import chain_acceptance, sample_text
from src.engine.decoding.policy import AcceptanceMap, CostPolicy
from tests.conftest import compose_cfg, draft_for


def test_pass_chars_and_costs_by_hand():
    r = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 1.0]])
    assert pass_chars(r).tolist() == [[1.0, 1.5, 1.75, 2.0], [1.0, 2.0, 2.0, 2.0]]
    assert pass_cost(3, 0.25, 0.5).tolist() == [1.5, 1.75, 2.0, 2.25]
    # fixed k = 1: (1.5 + 2) / 2 chains / 1.75
    assert fixed_rates(r, 0.25, 0.5)[0].item() == pytest.approx(1.75 / 1.75)
    assert lengths_rate(r, torch.tensor([3, 1]), 0.25, 0.5) == pytest.approx((2.0 + 2.0) / (2.25 + 1.75))


def test_the_oracle_is_the_best_length_per_chain_by_brute_force():
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        r = torch.rand(4, 3, generator=gen) ** 0.5                     # 4 chains of 3 drafts
        price, o = [0.05, 0.3, 0.8, 1.5][trial % 4], 0.1
        best = max(lengths_rate(r, torch.tensor(ls), price, o) for ls in itertools.product([1, 2, 3], repeat=4))
        assert lengths_rate(r, oracle_lengths(r, price, o), price, o) == pytest.approx(best, rel=1e-12)
        assert best >= fixed_rates(r, price, o).max().item() - 1e-12
        assert best >= lengths_rate(r, greedy_lengths(r, price, o), price, o) - 1e-12


def test_the_greedy_rule_is_the_cost_policy_for_a_constant_estimate():
    for g, price, o in [(0.9, 0.065, 0.1), (0.6, 0.3, 0.2), (0.99, 0.01, 0.0), (0.3, 0.6, 0.1)]:
        policy = CostPolicy(AcceptanceMap((), (g,)), c=price, b=0.0, o=o)
        stop, drafted = policy.stopper(), 0
        while drafted < 16:
            drafted += 1
            if stop(0.5):
                break
        assert greedy_lengths(torch.full((1, 16), g), price, o).item() == drafted


def test_greedy_lengths_stop_at_the_first_char_that_does_not_pay():
    # g = (1, 1, 0.01): chars 1 and 2 pay at price 0.1; char 3 adds 0.01 chars for 0.1 of a pass
    assert greedy_lengths(torch.tensor([[1.0, 1.0, 0.01, 1.0]]), 0.1, 0.0).item() == 2
    # a first char always: even one that would not pay
    assert greedy_lengths(torch.tensor([[0.0, 0.0]]), 0.5, 0.0).item() == 1


def test_kept_probability_averages_to_the_overlap_on_a_real_draft(tiny):
    # E[r_j | prefix, d_<j] = beta_j: the mean of r - beta over chains is 0 up to sampling noise
    # (4 standard errors: a false alarm about 6e-5). A biased r (every draft kept, r = 1) is the
    # negative control the same check must catch.
    cfg, corpus, target = tiny
    model = target.model
    bigram = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"), target, corpus)
    seq, _ = sample_text(model, target.tokenizer.encode(cfg.prompt).tolist(), 16, 40, seed=0)
    r, beta = chain_acceptance(model, bigram, seq, 40, 3, 1.0, seed=1, every=2)
    assert r.shape == beta.shape == (16 * 20, 3)
    assert ((r >= 0) & (r <= 1)).all() and ((beta >= 0) & (beta <= 1)).all()

    def unbiased(x: torch.Tensor) -> bool:
        d = x.double()
        return bool(((d.mean(0)).abs() < 4 * d.std(0) / np.sqrt(len(d))).all())
    assert unbiased(r - beta)
    assert not unbiased(torch.ones_like(r) - beta)                      # every draft kept: biased
