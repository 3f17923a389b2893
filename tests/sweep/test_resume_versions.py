"""Resume is keyed on what computes, not on the commit: in a copy of this checkout, a sweep of one
cell finishes; a commit that changes only the docs leaves it done (the rerun runs nothing and
continues the same parent run); a change to the engine's code runs it again. Each trial run
records both versions."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from src.paths import REPO

pytestmark = pytest.mark.slow

# .git too: the copy gets a repository of its own (in a git worktree .git is a file naming the
# shared repository, and the test's commits would land on the checkout's own branch)
NOT_COPIED = {".git", ".venv", "data", "mlruns", "outputs", "results", ".cluster", ".pytest_cache"}


def copy_checkout(dest: Path) -> Path:
    def ignore(folder, names):
        return [n for n in names if n == "__pycache__" or (Path(folder) == REPO and n in NOT_COPIED)]
    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_a_docs_commit_resumes_and_a_code_change_reruns(tmp_path):
    repo = copy_checkout(tmp_path / "checkout")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "the copy as it is")
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"} | {"PYTHONPATH": str(repo)}

    def sweep() -> str:
        proc = subprocess.run([sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", "smoke",
                               "draft=bigram", "k=1", "hydra.launcher.n_jobs=1", f"tracking.uri=sqlite:///{store}/mlflow.db",
                               f"hydra.sweep.dir={tmp_path}/sweep", f"data.cache_dir={tmp_path}/cache"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    assert "1 cells: 0 done, 1 to run" in sweep()
    (repo / "docs" / "sweeps.md").write_text((repo / "docs" / "sweeps.md").read_text() + "\nA new sentence.\n")
    git(repo, "commit", "-qam", "docs only")
    assert "1 cells: 1 done, 0 to run" in sweep()                       # a new commit, the same computation
    engine = repo / "src" / "engine" / "decoding" / "decode.py"
    engine.write_text(engine.read_text() + "\n# a change to the code that computes\n")
    assert "1 cells: 0 done, 1 to run" in sweep()                       # uncommitted, and it computes: rerun

    client = MlflowClient(f"sqlite:///{store}/mlflow.db")
    exp = client.get_experiment_by_name("specsweep")
    runs = client.search_runs([exp.experiment_id], "tags.`specsweep.kind` = 'trial'")
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["compute_version"] for r in runs}) == 2
    assert len({r.data.tags["code_version"] for r in runs}) == 2
    parents = client.search_runs([exp.experiment_id], "tags.`specsweep.kind` = 'sweep'")
    assert len(parents) == 2                                            # the docs commit continued the first
