"""The prediction's probes (src/trial/probes.py) on the tiny model: each setting's costs, chars per
pass and loops as a trial measures them, at a batch, in a tree, on transformers' loop. No wall-clock time is asserted."""
from __future__ import annotations

import numpy as np
import pytest

from analysis.prediction import prediction_table, without_loops
from src.engine.measuring.formula import Overheads, speedup
from src.predict import measure

from tests.conftest import compose_cfg


# ---- measuring on the tiny model ----------------------------------------------------------------
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
