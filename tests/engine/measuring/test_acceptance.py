"""The acceptance estimators (src/engine/measuring/acceptance.py) that the prediction's probes use:
exact on planted chains and trees, one for the target itself, unbiased for the loop's own chars per pass."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from src.engine.decoding.tree import Tree, tree_accept
from src.engine.drafts.model_draft import ModelDraft
from src.engine.measuring.acceptance import chain_survival, expected_accepted, loop_survival, sample_text, survival
from src.engine.sampling import uniforms

from tests.conftest import compose_cfg, draft_for


# ---- the acceptance estimators ------------------------------------------------------------------
def test_survival_on_planted_chains_is_the_exact_probability():
    # V = 2, every position p = (0.8, 0.2), q = (0.5, 0.5): beta = 0.7, and
    # P(kept 1..i) = E[r]^(i-1) beta with E_q[min(1, p/q)] = beta = 0.7. Enumerating the 4 equally
    # likely chains of 2 drafts makes the estimator's mean the expectation itself.
    p = torch.tensor([0.8, 0.2]).expand(4, 3, 2)
    q = torch.tensor([0.5, 0.5]).expand(4, 3, 2)
    drafts = torch.tensor([[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0]])
    s = survival(p, q, drafts)
    assert s[0].item() == pytest.approx(0.7, abs=1e-7)
    assert s[1].item() == pytest.approx(0.49, abs=1e-7)
    # draft == target: every draft is kept
    assert torch.equal(survival(p, p.clone(), drafts), torch.ones(3))


def test_chain_survival_of_the_target_itself_is_one(tiny):
    """A draft equal to the target (int8 on the tiny model is not; a draft whose chain is the
    target's own samples is): every S_i is 1, so cpp(k) = k + 1."""
    cfg, _, target = tiny
    model = target.model
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    seq, p = sample_text(model, prompt, 3, 20, seed=0)

    class Itself:
        def reset(self):
            pass

        def sample_chain(self, prefix, k, temperature, gen):
            out, qs = prefix, []
            for _ in range(k):
                q = torch.softmax(model(out)[:, -1], -1)
                out = torch.cat([out, torch.multinomial(q, 1, generator=gen)], 1)
                qs.append(q)
            return out[:, prefix.shape[1]:], torch.stack(qs, 1)

    s = chain_survival(model, Itself(), seq, 20, 4, 1.0, seed=0, every=5)
    np.testing.assert_allclose(s.numpy(), 1.0, atol=1e-5)
    # a real draft: S_i falls with i, and S_1 is an overlap (in [0, 1])
    bigram = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"), target, tiny[1])
    s = chain_survival(model, bigram, seq, 20, 4, 1.0, seed=0, every=5).numpy()
    assert 0 < s[0] <= 1 and all(np.diff(s) <= 1e-7)


def test_loop_survival_of_the_target_itself_is_one_at_every_pass(tiny):
    """The target drafting for itself (its own copy, q = p up to the cached forward's rounding): every
    pass adds S_i = 1, so S = (1, ..., 1) and every pass emits k + 1 chars."""
    cfg, _, target = tiny
    model = target.model
    itself = ModelDraft(model, None, model=copy.deepcopy(model))
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    s, passes, chars = loop_survival(model, itself, prompt, 40, 3, 1.0, seeds=range(2))
    np.testing.assert_allclose(s.numpy(), 1.0, atol=1e-4)
    assert chars == 4 * passes


# Over independent seeds, D = chars - passes - sum of the passes' S_1 + ... + S_k has mean 0 per seed
# (n - (S_1 + ... + S_k) has conditional mean 0 at every pass start). The test: |t| of the seeds' D
# below 4 (a false alarm about 3e-4 for a t with 39 degrees of freedom, D being a sum of many
# bounded martingale differences, nearly normal).
T_BOUND = 4.0


def loop_t(estimates, counts) -> float:
    d = np.array(counts) - np.array(estimates)
    return float(d.mean() / (d.std(ddof=1) / math.sqrt(len(d))))


def test_loop_survival_is_unbiased_for_the_loops_own_chars_per_pass_and_a_10pct_bias_is_caught(tiny):
    cfg, corpus, target = tiny
    model = target.model
    bigram = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"), target, corpus)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    k, runs = 4, []
    for seed in range(40):
        s, passes, chars = loop_survival(model, bigram, prompt, 60, k, 1.0, seeds=[seed])
        runs.append((passes, float(s.sum()) * passes, chars - passes))  # passes, sum of S over passes, accepted
    passes, expected, accepted = map(np.array, zip(*runs))
    assert abs(loop_t(expected, accepted)) < T_BOUND
    # negative control: the same estimates 10% high (the uniform prefixes' bias was 2-7% in chars per
    # pass on the medium target, so 10% of the accepted chars here) must fail the same check
    assert abs(loop_t(1.1 * expected, accepted)) >= T_BOUND


def planted_tree():
    """Root row q = (0.5, 0.5, 0); two children: char 0 (mass 1, q_1 = q) then char 1 (mass 0.5,
    q_2 = (0, 1, 0)); child 1 has one child of its own, char 2, from row (0, 0.25, 0.75)."""
    return Tree(tokens=[9, 0, 1, 2], parent=[-1, 0, 0, 1], depth=[0, 1, 1, 2], children=[[1, 2], [3], [], []],
                rows=[[0.5, 0.5, 0.0], [0.0, 0.25, 0.75], None, None], mass=[0.0, 1.0, 0.5, 1.0])


def test_expected_accepted_matches_its_formula_and_recursive_rejection_sampling():
    P = [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4], [1 / 3, 1 / 3, 1 / 3]]
    tree = planted_tree()
    # child 1: a = min(1, 0.2 / 0.5) = 0.4, then its child (char 2, q = 0.75): min(1, 0.8 / 0.75) = 1;
    # rejected: r = normalize(max(0, p - q_1)) = (0, 0, 1), child 2 (char 1, q_2(1) = 1): a = 0
    exact = expected_accepted(P, tree)
    assert exact == pytest.approx(0.4 * (1 + 1.0), rel=1e-12)
    # tree_accept's mean path length over n draws: |mean - exact| < 5 sd fails with prob < 1e-6
    n, gen = 20000, torch.Generator().manual_seed(5)
    lengths = [len(tree_accept(P, tree, uniforms(tree.n_nodes + 1, gen))[0]) for _ in range(n)]
    sd = np.std(lengths) / math.sqrt(n)
    assert abs(np.mean(lengths) - exact) < 5 * sd
