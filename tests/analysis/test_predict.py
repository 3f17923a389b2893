"""analysis.predict: the prediction's formulas on planted inputs, the acceptance estimators, the pays
map's 1x contour, and the CLI's refusals. No wall-clock time is asserted."""
from __future__ import annotations

import copy
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from analysis import figures
from analysis.pays import MAP_KS, PaysInputs, pays_grid
from src.engine.measuring.formula import Overheads, chars_per_pass, iid_chars_per_pass, speedup
from analysis.predict import ape_summary, measure, prediction_table, probes_after, without_loops
from src.engine.measuring.acceptance import chain_survival, expected_accepted, loop_survival, sample_text, survival
from src.engine.drafts.model_draft import ModelDraft
from src.engine.sampling import uniforms
from src.engine.decoding.tree import Tree, tree_accept

from tests.conftest import REPO, compose_cfg, draft_for


# ---- the formulas -------------------------------------------------------------------------------
def test_planted_speedups_are_recovered_exactly():
    s = [0.5, 0.25, 0.125]                               # S_i = a^i with a = 0.5
    assert chars_per_pass(s, 2) == 1.75
    for k in (1, 2, 3):
        assert chars_per_pass(s, k) == pytest.approx(float(iid_chars_per_pass(0.5, k)), rel=1e-15)
    assert iid_chars_per_pass(1.0, 4) == 5.0             # k + 1 at a = 1
    # cpp t1 / (tv + n td): 1.75 * 100 / (150 + 2 * 10)
    assert speedup(1.75, 100.0, 150.0, 10.0, 2) == pytest.approx(175 / 170, rel=1e-15)
    # with overheads: cpp (t1 + o_base) / (tv + o_pass + n td (1 + gamma))
    o = Overheads(o_base=20.0, o_pass=30.0, gamma=0.5)
    assert speedup(1.75, 100.0, 150.0, 10.0, 2, o) == pytest.approx(1.75 * 120 / (150 + 30 + 2 * 10 * 1.5), rel=1e-15)
    # tv = t1 and no overheads: the seed formula cpp / (1 + k c)
    table = prediction_table(s, {k: {"k": k, "target_pass_us": 100.0, "verify_pass_us": 100.0, "draft_char_us": 5.0,
                                     "nodes": k} for k in (1, 2, 3)}, Overheads(), a=0.5)
    np.testing.assert_allclose(table["predicted"], table["seed formula"], rtol=1e-15)
    np.testing.assert_allclose(table["predicted"], [1.5 / 1.05, 1.75 / 1.1, 1.875 / 1.15], rtol=1e-15)
    np.testing.assert_allclose(table["cpp iid"], table["cpp"], rtol=1e-15)


@pytest.mark.parametrize("k", [1, 4, 16])
def test_a_draft_off_by_a_factor_moves_the_prediction_by_the_formulas_factor(k):
    s = 0.8 ** np.arange(1, k + 1)
    t1, tv, td = 800.0, 1000.0, 40.0
    base = speedup(chars_per_pass(s, k), t1, tv, td, k)
    # c doubled: only the 1 + k c term (here tv/t1 + k c) changes
    assert speedup(chars_per_pass(s, k), t1, tv, 2 * td, k) / base == pytest.approx(
        (tv / t1 + k * td / t1) / (tv / t1 + 2 * k * td / t1), rel=1e-12)
    # every position's acceptance halved: the chars per pass, and nothing else, change
    half = 1 + s.sum() / 2
    assert speedup(chars_per_pass(s / 2, k), t1, tv, td, k) / base == pytest.approx(half / (1 + s.sum()), rel=1e-12)
    # a verify pass twice as dear with a free draft: the prediction halves
    assert speedup(chars_per_pass(s, k), t1, 2 * tv, 0.0, k) / speedup(chars_per_pass(s, k), t1, tv, 0.0, k) == 0.5


def test_ape_summary_keeps_the_paper_drafts_apart():
    cells = pd.DataFrame({"draft_name": ["bigram", "int8", "bigram", "ngram", "ngram", "heads"],   # a cell's column
                          "draft": ["bigram", "int8", "bigram+tree2-1", "ngram", "ngram@compiled", "heads"],
                          "ape %": [1.0, 3.0, 8.0, 2.0, 10.0, np.nan]})
    out = ape_summary(cells, ("bigram", "int8", "int4")).set_index("cells")
    assert out.loc[3, ["median APE %", "max APE %"]].tolist() == [3.0, 8.0]     # bigram, int8, bigram's tree
    assert out.loc[2, ["median APE %", "max APE %"]].tolist() == [6.0, 10.0]    # ngram on two engines; heads: no error


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


# ---- the pays map -------------------------------------------------------------------------------
def test_pays_map_contour_at_one_lies_where_the_formula_says():
    """tv(k)/t1 = 1 + b k, no overheads: at k = 1 the speedup (1 + a) / (1 + b + c) is 1 on
    c = a - b, and every larger k gives (1 + a + ... + a^k) / (1 + k b + k (a - b)) <= 1 there
    (a^j <= a), so the best-k map's 1x contour is the line c = a - b."""
    b = 0.1
    a = np.linspace(b, 0.99, 50)
    s, k = pays_grid(a, a - b, MAP_KS, lambda k: 1 + b * k)
    np.testing.assert_allclose(s, 1.0, rtol=1e-12)
    assert (pays_grid(a, a - b + 0.01, MAP_KS, lambda k: 1 + b * k)[0] < 1).all()
    assert (pays_grid(a, a - b - 0.01, MAP_KS, lambda k: 1 + b * k)[0] > 1).all()
    # the drawn contour: its vertices lie on c = a - b within the grid's step
    inputs = PaysInputs("planted", b, 1000.0, Overheads(), pd.DataFrame(columns=["draft", "k", "a", "c", "measured"]))
    fig = figures.pays_map(inputs, MAP_KS, grid=121)
    cs = next(c for c in fig.axes[0].collections if hasattr(c, "levels") and 1.0 in list(c.levels))
    segs = np.concatenate(cs.allsegs[list(cs.levels).index(1.0)])          # (n, 2): (a, c) vertices
    step = max(0.999, 1.2) / 120
    assert len(segs) > 10 and np.abs(segs[:, 1] - (segs[:, 0] - b)).max() < step
    figures.plt.close(fig)


# ---- measuring on the tiny model, and the CLI -----------------------------------------------------
def test_validate_says_how_long_after_the_sweeps_last_trial_its_probes_ran():
    starts = pd.Series(pd.to_datetime(["2026-12-04 22:00", "2026-12-04 22:30", "2026-12-04 21:10"], utc=True))
    line = probes_after(starts, pd.Timestamp("2026-12-05 00:00", tz="UTC"))
    assert "from 2026-12-04 21:10 to 2026-12-04 22:30 UTC" in line and "began 1.5 h after its last" in line


def test_measure_on_the_tiny_model(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram")
    m = measure(dcfg, [1, 2], None, seqs=2, every=16, seed=0, loaded=(corpus, target))
    assert m.target_key == target.key and len(m.survival) == 2 and set(m.costs) == {1, 2}
    table = prediction_table(m.survival, m.costs, Overheads(), m.a)
    assert table["k"].tolist() == [1, 2] and table["predicted"].gt(0).all()
    # each k's chars per pass from its own loop; m.survival is the largest k's
    assert table["cpp"].tolist() == [m.costs[1]["cpp"], m.costs[2]["cpp"]]
    assert m.costs[2]["cpp"] == pytest.approx(1 + m.survival.sum(), rel=1e-12)
    assert all(1 <= m.costs[k]["cpp"] <= k + 1 for k in (1, 2))
    # each chain's loops measured with its components: o_base and o_pass as a trial's cost model reads them
    for k, c in m.costs.items():
        o = c["overheads"]
        assert o.o_base == c["base_pass_us"] - c["target_pass_us"] and o.o_pass == c["free_pass_us"] - c["verify_pass_us"]
        assert len(c["spread"].rounds["free"]) == len(c["spread"].rounds["target"]) == 15
        row = table[table["k"] == k].iloc[0]
        assert row["predicted"] == pytest.approx(c["cpp"] * c["base_pass_us"]
                                                 / (c["free_pass_us"] + k * c["draft_char_us"]), rel=1e-12)
    fitted = prediction_table(m.survival, without_loops(m.costs), Overheads(), m.a)   # --fit-sweep: fitted ones apply
    assert "o_pass" not in fitted and (fitted["predicted"] == [float(speedup(c["cpp"], c["target_pass_us"],
                                       c["verify_pass_us"], c["draft_char_us"], k, Overheads()))
                                       for k, c in m.costs.items()]).all()


def in_loop_asked(monkeypatch, name: str) -> list:
    """The `in_loop` argument of every call of src.engine.measuring.measure's `name` (it still runs)."""
    import src.engine.measuring.measure as measure_mod
    asked = []
    real = getattr(measure_mod, name)

    def recording(*args, **kwargs):
        asked.append(kwargs.get("in_loop"))
        return real(*args, **kwargs)
    monkeypatch.setattr(measure_mod, name, recording)
    return asked


def test_a_model_drafts_td_is_its_proposal_timed_after_a_verify_pass_in_the_loops_shares(tiny, monkeypatch):
    """int8 (a ModelDraft) in a chain: measure_cost gets the share of full accepts S_k (the loop's
    passes catching up two chars), td is the in-loop proposal (the median of its rounds, drawn for
    the interval), the lone proposal's c is beside it; --fit-sweep's costs (without_loops) go back
    to the lone td and its rounds, on which the fitted gamma was fitted. bigram: timed alone only."""
    shares = in_loop_asked(monkeypatch, "measure_cost")
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=int8")
    m = measure(dcfg, [2], None, seqs=2, every=16, seed=0, loaded=(corpus, target))
    c = m.costs[2]
    assert shares == [m.survival[1]] and 0 < shares[0] < 1     # S_2 of k = 2's own loop
    r = c["spread"].rounds
    assert c["draft_char_us"] == pytest.approx(np.median(r["draft"]), rel=1e-12)
    assert c["draft_char_us_alone"] == pytest.approx(np.median(r["draft alone"]), rel=1e-12)
    assert r["draft"] != r["draft alone"]
    row = prediction_table(m.survival, m.costs, Overheads(), m.a).iloc[0]
    assert row["c alone"] == c["draft_char_us_alone"] / c["target_pass_us"]
    assert row["c"] == c["draft_char_us"] / c["target_pass_us"]
    assert row["predicted"] == pytest.approx(c["cpp"] * c["base_pass_us"] / (c["free_pass_us"] + 2 * c["draft_char_us"]),
                                             rel=1e-12)
    fitted = without_loops(m.costs)[2]
    assert fitted["draft_char_us"] == c["draft_char_us_alone"] and "draft_char_us_alone" not in fitted
    assert fitted["spread"].rounds["draft"] == r["draft alone"] and "draft alone" not in fitted["spread"].rounds
    assert "c alone" not in prediction_table(m.survival, without_loops(m.costs), Overheads(), m.a)
    shares.clear()
    b = measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"), [2], None, seqs=2, every=16, seed=0,
                loaded=(corpus, target))
    assert shares == [None] and "draft_char_us_alone" not in b.costs[2]


@pytest.mark.parametrize("draft", ["bigram", "ngram"])
def test_at_a_batch_the_batchs_loops_give_the_overheads(tiny, draft):
    """batch=2: the batch's baseline loop and its loop replaying a recorded batch run are timed with
    the components; o_base, o_pass and the prediction follow from their times exactly, as at B = 1
    (ngram: its td the cold cost times B)."""
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={draft}", "batch=2", "n_chars=48")
    m = measure(dcfg, [2], None, seqs=2, every=16, seed=0, loaded=(corpus, target))
    c = m.costs[2]
    o = c["overheads"]
    assert o.o_base == c["base_pass_us"] - c["target_pass_us"] and o.o_pass == c["free_pass_us"] - c["verify_pass_us"]
    assert len(c["spread"].rounds["free"]) == len(c["spread"].rounds["base"]) == len(c["spread"].rounds["target"])
    row = prediction_table(m.survival, m.costs, Overheads()).iloc[0]
    assert row["predicted"] == pytest.approx(c["cpp"] * c["base_pass_us"] / (c["free_pass_us"] + 2 * c["draft_char_us"]),
                                             rel=1e-12)


def test_at_a_batch_a_model_drafts_td_is_its_batch_proposal_after_a_verify_pass(tiny, monkeypatch):
    """int8 at batch=2: measure_batch_cost times the proposal in the loop's order (in_loop), td is
    that (its rounds drawn for the interval), the lone batch proposal kept beside it; bigram: alone."""
    asked = in_loop_asked(monkeypatch, "measure_batch_cost")
    cfg, corpus, target = tiny
    m = measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=int8", "batch=2", "n_chars=48"), [2], None,
                seqs=2, every=16, seed=0, loaded=(corpus, target))
    c, r = m.costs[2], m.costs[2]["spread"].rounds
    assert asked == [True]
    assert c["draft_char_us"] == pytest.approx(np.median(r["draft"]), rel=1e-12)
    assert c["draft_char_us_alone"] == pytest.approx(np.median(r["draft alone"]), rel=1e-12) and r["draft"] != r["draft alone"]
    row = prediction_table(m.survival, m.costs, Overheads()).iloc[0]
    assert row["c alone"] == c["draft_char_us_alone"] / c["target_pass_us"]
    assert row["predicted"] == pytest.approx(c["cpp"] * c["base_pass_us"] / (c["free_pass_us"] + 2 * c["draft_char_us"]),
                                             rel=1e-12)
    asked.clear()
    b = measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "batch=2", "n_chars=48"), [2], None,
                seqs=2, every=16, seed=0, loaded=(corpus, target))
    assert asked == [False] and "draft_char_us_alone" not in b.costs[2]


def test_a_table_drafts_cold_replay_follows_a_verify_pass_in_a_chain_not_in_a_tree(tiny, monkeypatch):
    import src.engine.measuring.measure as measure_mod
    befores = []
    real = measure_mod.replay_draft_costs

    def recording(*args, before=None, **kwargs):
        befores.append(before)
        return real(*args, before=before, **kwargs)
    monkeypatch.setattr(measure_mod, "replay_draft_costs", recording)
    cfg, corpus, target = tiny
    m = measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=ngram"), [2], None, seqs=2, every=16, seed=0,
                loaded=(corpus, target))
    assert len(befores) == 1 and callable(befores[0]) and "draft_char_us_warm" in m.costs[2]
    befores.clear()
    measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=ngram", "verify=tree", "verify.widths=[2,1]", "k=2"),
            [], [(2, 1)], seqs=2, every=16, seed=0, loaded=(corpus, target))
    assert befores == [None]
    # at a batch of 2: a (2, k+1) verify pass before every 2 proposals
    calls = []
    real_target = target.model.forward

    def note(idx, *args, **kwargs):
        calls.append(tuple(idx.shape))
        return real_target(idx, *args, **kwargs)

    def batch_recording(*args, before=None, every=1, **kwargs):
        befores.append((before, every))
        calls.clear()
        before()
        assert calls == [(2, 3)]                       # the batch's verify pass at k = 2
        return real(*args, before=before, every=every, **kwargs)
    monkeypatch.setattr(measure_mod, "replay_draft_costs", batch_recording)
    monkeypatch.setattr(target.model, "forward", note)
    befores.clear()
    measure(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=ngram", "batch=2", "n_chars=48"), [2], None,
            seqs=2, every=16, seed=0, loaded=(corpus, target))
    assert len(befores) == 1 and befores[0][1] == 2


def test_measure_a_tree_of_a_table_draft_on_the_tiny_model(tiny):
    """A tree's chars per pass lies in [1, depth + 1], its nodes at most the shape's; a table draft's
    td is the cold replay's, with the warm one kept beside it."""
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=ngram", "verify=tree", "verify.widths=[2,1]", "k=2")
    m = measure(dcfg, [], [(2, 1)], seqs=2, every=16, seed=0, loaded=(corpus, target))
    cost = m.costs["2-1"]
    assert 1 <= cost["cpp"] <= 3 and 1 <= cost["nodes"] <= 4 and "draft_char_us_warm" in cost
    assert len(m.survival) == 0 and prediction_table(m.survival, m.costs, Overheads())["setting"].tolist() == ["2-1"]


@pytest.mark.parametrize("draft", ["int8", "prompt_lookup"])
def test_measure_on_the_library_loop(tiny, draft):
    """engine=transformers: chars per pass from the library's own counters (exactly the counted
    runs'), its overheads measured with the costs, o_base = its plain step less its one-char pass."""
    from src.trial.library_trial import library_loop
    from src.trial.load import build_draft
    from src.trial.spec import trial_spec
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={draft}", "engine=transformers", "k=2")
    m = measure(dcfg, [2], None, seqs=2, every=16, seed=0, loaded=(corpus, target), rounds=3)
    spec = trial_spec(dcfg)
    loop = library_loop(spec, target.model, build_draft(spec.draft, spec.target, target, corpus))
    prompt = target.tokenizer.encode(spec.prompt).tolist()
    runs = [loop.counted(loop.speculative, prompt, spec.n_chars, s) for s in (0, 1)]
    assert m.costs[2]["cpp"] == sum(g.chars_emitted for g in runs) / sum(g.target_passes for g in runs)
    # the drafted chars per pass: their shares' mean (summed in another order: equal to rounding)
    assert m.costs[2]["nodes"] == pytest.approx(sum(g.proposed for g in runs) / sum(g.target_passes for g in runs),
                                                rel=1e-12)
    c = m.costs[2]
    assert m.overheads.o_base == pytest.approx(c["base_pass_us"] - c["target_pass_us"]) == m.overheads.o_pass
    table = prediction_table(m.survival, m.costs, m.overheads, m.a)
    assert table["predicted"].gt(0).all()


def test_predict_regimes_on_the_tiny_model(tiny, capsys):
    """engine= and batch= lists: one prediction per regime with its interval, a refused regime left out
    with its reason (before any is measured), the best per regime and the break-even batch per engine."""
    import argparse
    from analysis.predict import predict_regimes
    from tests.conftest import PROMPT
    cfg, corpus, target = tiny
    overrides = ["model=tiny", "train=quick", f"data.path={cfg.data.path}", f"data.cache_dir={cfg.data.cache_dir}",
                 f"prompt='{PROMPT}'", "n_chars=64", "timing.cost_reps=2", "timing.cost_width=null", "draft=int8"]
    args = argparse.Namespace(seqs=2, every=16, seed=0, rounds=3, fit_sweep=None, runs=1)
    best = predict_regimes(args, overrides, [1, 2], ["eager", "onnx", "transformers"], [1, 2], Overheads(),
                           (corpus, target))
    out = capsys.readouterr().out
    assert out.startswith("regimes left out: engine=transformers batch=2 (no setting left to predict: batch=2: "
                          "engine=transformers runs one sequence; use engine=eager, compiled or onnx)\n")
    assert list(zip(best["engine"], best["batch"])) == [("eager", 1), ("eager", 2), ("onnx", 1), ("onnx", 2),
                                                         ("transformers", 1)]
    assert (best["lo"] <= best["hi"]).all() and best["predicted"].gt(0).all() and set(best["k"]) <= {1, 2}
    assert out.count("recommended: ") == 5 and "lo-hi: the central 95% of 2000 bootstrap replicates" in out
    assert "best predicted setting per regime" in out
    table = out.split("predicted break-even batch per engine")[1]
    assert [line.split()[0] for line in table.splitlines()[2:4]] == ["eager", "onnx"] and "break-even B" in table
    assert "(not placed: transformers, predicted at one batch size only)" in table


@pytest.mark.slow
@pytest.mark.parametrize("args, says", [(["draft=nosuch"], "error: unknown draft 'nosuch'"),
                                        (["draft=bigram", "k=0"], "error: k must be"),
                                        (["draft=bigram", "batch=1,x"], "error: batch must be"),
                                        (["draft=bigram", "engine=eager,nosuch"], "error: unknown engine 'nosuch'"),
                                        (["--validate", "batch=1,16"], "error: --validate takes each cell's engine"),
                                        (["--validate", "--hold-out"], "error: --hold-out needs --validate and --fit-sweep"),
                                        (["--validate", "--tracking-uri", "sqlite:////nonexistent/x.db"],
                                         "error: no tracking store")])
def test_cli_bad_input_is_one_line_and_exit_2(args, says):
    proc = subprocess.run([sys.executable, "-m", "analysis.predict", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(says) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.slow
def test_validate_predicts_every_cell_of_a_finished_sweep_with_both_intervals(smoke_stores, capsys):
    """--validate on the smoke sweep (3 drafts x k = 1, 4 on the tiny model, eager, batch 1): one row per
    cell with the prediction's interval beside the measured one (the report's pooled median and
    interval), its APE, and the per-regime error table over those rows."""
    import argparse
    from pathlib import Path
    from analysis.aggregate import pooled_speedup
    from analysis.sweep_data import DEFAULT_EXPERIMENT, connect, load_sweep
    from analysis.predict import regime_errors, validate_sweep
    uri, _ = smoke_stores[1]
    store = Path(uri.removeprefix("sqlite:///")).parent
    args = argparse.Namespace(uri=uri, experiment=DEFAULT_EXPERIMENT, sweep_id=None, seqs=2, every=16, seed=0,
                              rounds=3, fit_sweep=None, hold_out=False, runs=1)
    overrides = ["data=synthetic", "model=tiny", "train=quick", f"data.cache_dir={store.parent}/cache",
                 "prompt='The cat '", "timing.cost_reps=2"]
    cells = validate_sweep(args, overrides, Overheads())
    assert sorted(zip(cells["draft"], cells["k"])) == [(d, k) for d in ("bigram", "int4", "int8") for k in (1, 4)]
    speed = pooled_speedup(load_sweep(connect(uri), DEFAULT_EXPERIMENT).pairs).set_index(["draft", "k"])
    for _, r in cells.iterrows():
        m = speed.loc[(r["draft"], r["k"])]
        assert (r["measured"], r["meas lo"], r["meas hi"]) == (m["median"], m["lo"], m["hi"])
        assert 0 < r["pred lo"] <= r["pred hi"]
    errors = regime_errors(cells)
    assert errors[["engine", "batch", "cells"]].values.tolist() == [["eager", 1, 6]]
    assert errors["max APE %"].iloc[0] == pytest.approx(cells["ape %"].max())
    assert "per regime (narrow: cells whose measured interval is under 10% of their median wide)" in capsys.readouterr().out


# ---- several probe runs: their order and seeds ---------------------------------------------------
def planted_measure(calls: list, seqs: int):
    """A stand-in for analysis.predict.measure that notes (draft, engine, batch, seed) of each call
    and returns planted costs per k: cpp 3, t1 100 us, tv 120 us, td by run (seed // seqs: 5, 40,
    10 us), no spread of their own."""
    from analysis.predict import Measured
    from tests.analysis.test_predict_interval import flat

    def fake(cfg, ks, shapes, seqs_, every, seed, loaded=None, rounds=15):
        calls.append((cfg.draft.name, cfg.engine.name, int(cfg.batch), seed))
        td = (5.0, 40.0, 10.0)[seed // seqs]
        return Measured("key", 0.5, np.zeros(0), {k: flat(3.0, 100.0, 120.0, td, k) for k in ks}, 1.0)
    return fake


def test_probe_runs_go_run_by_run_over_every_regime_on_disjoint_seeds(monkeypatch, capsys):
    """--runs 3 over two regimes: every regime's first run, then every regime's second, ... (a
    regime's runs spread over the command, not back to back), run r from seed + r * seqs; each
    regime predicted at the median of its runs (the middle td, 10 us: a mean would be pulled by
    the slow 40 us run), its interval holding the runs' spread."""
    import argparse
    import analysis.predict as predict_mod
    calls = []
    monkeypatch.setattr(predict_mod, "measure", planted_measure(calls, 16))
    args = argparse.Namespace(seqs=16, every=8, seed=0, rounds=3, fit_sweep=None, runs=3)
    best = predict_mod.predict_regimes(args, ["draft=bigram"], [2], ["eager"], [1, 2], Overheads(), (None, None))
    assert calls == [("bigram", "eager", b, seed) for seed in (0, 16, 32) for b in (1, 2)]
    assert best["predicted"].tolist() == pytest.approx([300 / 140] * 2, rel=1e-12)
    assert (best["lo"] <= 300 / 200).all() and (best["hi"] >= 300 / 130).all()
    out = capsys.readouterr().out
    assert out.count("recommended: ") == 2 and out.count("3 independent probe runs") == 2
    assert "probe run 1/3: engine eager batch 1 measured in 1.0 s" in out


@pytest.mark.slow
def test_validate_probe_runs_go_run_by_run_over_every_cell(smoke_stores, monkeypatch):
    """--validate --runs 3 on the smoke sweep: every cell's first run, then every cell's second, ...,
    run r from seed + r * seqs; each cell predicted at the median of its runs."""
    import argparse
    from pathlib import Path
    import analysis.predict as predict_mod
    from analysis.sweep_data import DEFAULT_EXPERIMENT
    uri, _ = smoke_stores[1]
    store = Path(uri.removeprefix("sqlite:///")).parent
    calls = []
    monkeypatch.setattr(predict_mod, "measure", planted_measure(calls, 2))
    args = argparse.Namespace(uri=uri, experiment=DEFAULT_EXPERIMENT, sweep_id=None, seqs=2, every=16, seed=0,
                              rounds=3, fit_sweep=None, hold_out=False, runs=3)
    overrides = ["data=synthetic", "model=tiny", "train=quick", f"data.cache_dir={store.parent}/cache",
                 "prompt='The cat '", "timing.cost_reps=2"]
    cells = predict_mod.validate_sweep(args, overrides, Overheads())
    assert calls == [(d, "eager", 1, seed) for seed in (0, 2, 4) for d in ("bigram", "int4", "int8")]
    np.testing.assert_allclose(cells["predicted"], 3 * 100 / (120 + cells["k"] * 10.0), rtol=1e-12)
    assert (cells["pred lo"] <= 3 * 100 / (120 + cells["k"] * 40.0) + 1e-12).all()
