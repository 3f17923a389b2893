"""A full disk: each command ends with one line that says so and a non-zero exit, nothing already
recorded is corrupted, and the same command rerun once there is space resumes the sweep.

The disk is real: a small tmpfs mounted in a user and mount namespace of the test's own
(`unshare -rm`), holding the store, the model cache and Hydra's folders. One script runs every
step inside it (the mount lives as long as the namespace): a sweep that finishes its first cell,
the disk filled, the sweep grown by two cells and a single run (each must fail and say why), then
the disk nearly full (256 KB left: the sweep starts, and a trial fails on the way), the disk
freed, the sweep rerun. The store's own integrity check and its runs are read at the end.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from src.engine.models.corpus import synthetic_text
from src.paths import REPO

pytestmark = pytest.mark.slow

SCRIPT = r'''
set -u
disk="$ROOT/disk"; out="$ROOT/out"
mkdir -p "$disk" "$out"
mount -t tmpfs -o size=48m tmpfs "$disk" || exit 97
common=(model=tiny train=quick train.steps=10 train.eval_interval=10 "data.path=$ROOT/corpus.txt"
        "data.cache_dir=$disk/cache" "prompt='the cat '" n_chars=32 timing.pairs=2 timing.target_width=null
        "tracking.uri=sqlite:///$disk/store/mlflow.db" hydra.launcher.n_jobs=1 draft=bigram)
step() { name=$1; shift; "$PY" -m src.run "$@" >"$out/$name.out" 2>"$out/$name.err"; echo $? >"$out/$name.rc"; }
step first -m "${common[@]}" k=1 "hydra.sweep.dir=$disk/sweep"
dd if=/dev/zero of="$disk/ballast" bs=1M 2>/dev/null
dd if=/dev/zero of="$disk/ballast2" bs=4k 2>/dev/null
df -k "$disk" | tail -1 >"$out/df_full"
step full_sweep -m "${common[@]}" k=1,2,4 "hydra.sweep.dir=$disk/sweep"
step full_single "${common[@]}" k=8 "hydra.run.dir=$disk/run"
rm -f "$disk/ballast2"; truncate -s -$((LEFT_KB * 1024)) "$disk/ballast"   # nearly full: the sweep starts
step nearly_full -m "${common[@]}" k=1,2,4,8 "hydra.sweep.dir=$disk/sweep"
rm -f "$disk/ballast"
step rerun -m "${common[@]}" k=1,2,4,8 "hydra.sweep.dir=$disk/sweep"
"$PY" - "$disk/store/mlflow.db" >"$out/store.json" <<'EOF'
import json, sqlite3, sys
con = sqlite3.connect(sys.argv[1])
check = con.execute("PRAGMA integrity_check").fetchone()[0]
runs = con.execute("""SELECT r.status, p.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid
    AND t.key = 'specsweep.kind' AND t.value = 'trial' JOIN params p ON p.run_uuid = r.run_uuid AND p.key = 'k'""").fetchall()
print(json.dumps({"integrity": check, "runs": runs}))
EOF
'''


@pytest.fixture(scope="module")
def full_disk(tmp_path_factory):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small file system")
    root = tmp_path_factory.mktemp("full_disk")
    (root / "corpus.txt").write_text(synthetic_text(20_000))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(ROOT=str(root), PY=sys.executable, PYTHONPATH=str(REPO), LEFT_KB="256")
    proc = subprocess.run(["unshare", "-rm", "bash", "-c", SCRIPT], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode == 97 or "unshare failed" in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {proc.stderr.strip()[:200]}")
    out = root / "out"

    def step(name):
        return (int((out / f"{name}.rc").read_text()), (out / f"{name}.out").read_text(),
                (out / f"{name}.err").read_text())
    return {name: step(name) for name in ("first", "full_sweep", "full_single", "nearly_full", "rerun")} | {
        "store": json.loads((out / "store.json").read_text()), "df": (out / "df_full").read_text()}


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_the_disk_was_full(full_disk):
    assert full_disk["first"][0] == 0, full_disk["first"][2][-2000:]
    available_kb = int(full_disk["df"].split()[3])
    assert available_kb == 0, full_disk["df"]


def test_a_sweep_on_a_full_disk_ends_with_one_line_that_says_so(full_disk):
    rc, out, err = full_disk["full_sweep"]
    assert rc != 0
    assert "Traceback" not in out + err
    lines = error_lines(err)
    assert lines and lines[-1].startswith("error: ") and "the disk is full" in lines[-1], lines[-5:]
    assert "rerun the same command" in lines[-1]


def test_a_sweep_that_fills_the_disk_on_the_way_says_so_last_and_counts_its_cells(full_disk):
    rc, out, err = full_disk["nearly_full"]
    assert rc == 1
    assert "Traceback" not in out + err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "the disk is full" in lines[0], lines[-5:]
    assert "cells not finished" in lines[0] and "rerun the same command to resume" in lines[0]
    assert "trial #" in out and "error: the disk is full" in out   # the failing trial's own log line


def test_a_single_run_on_a_full_disk_is_one_line_and_a_nonzero_exit(full_disk):
    rc, out, err = full_disk["full_single"]
    assert rc != 0
    assert "Traceback" not in out + err and "Logging error" not in err
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("error: the disk is full"), lines[-5:]


def test_nothing_is_corrupted_and_the_rerun_resumes(full_disk):
    rc, out, err = full_disk["rerun"]
    assert rc == 0, err[-2000:]
    store = full_disk["store"]
    assert store["integrity"] == "ok"
    finished = sorted(int(k) for status, k in store["runs"] if status == "FINISHED")
    assert finished == [1, 2, 4, 8]           # each cell once: the reruns ran only what had not finished
