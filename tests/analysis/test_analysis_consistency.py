"""Each cell checked against its sweep (analysis/consistency.py), on planted sweeps: a verify pass
that costs less at a larger k, a one-char target pass far from the sweep's median, a counter that
differs among a cell's seeds are flagged (and nothing in the clean sweep), the report marks the
flagged cells and will not give them as answers, prints the command that reruns just them, and
says when one seed leaves the run-to-run spread unmeasured. Each check's mutation is named where
it is caught."""
from __future__ import annotations

import pandas as pd
import pytest
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from analysis.consistency import (TARGET_TOL, VERIFY_TOL, contradictions, flagged_cells, one_seed_note,
                                  rerun_commands)
from analysis.sweep_data import Sweep, SweepData
from analysis.report import build_report, summary
from tests.analysis import fixtures as fx

# a sweep's command_overrides tag: its overrides as Hydra got them (the shell's quotes gone, Hydra's kept)
COMMAND = "draft=bigram,int8,int4 k=1,2,4,8 seed=range(3) prompt='The cat ' n_chars=200"
KEPT = "'seed=range(3)' 'prompt='\"'\"'The cat '\"'\"'' n_chars=200"   # the same, quoted for the shell


def frames(seeds=fx.SEEDS) -> tuple[pd.DataFrame, pd.DataFrame]:
    return fx.noisy_frames(fx.Truth(), None, seeds=seeds)


def cell(trials: pd.DataFrame, draft: str, k: int) -> pd.Series:
    return (trials["draft"] == draft) & (trials["k"] == k)


def report_of(trials, pairs, name="adhoc", command=COMMAND):
    sweep = Sweep("s", name, "parent", "0", fx.START, command)
    return build_report(SweepData(sweep, trials, trials.iloc[0:0][["run_id", "status"]], pairs), boots=0)


def test_the_clean_planted_sweep_contradicts_nothing():
    trials, _ = frames()
    assert contradictions(trials).empty


def test_a_verify_pass_that_costs_less_at_a_larger_k_flags_both_cells():
    """bigram's 3-char verify pass at k = 2 planted 25% dearer (1.375 t1, above the 5-char pass's 1.2 t1 by
    15%: the issue's k = 2 cells were 18-24% above): bigram k = 2 and k = 4 flagged, nothing else. Within
    VERIFY_TOL (k = 2 at 1.26 t1, 5% above k = 4) nothing is. Mutations caught: no check, or the
    comparison the wrong way round (flags every draft's growing passes)."""
    trials, _ = frames()
    slow = trials.copy()
    slow.loc[cell(slow, "bigram", 2), "verify_pass_us"] *= 1.25
    flags = contradictions(slow)
    assert flagged_cells(flags) == {("bigram", 2), ("bigram", 4)} and set(flags["check"]) == {"verify"}
    assert "3-char verify pass at k = 2" in flags["reason"][0] and "5-char one at k = 4" in flags["reason"][0]
    within = trials.copy()
    within.loc[cell(within, "bigram", 2), "verify_pass_us"] *= 1.20 * (1 + VERIFY_TOL / 2) / 1.10
    assert contradictions(within).empty


def test_a_one_char_target_pass_far_from_the_sweeps_median_is_flagged():
    """int4 k = 8's one-char pass planted 30% slow (the issue's cells: 10-32%): flagged alone; 10% slow
    (within TARGET_TOL) is not. Mutation caught: no check (or a tolerance past 30%)."""
    trials, _ = frames()
    slow = trials.copy()
    slow.loc[cell(slow, "int4", 8), "target_pass_us"] *= 1.30
    flags = contradictions(slow)
    assert flagged_cells(flags) == {("int4", 8)} and list(flags["check"]) == ["target pass"]
    assert "+30% off the sweep's median" in flags["reason"][0]
    near = trials.copy()
    near.loc[cell(near, "int4", 8), "target_pass_us"] *= 1 + TARGET_TOL / 2
    assert contradictions(near).empty


def test_a_counter_that_differs_among_a_cells_seeds_is_flagged():
    """baseline_passes is n_chars at every seed: one seed of int8 k = 4 counting 199 flags the cell.
    Mutation caught: no check."""
    trials, _ = frames()
    odd = trials.copy()
    odd.loc[cell(odd, "int8", 4) & (odd["seed"] == 1), "baseline_passes"] = fx.N_CHARS - 1
    flags = contradictions(odd)
    assert flagged_cells(flags) == {("int8", 4)} and list(flags["check"]) == ["counters"]
    assert "baseline_passes differs among its seeds (199, 200)" in flags["reason"][0]


def planned_cells(command: str) -> set[tuple[str, int, int]]:
    """(draft, k, seed) of every job Hydra's basic sweeper makes of the command's overrides."""
    import shlex
    args = shlex.split(command)
    overrides = [a for a in args[args.index("src.run") + 1:] if "=" in a]
    batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]
    jobs = [dict(o.split("=", 1) for o in job) for job in batches]
    assert all(job["resume"].lower() == "false" and job["prompt"] == "'The cat '" for job in jobs)
    return {(job["draft"], int(job["k"]), int(job["seed"])) for job in jobs}


@pytest.mark.parametrize("name", ["adhoc", "paper"])
def test_the_rerun_command_reruns_just_the_flagged_cells_every_seed(name):
    """The flagged cells bigram k = 2, 4 and int4 k = 8: one line per draft (a -m line is a product, so
    bigram and int4 on one line would rerun bigram k = 8 too), each with the sweep's own overrides
    (its seeds, n_chars) and sweep file, resume=false; Hydra's sweeper makes exactly the flagged cells'
    jobs of them. Mutations caught: k of the other cells kept, the sweep's seed override dropped."""
    trials, _ = frames()
    flags = pd.DataFrame({"draft": ["bigram", "bigram", "int4"], "k": [2, 4, 8], "check": "verify", "reason": ""})
    lines = rerun_commands(flags, trials, Sweep("s", name, "parent", "0", fx.START, COMMAND))
    sweep_file = " --config-dir sweeps --config-name paper" if name == "paper" else ""
    tail = "engine=eager batch=1 policy=fixed resume=false"
    assert lines == [f"python -m src.run -m{sweep_file} {KEPT} draft=bigram k=2,4 {tail}",
                     f"python -m src.run -m{sweep_file} {KEPT} draft=int4 k=8 {tail}"]
    jobs = set().union(*(planned_cells(line) for line in lines))
    assert jobs == {(d, k, s) for d, k in flagged_cells(flags) for s in fx.SEEDS}


def test_the_report_marks_flagged_cells_and_gives_them_as_no_answer():
    """bigram k = 2, the clean sweep's best bigram cell, with its verify pass planted dear: the speedup
    and predictions tables mark it, the best-k table names it and its recommendation says it is no
    answer, a flagged table gives the reasons, and the summary names the cells and the rerun command.
    Mutation caught: the report built without the marking."""
    trials, pairs = frames()
    assert "speculate with k = 2" in summary(report_of(trials, pairs), "uri", "exp")   # the clean sweep's answer
    trials.loc[cell(trials, "bigram", 2), "verify_pass_us"] *= 1.25
    report = report_of(trials, pairs)
    tables = {t.name: t.df for t in report.tables}
    speedup = tables["speedup"].set_index(["draft", "k"])["flagged"]
    assert speedup[("bigram", 2)] == "verify" and speedup[("bigram", 4)] == "verify" and speedup[("int4", 2)] == ""
    assert tables["predicted_vs_measured"].set_index(["draft", "k"])["flagged"][("bigram", 2)] == "verify"
    best = tables["best_k"].set_index("draft")
    assert best.loc["bigram", "flagged k"] == "2, 4" and best.loc["int4", "flagged k"] == ""
    assert best.loc["bigram", "recommendation"].startswith("not an answer: k = 2 is flagged")
    assert flagged_cells(tables["flagged"]) == {("bigram", 2), ("bigram", 4)}
    text = summary(report, "uri", "exp")
    assert "Flagged cells (2: bigram k=2, bigram k=4)" in text
    assert f"    python -m src.run -m {KEPT} draft=bigram k=2,4 engine=eager batch=1 policy=fixed resume=false" in text
    assert "bigram: not an answer: k = 2 is flagged" in text


def test_the_report_says_when_one_seed_leaves_the_run_to_run_spread_unmeasured():
    """One seed per cell (the issue's sweep): the summary says the interval covers one run's pairs, not
    the run-to-run spread; with three seeds it says nothing of it; with some cells of one seed it counts
    them. Mutation caught: the note left out of the summary."""
    one, one_pairs = frames(seeds=(0,))
    assert "Every cell has one seed: the interval covers the pairs of that one run, not the run-to-run spread" in \
        summary(report_of(one, one_pairs), "uri", "exp")
    three, pairs = frames()
    assert one_seed_note(three) is None and "run-to-run spread" not in summary(report_of(three, pairs), "uri", "exp")
    some = three[~(cell(three, "int8", 1) & (three["seed"] > 0))]
    assert one_seed_note(some).startswith("1 of 12 cells have one seed")


def test_the_sweeps_command_overrides_are_read_from_its_parent_run(tmp_path):
    from mlflow.tracking import MlflowClient
    from analysis.sweep_data import connect, find_sweep
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    client.create_run(exp, tags={"specsweep.kind": "sweep", "sweep_id": "s1", "sweep_name": "adhoc",
                                 "command_overrides": COMMAND})
    import mlflow
    try:
        connect(uri)
        assert find_sweep("e", "s1").command_overrides == COMMAND
    finally:
        mlflow.set_tracking_uri(None)   # connect() set mlflow's global URI: undo it


def test_the_answer_per_regime_marks_a_best_cell_that_is_flagged_in_its_regime():
    """A sweep over two engines (tests/analysis/test_analysis_engines.py's): bigram k = 2 on eager, the
    draft's best cell there, with its verify pass planted dear; the answer per regime marks that row
    alone (onnx's bigram, the same label on another engine, is not). Mutation caught: the answer left
    unmarked."""
    from analysis.consistency import mark_regimes
    from analysis.regimes import only_regime, regimes_of, regimes_table
    from tests.analysis.test_analysis_engines import two_engines
    data = two_engines()
    data.trials.loc[cell(data.trials, "bigram", 2), "verify_pass_us"] *= 1.25   # eager's bigram only ("bigram@onnx")
    reports = {r: build_report(only_regime(data, r), boots=0) for r in regimes_of(data)}
    answer = mark_regimes(regimes_table({r: rep.cells for r, rep in reports.items()}), reports).df
    flagged = answer.set_index(["engine", "draft"])
    assert flagged.loc[("eager", "bigram"), "best k"] == 2 and flagged.loc[("eager", "bigram"), "flagged"] == "verify"
    assert (answer["flagged"] != "").sum() == 1


def test_cells_of_two_workloads_are_checked_each_against_its_own_workload():
    """A workload of longer prompts makes every pass dearer (the context it reads): the same sweep
    over a second workload, its verify passes 15% and its one-char passes 30% dearer, contradicts
    nothing (the workloads' cells are not compared); a verify pass that costs less at a larger k
    within that workload is still flagged, and its rerun names the workload. Mutation caught: the
    workload left out of the groups (the 30% dearer passes flagged against the first workload's)."""
    trials, _ = frames()
    trials = trials.assign(workload="single")
    longer = trials.assign(workload="validation", draft=trials["draft"] + "#validation",
                           verify_pass_us=trials["verify_pass_us"] * 1.15, target_pass_us=trials["target_pass_us"] * 1.3)
    both = pd.concat([trials, longer], ignore_index=True)
    assert contradictions(both).empty
    both.loc[cell(both, "bigram#validation", 2), "verify_pass_us"] *= 1.25
    flags = contradictions(both)
    assert flagged_cells(flags) == {("bigram#validation", 2), ("bigram#validation", 4)}
    sweep = Sweep("s", "workloads", "parent", "0", fx.START, "workload=single,validation draft=bigram k=1,2,4,8")
    [line] = rerun_commands(flags, both, sweep)
    assert "workload=validation" in line.split() and "k=2,4" in line.split()
