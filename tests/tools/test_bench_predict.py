"""make bench-predict (src.bench.predict_rounds): the sweep's seed rounds and the probe runs take turns,
the validation reads every round's trials as one sweep, and bad input is refused before any work.
Nothing here reads a clock for its verdict."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from src.bench import predict_rounds as bp
from src.engine.errors import SpecsweepError
from tests.conftest import REPO
from tests.commands import run_command


def test_seeds_are_distinct_integers_in_their_order():
    assert bp.parse_seeds("2,0,5") == [2, 0, 5]
    for bad in ("0,0", "a", "0,,1", "-1", ""):
        with pytest.raises(SpecsweepError):
            bp.parse_seeds(bad)


def test_seed_rounds_are_consecutive_and_as_even_as_they_go():
    seeds = list(range(10))
    assert bp.seed_rounds(seeds, 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert bp.seed_rounds([5, 1, 3], None) == [[5], [1], [3]]
    assert bp.seed_rounds(seeds, 1) == [seeds] and bp.seed_rounds(seeds, 10) == [[s] for s in seeds]
    for bad in (0, 11):
        with pytest.raises(SpecsweepError):
            bp.seed_rounds(seeds, bad)
    assert bp.round_command("batch", [4, 5, 6], ["k=2"], "sqlite:///x.db", "e")[-5:] == [
        "resume=false", "seed=4,5,6", "tracking.uri=sqlite:///x.db", "tracking.experiment=e", "k=2"]


def test_what_the_tool_sets_itself_is_refused():
    bp.check_overrides(["draft=int8", "k=2,4", "model=tiny"], ["--seqs", "8", "model=tiny"])
    for sweep, predict in ((["seed=1"], []), (["+seed=1"], []), (["hydra.sweeper.params.seed=0,1"], []),
                           (["resume=true"], []), (["tracking.uri=sqlite:///x.db"], []),
                           (["hydra.launcher.n_jobs=2"], []), ([], ["--runs", "2"]), ([], ["--runs=2"]),
                           ([], ["--sweep-id", "abc"]), ([], ["--validate"])):
        with pytest.raises(SpecsweepError):
            bp.check_overrides(sweep, predict)


def test_the_sweeps_target_and_settings_are_passed_on_the_command_line_winning():
    """smoke.yaml overrides data, model and train in its defaults and sets prompt: passed on, but
    the sweep's command line wins over its file, the predictions' own overrides over both, and
    nothing else of the sweep (draft, k, hydra.*) is passed."""
    assert bp.passed_on("smoke", [], []) == ["data=synthetic", "model=tiny", "train=quick", "prompt='The cat '"]
    assert bp.passed_on("smoke", ["draft=int8", "k=1,4", "model=small", "model.n_layer=1", "hydra.sweep.dir=x",
                                  "threads=2"], ["data=other", "--seqs"]) == [
        "train=quick", "prompt='The cat '", "model=small", "model.n_layer=1", "threads=2"]
    assert bp.passed_on("paper", ["draft=int8"], []) == []
    assert bp.passed_on("scaling", [], []) == ["model=medium"]


def test_a_quoted_prompt_composes_back_to_itself():
    from src.predict import compose
    text = "Ham.\nTo be, 'or' not to be, "
    assert compose([f"prompt={bp.quoted(text)}"]).prompt == text


@pytest.mark.parametrize("args, says", [
    (["--sweep", "nosuch"], "error: unknown sweep 'nosuch' (available: "),
    (["--sweep", "smoke", "--seeds", "0,0"], "error: --seeds names a seed twice"),
    (["--sweep", "smoke", "seed=3"], "error: seed= is set by this tool"),
    (["--sweep", "smoke", "--seeds", "0,1", "--probe-runs", "3"], "error: --probe-runs must be between 1 and"),
    (["--sweep", "smoke", "--", "--runs", "2"], "error: --runs is set by this tool"),
    (["--sweep", "smoke", "--", "--seqs", "0"], "error: python -m src.predict: --seqs: an integer >= 1, got 0"),
    (["--sweep", "smoke", "--", "engine=eager"], "error: --validate takes each cell's engine and batch"),
    (["--seeds", "0"], "error: python -m src.bench.predict_rounds: the following arguments are required: --sweep"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, args, says):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    proc = run_command([sys.executable, "-m", "src.bench.predict_rounds", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith(says) and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "round 1" not in proc.stdout and list(tmp_path.iterdir()) == []   # nothing ran, nothing left


@pytest.mark.slow
def test_rounds_and_probe_runs_take_turns_and_the_validation_reads_every_round(smoke_stores, tmp_path):
    """Two seed rounds of one smoke cell (bigram, k = 1) with the tiny target cached: round 1's
    sweep, probe run 1, round 2's sweep, probe run 2, in that order; each round a sweep of its
    own seed; the measured speedup printed is the pooled median over both rounds' pairs
    (load_sweeps), not the first round's alone. A third sweep rerunning seed 0 then stands for
    that trial in load_sweeps: its pairs only, the first round's dropped."""
    from analysis.aggregate import pooled_speedup
    from analysis.sweep_data import DEFAULT_EXPERIMENT, connect, load_sweep, load_sweeps
    cache = tmp_path / "cache"
    shutil.copytree(Path(smoke_stores[1][0].removeprefix("sqlite:///")).parent.parent / "cache", cache)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    grid = ["draft=bigram", "k=1", f"data.cache_dir={cache}", "timing.cost_reps=2"]
    proc = run_command([sys.executable, "-m", "src.bench.predict_rounds", "--sweep", "smoke", "--seeds", "0,1", *grid,
                           f"hydra.sweep.dir={tmp_path}/sweep", "--", "--seqs", "2", "--rounds", "2",
                           "--tracking-uri", uri], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    marks = ["=== round 1/2: the smoke sweep at seed 0", "bigram: measured in", "=== round 2/2: the smoke sweep at seed 1",
             "(probe run 2/2)", "2 rounds, each the sweep's trials then a probe run"]
    at = [out.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), (at, out[-3000:])
    assert "(probe run 1/2)" in out[at[1]:at[2]]
    ids = [line.split("(sweep ")[1].split(")")[0] for line in out.splitlines() if line.startswith("=== round ")
           and "done (sweep" in line]
    assert len(ids) == 2 and f"sweep {ids[0]}, {ids[1]} (smoke)" in out
    client = connect(uri)
    assert [set(load_sweep(client, DEFAULT_EXPERIMENT, i).finished["seed"]) for i in ids] == [{0}, {1}]
    both = load_sweeps(client, DEFAULT_EXPERIMENT, ids)
    m = pooled_speedup(both.pairs).set_index(["draft", "k"]).loc[("bigram", 1)]
    first = pooled_speedup(load_sweep(client, DEFAULT_EXPERIMENT, ids[0]).pairs).set_index(["draft", "k"]).loc[
        ("bigram", 1)]
    assert (m["seeds"], first["seeds"]) == (2, 1)   # two seeds: the seed bootstrap's interval, not one seed's
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["bigram"] and "eager" in line)
    printed = row[-4:-1]   # measured, meas lo, meas hi (then ape %)
    assert printed == [f"{m[c]:.3f}" for c in ("median", "lo", "hi")], (row, m)
    assert printed != [f"{first[c]:.3f}" for c in ("median", "lo", "hi")]
    with pytest.raises(SpecsweepError, match="twice"):
        load_sweeps(client, DEFAULT_EXPERIMENT, [ids[0], ids[0]])
    # the same trial (bigram, k 1, seed 0) again in a third sweep: the newest run stands for it
    rerun = run_command(bp.round_command("smoke", [0], [*grid, f"hydra.sweep.dir={tmp_path}/rerun"], uri,
                                            DEFAULT_EXPERIMENT), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    third = load_sweep(client, DEFAULT_EXPERIMENT).sweep.sweep_id
    assert third not in ids
    all3 = load_sweeps(client, DEFAULT_EXPERIMENT, [*ids, third])
    fin = all3.finished
    assert len(fin) == 2 and set(fin["seed"]) == {0, 1}
    new0 = fin.loc[fin["seed"] == 0, "run_id"].iloc[0]
    assert new0 in set(load_sweep(client, DEFAULT_EXPERIMENT, third).finished["run_id"])
    assert set(all3.pairs["run_id"]) == set(fin["run_id"])
    assert len(all3.pairs) == sum(len(load_sweep(client, DEFAULT_EXPERIMENT, i).pairs) for i in (ids[1], third))
