"""Faults a sweep meets and ends cleanly from: a lock nobody can take, two identical sweeps at
once into one store, SIGTERM to the sweep's parent. Nothing hangs, counts are true, nothing of
the sweep stays alive or RUNNING, and a rerun completes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from src.engine.errors import SpecsweepError
from src.engine.locks import file_lock
from src.sweep.processes import alive, descendants
from tests.conftest import FAULT_CELLS, FAULT_GRID, LASTING_TRIAL, REPO, runs_of, smoke_cmd, trial_counters
from tests.commands import run_command
from tests.sweep.test_resilience import running_trial

HOLD = """
import sys, time
from filelock import FileLock
lock = FileLock(sys.argv[1]); lock.acquire(); print("held", flush=True); time.sleep(60)
"""


def test_a_held_lock_is_waited_for_a_bounded_time_and_named(tmp_path):
    path = tmp_path / "x.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(SpecsweepError, match="gave up after 1 s waiting for the test's thing"):
            with file_lock(path, "the test's thing", timeout=1):
                pass
        assert time.monotonic() - started < 30
    finally:
        holder.kill()
        holder.wait()
    with file_lock(path, "the test's thing", timeout=1):   # free again: taken at once
        pass


def test_a_lock_where_no_file_can_be_made_is_refused_at_once():
    with pytest.raises(SpecsweepError, match="cannot create the lock file for the thing in /proc"):
        with file_lock("/proc/specsweep-test.lock", "the thing", timeout=3600):
            pass


@pytest.mark.slow
def test_an_unwritable_lock_location_ends_the_command_within_its_timeout(tmp_path):
    """The store's folder takes no file (/proc): a sweep that would wait on its lock forever ends in one line."""
    cmd = smoke_cmd(tmp_path, 1, "tracking.uri=sqlite:////proc/specsweep-test/mlflow.db")
    proc = run_command(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: cannot create the tracking store in /proc/specsweep-test: No such file or directory"]


def trial_statuses(uri: str) -> list[str]:
    _, runs = runs_of(uri)
    return sorted(r.info.status for r in runs if r.data.tags.get("specsweep.kind") == "trial")


@pytest.mark.slow
def test_two_identical_sweeps_at_once_both_end_with_true_counts(tmp_path, smoke_stores):
    store = tmp_path / "store"
    store.mkdir()
    cmd = smoke_cmd(store, 1, *FAULT_GRID)
    first = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outs = [p.communicate(timeout=900)[0] for p in (first, second)]
    uri = f"sqlite:///{store}/mlflow.db"
    for p, out in zip((first, second), outs):
        assert p.returncode == 0, out[-3000:]
        assert "2/2 cells finished, 0 failed" in out, out[-3000:]
    assert trial_statuses(uri) == ["FINISHED"] * 2                     # no cell twice, none failed
    _, runs = runs_of(uri)
    parents = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"    # one sweep, shared
    assert parents[0].data.metrics["trials_finished"] == 2 and parents[0].data.metrics["trials_failed"] == 0
    assert trial_counters(uri) == trial_counters(smoke_stores[1][0], FAULT_CELLS)


@pytest.mark.slow
def test_sigterm_to_the_parent_stops_everything_and_the_rerun_completes(tmp_path, smoke_stores):
    store = tmp_path / "store"
    store.mkdir()
    uri = f"sqlite:///{store}/mlflow.db"
    cmd = smoke_cmd(store, 2, *LASTING_TRIAL, *FAULT_GRID)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    running_trial(uri, proc, job_num="1")                     # int8's trial is mid-run on a worker
    family = descendants(proc.pid)
    assert family, "the sweep has workers"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-2000:]
    assert "error: stopped: the sweep's parent got SIGTERM" in err
    deadline = time.monotonic() + 30
    while any(alive(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in family if alive(p)]                 # workers, trials, resource tracker: gone
    statuses = trial_statuses(uri)
    assert "RUNNING" not in statuses and "KILLED" in statuses
    _, runs = runs_of(uri)
    parent = [r for r in runs if r.data.tags.get("specsweep.kind") == "sweep"][0]
    assert parent.info.status == "KILLED" and "SIGTERM" in parent.data.tags["stopped"]

    rerun = run_command(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert trial_statuses(uri).count("FINISHED") == 2
    assert trial_counters(uri) == trial_counters(smoke_stores[1][0], FAULT_CELLS)


def as_from_a_terminal() -> None:
    """The command's signals as a shell started from a terminal gives them: SIGINT and SIGTERM at
    their defaults and not blocked. A pytest worker that ran other tests may have them ignored or
    blocked (a child inherits both across exec: seen as a single run that trained on through its
    SIGINT), which is the test's state, not the command's."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


@pytest.mark.slow
@pytest.mark.parametrize("mode,signum", [("sweep", signal.SIGINT), ("sweep", signal.SIGTERM), ("single", signal.SIGINT)])
def test_a_signal_while_the_target_trains_ends_with_the_stop_line(tmp_path, mode, signum):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM while a sweep's parent
    trains its target before any trial, or while a single run trains its own: one `error: stopped`
    line on stderr, no traceback, exit 128 + the signal; no checkpoint, no lock held, no temporary
    file left in the cache, and no run RUNNING."""
    store = tmp_path / "store"
    store.mkdir()
    cmd = smoke_cmd(store, 1, "train.steps=100000", "draft=bigram", "k=4")   # training that lasts
    if mode == "single":
        cmd = [sys.executable, "-m", "src.run", "model=tiny", "data=synthetic", "train=quick", "train.steps=100000",
               "draft=bigram", "n_chars=64", "prompt='The cat '", f"tracking.uri=sqlite:///{store}/mlflow.db",
               f"hydra.run.dir={store}/run", f"data.cache_dir={tmp_path}/cache"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_from_a_terminal)
    models = tmp_path / "cache" / "models"
    deadline = time.monotonic() + 240
    while not list(models.glob("*.lock")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)                                          # the training's lock: it trains now
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.startswith("error:") or "Traceback" in line]
    assert proc.returncode == 128 + signum and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: stopped:") and signal.Signals(signum).name in lines[0], err
    assert not list(models.glob("*.pt")) and not list(models.glob("*.tmp"))
    from filelock import FileLock
    for lock in models.glob("*.lock"):
        FileLock(str(lock)).acquire(timeout=0)                   # let go
    if (store / "mlflow.db").exists():
        _, runs = runs_of(f"sqlite:///{store}/mlflow.db")
        assert "RUNNING" not in [r.info.status for r in runs]
