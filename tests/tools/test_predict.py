"""`python -m src.predict` (src/predict.py): regimes, --validate on a finished sweep, the probe runs'
order and seeds, and the command line's refusals. No wall-clock time is asserted."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from src.engine.measuring.formula import Overheads

from tests.conftest import REPO
from tests.commands import run_command


# ---- the command -------------------------------------------------------------------------------
def test_predict_regimes_on_the_tiny_model(tiny, capsys):
    """engine= and batch= lists: one prediction per regime with its interval, a refused regime left out
    with its reason (before any is measured), the best per regime and the break-even batch per engine."""
    import argparse
    from src.predict import predict_regimes
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
    proc = run_command([sys.executable, "-m", "src.predict", *args], cwd=REPO, capture_output=True,
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
    from analysis.prediction import regime_errors
    from src.predict import validate_sweep
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
    """A stand-in for src.predict.measure that notes (draft, engine, batch, seed) of each call
    and returns planted costs per k: cpp 3, t1 100 us, tv 120 us, td by run (seed // seqs: 5, 40,
    10 us), no spread of their own."""
    from src.trial.probes import Measured
    from tests.analysis.test_prediction_interval import flat

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
    import src.predict as predict_mod
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
    import src.predict as predict_mod
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


def test_predict_per_category_goes_round_the_workloads_prompts(tiny, tmp_path, capsys):
    """A workload of two categories: the chain's sequences go round its prompts (seed s on prompt
    s mod 2), each category's chars per pass is that of its own sequences (equal to the loop's own
    survival run on them), and each category gets its predicted table and best setting."""
    import json
    from analysis.prediction import category_costs
    from src.engine.measuring.acceptance import loop_survival
    from src.predict import compose, measure, print_categories
    from src.trial.load import build_draft
    from src.trial.spec import trial_spec
    cfg, corpus, target = tiny
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"prompt": "the cat ", "category": "a", "n_chars": 40}) + "\n"
                    + json.dumps({"prompt": "The dog ran ", "category": "b", "n_chars": 30}) + "\n")
    overrides = ["model=tiny", "train=quick", f"data.path={cfg.data.path}", f"data.cache_dir={cfg.data.cache_dir}",
                 "timing.cost_reps=2", "timing.cost_width=null", "draft=bigram", "workload=file",
                 f"workload.path={path}"]
    composed = compose(overrides)
    m = measure(composed, [2], None, 4, 16, 0, (corpus, target), 3)
    assert m.categories == ("a", "b") and m.costs[2]["spread"].categories == ("a", "b", "a", "b")
    draft = build_draft(trial_spec(composed).draft, trial_spec(composed).target, target, corpus)
    for category, prompt, n, seeds in (("a", "the cat ", 40, (0, 2)), ("b", "The dog ran ", 30, (1, 3))):
        ids = target.tokenizer.encode(prompt).tolist()
        runs = [loop_survival(target.model, draft, ids, n, 2, 1.0, [s]) for s in seeds]
        passes = sum(p for _, p, _ in runs)
        chars = passes + sum(float((surv * p).sum()) for surv, p, _ in runs)
        assert category_costs(m.costs, category)[2]["cpp"] == pytest.approx(chars / passes)
    print_categories([(m, Overheads())])
    out = capsys.readouterr().out
    assert "per workload category" in out and "best predicted setting per category" in out
    assert [line.split()[0] for line in out.split("per workload category")[1].splitlines()[2:4]] == ["a", "b"]


def test_category_costs_keep_one_categorys_sequences():
    from analysis.prediction import category_costs
    from src.trial.probes import Spread
    units = np.array([(10.0, 4.0, 8.0), (20.0, 5.0, 10.0), (30.0, 10.0, 20.0)])
    costs = {2: {"k": 2, "cpp": 60 / 19, "spread": Spread(units, {}, categories=("x", "y", "x"))}}
    x = category_costs(costs, "x")[2]
    assert x["cpp"] == pytest.approx(40 / 14) and x["spread"].units.tolist() == [[10, 4, 8], [30, 10, 20]]
    assert category_costs(costs, "z") is None
    assert category_costs({2: {"k": 2, "cpp": 3.0, "spread": Spread(units, {})}}, "x") is None   # no categories told
