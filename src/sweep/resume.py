"""Resume: which cells are done, and which run does each. One module, read by the planner
(src/sweep/plan.py), the sweep's parent (src/sweep/callbacks.py) and each job (src/sweep/job.py).

- A cell is the trial's resolved spec (src/trial/spec.py: the frozen TrialSpec the trial runs)
  on its target. Its key, `cell_key(spec)`, hashes that spec: paths inside the repository as
  relative paths (two checkouts of the same commit agree), a workload by its prompts (an edited
  prompt file is another cell), nothing about where it is logged or which sweep asked for it: a
  cell is the same cell whatever sweep names it. Two configs that resolve to the same spec are
  one cell. Runs record it as the tag `config_hash`, beside `target_key`.
- Done: a cell is done when a FINISHED trial run with its key and target key, computed by the
  same code, exists in the experiment: the same compute version (`compute_version`: the hash of
  the files that compute a trial's numbers), so a commit of docs, analysis or tests keeps it done
  and a change to the engine, the trial or conf/ runs it again. Runs recorded before the compute
  version existed count by their code version (the commit, plus the diff's hash when dirty).
- Claims: before its work a trial claims its cell on the sweep's parent run by logging the param
  `claim.<cell key>.<attempt>` = its run id. MLflow params are write-once (a second, different
  value is refused by the store, atomically, under the database's primary key), so exactly one
  run wins each attempt. A new attempt is opened only when the previous holder ended FAILED or
  KILLED: a retried or duplicated job never yields a second FINISHED run of a cell in one sweep.
- Reused runs: a cell done by another sweep's run is recorded on the parent as the param
  `reused.<cell key>` = that run's id, so the sweep's analysis finds every cell it planned
  (analysis/sweep_data.py).
- A sweep's signature (its cells and the compute version) finds the parent run of an earlier
  launch of the same sweep, which a resumed launch continues.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..paths import REPO
from .store import KIND_TAG, SWEEP, TRIAL

if TYPE_CHECKING:   # (a type only: the claims and the ledger import this module without torch)
    from ..trial.spec import TrialSpec

CLAIM_PREFIX = "claim."
ENDED_BADLY = ("FAILED", "KILLED")
FINISHED_TRIALS = f"tags.`{KIND_TAG}` = '{TRIAL}' and attributes.status = 'FINISHED'"


# --- the cell ---------------------------------------------------------------------------------------

def portable(value):
    """The spec as plain JSON values, the same in every checkout: the repository's own path left out
    of every string (an absolute path inside it becomes relative)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: portable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return value.replace(f"{REPO}/", "")
    return value


def cell_key(spec: TrialSpec) -> str:
    """The cell's identity: a hash of the spec the trial runs (module docstring)."""
    blob = json.dumps(portable(spec), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# --- the code that computes it ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def git_state() -> tuple[str, bool]:
    """(commit, dirty) of the repository, or ("unknown", False) outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                    capture_output=True, text=True, timeout=10).stdout.strip())
        return commit, dirty
    except (OSError, subprocess.SubprocessError):
        return "unknown", False


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The commit, plus a hash of the uncommitted diff when the tree is dirty."""
    commit, dirty = git_state()
    if not dirty:
        return commit
    diff = subprocess.run(["git", "diff", "HEAD"], cwd=REPO, capture_output=True, timeout=30).stdout
    return f"{commit}+dirty.{hashlib.sha256(diff).hexdigest()[:12]}"


COMPUTES = ("src/engine", "src/trial", "conf", "requirements.txt")   # what computes a trial's numbers
NOT_COMPUTING = ("conf/hydra/help",                                   # text only
                 "src/trial/probes.py")                              # predict's probes: no trial runs them


def computing_files() -> list[Path]:
    """The files of COMPUTES (Python, YAML and text; no caches), in a fixed order."""
    files = []
    for entry in COMPUTES:
        path = REPO / entry
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [p for p in found if p.suffix in (".py", ".yaml", ".yml", ".txt") and "__pycache__" not in p.parts
                  and not str(p.relative_to(REPO)).startswith(NOT_COMPUTING)]
    return sorted(files)


@functools.lru_cache(maxsize=1)
def compute_version() -> str:
    """A hash of what computes a trial's numbers: the files of src/engine, src/trial (not predict's
    probes), conf/ (not its help text) and requirements.txt, by path and content. A commit of docs,
    analysis, tests or the sweep's bookkeeping leaves it unchanged, so a sweep resumes across it; a
    change to the code or a config that computes changes it, and the cells run again."""
    h = hashlib.sha256()
    for path in computing_files():
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


# --- done cells -----------------------------------------------------------------------------------------

def search_all(client, experiment_id: str, filter_string: str) -> list:
    """Every run matching the filter, across result pages."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=5000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def finished_runs(client, experiment_id: str, versions: tuple[str, str], where: str = "") -> list:
    """Every FINISHED trial run of these versions, (compute version, code version): a run that has
    the compute version, or an older run without one that has the code version."""
    compute, code = versions
    runs = search_all(client, experiment_id, f"{FINISHED_TRIALS} and tags.compute_version = '{compute}'{where}")
    legacy = search_all(client, experiment_id, f"{FINISHED_TRIALS} and tags.code_version = '{code}'{where}")
    return runs + [r for r in legacy if "compute_version" not in r.data.tags]


def cell_of(run) -> tuple[str, str]:
    """(cell key, target key) of a trial run."""
    return run.data.tags.get("config_hash"), run.data.tags.get("target_key")


def done_cells(client, experiment_id: str, versions: tuple[str, str]) -> set[tuple[str, str]]:
    """(cell key, target key) of every FINISHED trial run of these versions (finished_runs)."""
    return {cell_of(r) for r in finished_runs(client, experiment_id, versions)}


def is_done(client, experiment_id: str, versions: tuple[str, str], key: str, target_key: str) -> bool:
    where = f" and tags.config_hash = '{key}' and tags.target_key = '{target_key}'"
    return bool(finished_runs(client, experiment_id, versions, where))


def finished_jobs(client, experiment_id: str, jobs: list, versions: tuple[str, str]) -> set[int]:
    """The numbers of the planned jobs (src/sweep/plan.py) whose cell is done on its target."""
    done = done_cells(client, experiment_id, versions)
    return {j.num for j in jobs if (j.cell_key, j.target_key) in done}


def reused_runs(runs: list, cells: set[tuple[str, str]], sweep_id: str) -> dict[str, str]:
    """cell key -> the run id of another sweep's FINISHED run that stands for the cell, for each cell
    of `cells` that has no FINISHED run of its own sweep (resume skipped it as done): the oldest such
    run, so that a later close names the same one."""
    own = {cell_of(r) for r in runs if r.data.tags.get("sweep_id") == sweep_id}
    out = {}
    for r in sorted(runs, key=lambda r: r.info.start_time, reverse=True):
        cell = cell_of(r)
        if cell in cells and cell not in own:
            out[cell[0]] = r.info.run_id
    return out


# --- who runs a cell --------------------------------------------------------------------------------------

def claim_cell(client, parent_run_id: str, key: str, run_id: str, tries: int = 20) -> str | None:
    """Claim the cell for `run_id`. None when claimed; else the id of the run that holds it
    (FINISHED, or still RUNNING: this job is a duplicate and must not run)."""
    from mlflow.exceptions import MlflowException
    prefix = f"{CLAIM_PREFIX}{key}."
    for _ in range(tries):
        params = client.get_run(parent_run_id).data.params
        attempts = sorted(int(name[len(prefix):]) for name in params if name.startswith(prefix))
        if attempts:
            holder = params[f"{prefix}{attempts[-1]}"]
            if holder == run_id:
                return None
            if client.get_run(holder).info.status not in ENDED_BADLY:
                return holder
        attempt = attempts[-1] + 1 if attempts else 0
        try:
            client.log_param(parent_run_id, f"{prefix}{attempt}", run_id)
            return None
        except MlflowException:
            continue  # another run took this attempt first: look again at who holds the cell
    raise RuntimeError(f"could not claim cell {key} after {tries} tries")


# --- the sweep as a whole ---------------------------------------------------------------------------------

def sweep_signature(jobs: list, compute: str) -> str:
    """The planned jobs' cells on their targets, and the compute version."""
    blob = "\n".join(sorted(f"{j.cell_key}:{j.target_key}" for j in jobs)) + compute
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def previous_parent(client, experiment_id: str, signature: str):
    """The newest parent run of a sweep with this signature (same jobs, same code), or None."""
    runs = client.search_runs([experiment_id], f"tags.`{KIND_TAG}` = '{SWEEP}' and tags.sweep_signature = '{signature}'",
                              max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None
