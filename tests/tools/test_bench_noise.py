"""The noisy-machine benchmark's parts that need no timing: the CPU hog starts and is stopped by
pid (also on an exception, on SIGTERM, and when its parent is killed), and the side-by-side
comparisons on planted numbers. No test here reads a clock for its verdict; the polls below only
bound how long a test waits for a process to change state."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from analysis.cost_models import Extended
from src.engine.errors import SpecsweepError
from src.bench import noise as bn
from src.bench.hog import CpuHog, default_hog_cores, usable_cores
from tests.conftest import REPO

WAIT = 20.0  # seconds a test waits at most for a process to start, pin itself or go


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def running(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {what} after {WAIT:.0f} s")
        time.sleep(0.05)


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")


# --- the hog -------------------------------------------------------------------------------------

def test_the_hog_runs_pinned_children_and_stops_them_by_pid():
    cores = usable_cores()
    hog = CpuHog(cores=2, duty=0.2)  # a light load: the test machine is shared
    with hog:
        pids = hog.pids
        assert len(pids) == 2 and len(set(pids)) == 2 and hog.alive() == 2
        assert all(running(p) for p in pids)  # the check after stop() is not vacuous
        if hasattr(os, "sched_getaffinity"):  # each child pins itself to its own core
            expected = [{cores[i % len(cores)]} for i in range(2)]
            wait_until(lambda: [os.sched_getaffinity(p) for p in pids] == expected, "pinned")
    assert hog.pids == [] and all(state(p) is None for p in pids)  # stopped and reaped: no zombie either
    assert default_hog_cores() == len(cores)


def test_negative_control_a_hog_left_running_is_seen(monkeypatch):
    """The check above can fail: with stop() disabled the child is still running after the block."""
    hog = CpuHog(cores=1, duty=0.2)
    monkeypatch.setattr(CpuHog, "stop", lambda self: None)
    with hog:
        pids = hog.pids
    try:
        assert running(pids[0])
    finally:
        monkeypatch.undo()
        hog.stop()
    assert state(pids[0]) is None


def test_an_exception_inside_the_block_stops_the_hog():
    hog = CpuHog(cores=1, duty=0.2)
    with pytest.raises(RuntimeError):
        with hog:
            pids = hog.pids
            assert running(pids[0])
            raise RuntimeError("a sweep failed")
    assert state(pids[0]) is None


SIGTERMED = r"""
import sys, time
from src.bench.hog import CpuHog, exit_on_sigterm
exit_on_sigterm() if sys.argv[1] == "handled" else None
with CpuHog(cores=2, duty=0.2) as hog:
    print(*hog.pids, flush=True)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", ["handled", "killed"])
def test_the_hog_goes_when_its_parent_is_terminated_or_killed(how):
    """SIGTERM with the benchmark's handler: the parent stops its children by pid on the way out (exit
    143, not death by the signal). SIGKILL (no clean-up possible): each child notices its parent is gone
    and exits by itself. The negative control: a child that had not gone would fail the wait."""
    proc = subprocess.Popen([sys.executable, "-c", SIGTERMED, how], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(running(p) for p in pids)
        proc.send_signal(signal.SIGTERM if how == "handled" else signal.SIGKILL)
        rc = proc.wait(timeout=WAIT)
        assert rc == (143 if how == "handled" else -signal.SIGKILL)
        wait_until(lambda: not any(running(p) for p in pids), "gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("bad", [dict(cores=-1), dict(cores=1.5), dict(duty=0), dict(duty=1.5), dict(period=0)])
def test_bad_hog_settings_are_refused(bad):
    with pytest.raises(SpecsweepError, match="hog"):
        CpuHog(**bad)


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0;1"], "--seeds takes seeds separated by commas"),
    (["--hog-cores", "-1"], "--hog-cores: an integer >= 0, got -1"),
    (["--hog-duty", "0"], "hog duty must be in (0, 1]"),
    (["--keep", "KEPT"], "holds quiet/ or loaded/ already"),
])
def test_bad_benchmark_input_ends_with_one_line_and_status_2(argv, message, tmp_path, capsys):
    (tmp_path / "quiet").mkdir()
    try:   # argparse's refusals exit; the others are the command's exit status
        status = bn.main([a.replace("KEPT", str(tmp_path)) for a in argv])
    except SystemExit as e:
        status = e.code
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


# --- comparisons on planted numbers -------------------------------------------------------------

def cells(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["draft", "k", "measured", "lo", "hi"])


def test_cell_agreement_needs_each_median_inside_the_other_interval():
    quiet = cells([("a", 1, 1.00, 0.90, 1.10), ("a", 2, 1.00, 0.95, 1.05), ("a", 4, 1.00, 0.80, 1.30),
                   ("a", 8, 1.00, 0.90, 1.10), ("b", 1, 1.00, 0.90, 1.10)])
    loaded = cells([("a", 1, 1.05, 1.00, 1.20),      # both inside (1.00 on the loaded interval's edge)
                    ("a", 2, 1.20, 1.10, 1.30),      # neither
                    ("a", 4, 1.25, 1.20, 1.30),      # loaded in quiet only
                    ("a", 8, np.nan, np.nan, np.nan),  # no pair timings: left out
                    ("c", 1, 1.00, 0.90, 1.10)])     # measured in one condition only: left out
    a = bn.cell_agreement(quiet, loaded).set_index(["draft", "k"])
    assert list(a.index) == [("a", 1), ("a", 2), ("a", 4)]
    assert a["quiet in loaded"].tolist() == [True, False, False]
    assert a["loaded in quiet"].tolist() == [True, False, True]
    assert a["agree"].tolist() == [True, False, False]
    assert a.loc[("a", 4), "measured_loaded"] == 1.25 and a.loc[("a", 4), "hi_quiet"] == 1.30


def test_rounds_spent():
    f = pd.DataFrame({"cost_rounds": [7, 12, 21], "cost_width_reached": [1, 1, 0]})
    assert bn.rounds_spent(f) == {"trials": 3, "median": 12, "max": 21, "width share": 2 / 3}
    fixed = bn.rounds_spent(f.drop(columns="cost_width_reached"))  # fixed rounds log no cost_width_reached
    assert np.isnan(fixed["width share"]) and fixed["max"] == 21
    assert bn.rounds_spent(pd.DataFrame({"timed_s": [1.0]}))["trials"] == 0  # older runs: nothing to count


def test_pairs_spent():
    f = pd.DataFrame({"pairs_used": [6, 8, 24], "width_reached": [1, 1, 0], "timed_s": [1.0, 2.0, 3.0]})
    assert bn.pairs_spent(f) == {"trials": 3, "median": 8, "max": 24, "width share": 2 / 3, "timed s": 6.0}
    fixed = bn.pairs_spent(f.drop(columns="width_reached"))  # fixed pairs log no width_reached
    assert np.isnan(fixed["width share"]) and fixed["max"] == 24
    histories = pd.DataFrame({"draft": "d", "k": 1, "seed": [0] * 5 + [1] * 7, "ratio": 1.0})
    older = bn.pairs_spent(pd.DataFrame({"timed_s": [1.0, 1.0]}), histories)  # no pairs_used: counted
    assert (older["median"], older["max"]) == (6, 7)


def test_parameters_at_the_bound_and_negative_ones_are_named():
    fit = Extended(b=0.0, o_pass=4e-14, gamma=-0.07, o_base=86.0, trials=6)
    assert bn.parameter_flags(fit) == (["b", "o_pass"], ["gamma"])
    assert bn.parameter_flags(Extended(0.02, 300.0, 0.1, 80.0, 6)) == ([], [])
    free = Extended(0.02, -5.0, 0.1, 80.0, 6, delta=1e-15, free_loop=True)  # delta only in the free-loop form
    assert bn.parameter_flags(free) == (["delta"], ["o_pass"])
    assert bn.parameter_flags(Extended(0.02, 300.0, 0.1, 80.0, 6, delta=1e-15)) == ([], [])


def test_a_recommendation_contradicted_by_its_own_cell_is_caught():
    c = cells([("d", 2, 1.05, 1.02, 1.10), ("d", 8, 0.92, 0.85, 0.97), ("d", 4, 1.04, 0.98, 1.12),
               ("d", 1, np.nan, np.nan, np.nan)])
    assert bn.recommended_k("speculate with k = 2 (measured 1.05x, ...)") == 2
    assert bn.recommended_k("not demonstrated: best measured k = 4, ...") is None
    assert bn.contradiction(c, "d", "speculate with k = 2 (measured 1.05x, interval 1.02-1.10 lies above 1)") == ""
    # the user's case: k = 8 recommended, measured a slowdown; and one whose interval straddles 1
    assert bn.contradiction(c, "d", "speculate with k = 8") == "k = 8 measured 0.92x, interval 0.85-0.97, not above 1"
    assert bn.contradiction(c, "d", "speculate with k = 4").startswith("k = 4 measured 1.04x")
    assert bn.contradiction(c, "d", "not demonstrated: best measured k = 8, 0.92x") == ""
    assert bn.contradiction(c, "d", "speculate with k = 1 (not measured: the extended model ...)") == ""


@pytest.mark.slow
def test_the_side_by_side_report_prints_from_two_analyses(capsys):
    """The printing path end to end on the noisy planted sweep (no store, no timing): the same analysis
    twice agrees with itself in every cell; a loaded copy with one cell's pairs shifted up does not."""
    from analysis.report import build_report
    from tests.analysis.test_analysis_robust import noisy_data
    quiet = bn.Condition("quiet", 100.0, build_report(noisy_data()), "none")
    data = noisy_data()
    shifted = (data.pairs["draft"] == "int4") & (data.pairs["k"] == 4)
    data.pairs.loc[shifted, "ratio"] *= 1.5
    loaded = bn.Condition("loaded", 250.0, build_report(data, boots=0), "2 busy processes")
    bn.print_header(quiet, quiet, "paper", [])
    bn.report(quiet, quiet)
    same = capsys.readouterr().out
    assert "Cells whose medians agree (each inside the other's interval): 12/12 (100%)" in same
    bn.report(quiet, loaded)
    out = capsys.readouterr().out
    assert "Cells whose medians agree (each inside the other's interval): 11/12 (92%)" in out
    def cell(c):   # the speedup table's int4 k=4, as the side-by-side table prints it
        r = next(t.df for t in c.report.tables if t.name == "speedup").set_index(["draft", "k"]).loc[("int4", 4)]
        return f"{r['median']:.3f} [{r['lo']:.3f}-{r['hi']:.3f}]"
    assert cell(quiet).startswith("1.749 [") and cell(loaded).startswith("2.623 [")   # 1.5 x the pooled median
    assert f"| int4 | 4 | {cell(quiet)} | {cell(loaded)} | NO | NO |" in out
    assert "| sweep wall time, s | 100 | 250 | 2.50 |" in out
    for section in ("## Pairs spent per trial", "## Cost model errors", "## Extended model: fitted parameters",
                    "## Flagged trials", "## Recommendations"):
        assert section in out
    assert "- quiet: 1 trial: int8 k=8 seed=2 (draft_char_us 1965.6 vs 1105.4, z 25.0, " in out  # the planted one
    held = next(t.df for t in quiet.report.tables if t.name == "model_errors").set_index("model").loc[
        "extended (draft held out)"]
    assert (f"  its cells inside their bootstrap interval: {held['inside interval']} (the interval overlapping "
            f"the measured one: {held['intervals overlap']}), median width") in out
