"""MLflow bookkeeping: where the store is, the experiment, and what a trial run records.

Default store: `sqlite:///<repo>/mlruns/mlflow.db` with artifacts under `<repo>/mlruns/artifacts`,
as absolute paths (jobs may start in another working directory). `MLFLOW_TRACKING_URI` or
`tracking.uri` replace it; a tracking server URL works the same way.

All calls go through an explicit `MlflowClient` and run ids: loky reuses worker processes, so
MLflow's process-global active-run stack would leak from one job to the next.
"""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import logging
import os
import platform
import socket
import tempfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ..engine.errors import SpecsweepError, disk_full
from ..trial.spec import TrialSpec, repo_path, tree_label
from ..engine.locks import SETUP_WAIT_S, file_lock
from .resume import code_version, compute_version, git_state
from .store import check_reachable, check_sqlite_file, is_server, resolve_uri, sqlite_path

log = logging.getLogger(__name__)
# No pooled SQLite connections: a trial process forked from a worker must not inherit open
# connections of its parent, and short-lived connections suit many writer processes.
os.environ.setdefault("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
# MLflow's database layer logs every SQLAlchemy error with its traceback before it raises it again
# (as an MlflowException, which the sweep says in one line): a full disk would print one per write.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)



def tracking_uri(cfg: DictConfig | None = None) -> str:
    """The store of a config, by the rules of src/sweep/store.py."""
    uri = cfg.tracking.get("uri") if cfg is not None else None
    if uri is not None and not str(uri).strip():   # an empty value is a mistake, not the default store
        raise SpecsweepError("tracking.uri is empty: give a store URI, or null for the default store "
                             "(MLFLOW_TRACKING_URI, else mlruns/mlflow.db)")
    return resolve_uri(str(uri) if uri is not None else None)


def written_folders(cfg: DictConfig, output_dir=None) -> list:
    """Where a trial or a sweep writes (whose file system a full disk would be): the cache, the
    SQLite store's folder, and Hydra's output folder `output_dir` when given."""
    from ..trial.spec import repo_path
    cache = cfg.get("data", {}).get("cache_dir")
    folders = [repo_path(str(cache)) if cache else None, output_dir]
    try:
        db = sqlite_path(tracking_uri(cfg))
        folders.append(db.parent if db else None)
    except Exception:   # noqa: BLE001 - no usable store URI (refused elsewhere): nothing more to name
        pass
    return [f for f in folders if f]


def artifact_location(uri: str, experiment: str) -> str | None:
    """Artifacts beside a SQLite store; a server decides its own (None)."""
    db = sqlite_path(uri)
    return (db.parent / "artifacts" / experiment).as_uri() if db else None


def store_lock(uri: str):
    """A lock for one-time set-up steps: beside a SQLite store, or in the temp folder for a server URI."""
    db = sqlite_path(uri)
    name = hashlib.sha256(uri.encode()).hexdigest()[:12]
    path = (db.parent / ".store.lock") if db else Path(tempfile.gettempdir()) / f"specsweep-{name}.lock"
    return file_lock(path, f"the tracking store {uri}", SETUP_WAIT_S)


def check_store(uri: str) -> None:
    """Fail fast, with one line, on a store that cannot work, writing nothing: a URI of another
    form (store.check_uri), an unreachable server, a SQLite file whose folder takes no new file
    (tried) or that is not writable, one that is not a regular file or not a database, or a database
    of another application (tables, but not MLflow's); a database server that does not answer, or
    whose driver is missing (check_database)."""
    if is_server(uri):
        # bounded retries: a server that goes away mid-sweep fails the trial, not hangs it
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    check_reachable(uri)
    db = sqlite_path(uri)
    if db is not None:
        check_sqlite_file(db, write=True)


def client_for(uri: str):
    """A client on a store that passed `check_store`."""
    from mlflow.tracking import MlflowClient
    check_store(uri)
    return MlflowClient(tracking_uri=uri)


def preload_store(uri: str) -> None:
    """MLflow's modules and its store for `uri` loaded in this process (MLflow keeps one store per
    URI), without a check or a request: a worker does this before it forks a trial, whose child
    inherits them instead of importing MLflow again (seconds a trial), and checks the store itself."""
    from mlflow.tracking import MlflowClient
    MlflowClient(tracking_uri=uri)


def setup_experiment(uri: str, name: str) -> str:
    """Create the store's schema and the experiment once (under a lock); return its id.

    Parallel workers on a fresh SQLite store otherwise race on schema migration and on
    experiment creation (hydraflow #245, mlflow #4123)."""
    check_store(uri)
    db = sqlite_path(uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    with store_lock(uri):
        client = client_for(uri)
        try:
            exp = client.get_experiment_by_name(name)
            if exp is not None:
                return exp.experiment_id
            return client.create_experiment(name, artifact_location=artifact_location(uri, name))
        except SpecsweepError:
            raise
        except Exception as e:
            if disk_full(e):   # not the store's fault: the caller says so in one line
                raise
            raise SpecsweepError(f"tracking store {uri} is unusable: {str(e).splitlines()[0][:200]}") from None


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def trial_config(cfg: DictConfig) -> dict:
    """The resolved trial config without Hydra's own node, where it is tracked and the sweep it is in
    (its name too: a cell is the same cell whatever sweep names it, so a sweep resumes on another's runs)."""
    # the other nodes are dropped before resolving: Hydra's node interpolates the HydraConfig, which a
    # process outside a Hydra job (a Ray driver recording a job lost on the cluster) does not have
    kept = [key for key in cfg.keys() if key not in ("hydra", "tracking", "sweep", "sweep_name", "resume")]
    out = OmegaConf.to_container(OmegaConf.masked_copy(cfg, kept), resolve=True)
    workload = out.get("workload") or {}
    if workload.get("name") == "file" and isinstance(workload.get("path"), str):
        # the file's prompts, not only its name, make the trial: an edited file is another cell
        out["workload_file_sha256"] = file_sha256_or_none(repo_path(workload["path"]))
    return out


def file_sha256_or_none(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment_tags() -> dict:
    """Where a run ran: code, host, CPU model, library versions (the git state is read once per process:
    a sweep's code does not change under it, and each read costs three git calls)."""
    commit, dirty = git_state()
    return {"git_commit": commit, "git_dirty": str(dirty).lower(), "code_version": code_version(),
            "compute_version": compute_version(),
            "host": socket.gethostname(), "cpu_model": cpu_model(), "torch_version": torch.__version__,
            "python_version": platform.python_version()}


def verify_params(spec: TrialSpec) -> dict:
    """verify = chain | tree, and for a tree its shape (`tree_widths`, e.g. 4-2-2-1)."""
    return {"verify": "chain"} if spec.tree is None else {"verify": "tree", "tree_widths": tree_label(spec.tree)}


def trial_params(cfg: DictConfig, spec: TrialSpec, target_key: str) -> dict:
    """A trial run's params: the flattened resolved config, and the cell's coordinates by name."""
    params = {key: str(v) for key, v in flatten(trial_config(cfg)).items()}
    params.update({"draft": spec.draft.name, "k": str(spec.k), "seed": str(spec.seed), "n_chars": str(spec.n_chars),
                   "workload": spec.workload.name,
                   "pairs_min": str(spec.timing.pairs), "temperature": str(spec.temperature),
                   "target_key": target_key, **verify_params(spec)})
    return {key: v[:6000] for key, v in params.items()}


def pairs_csv(timing) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["pair", "order", "baseline_s", "speculative_s", "ratio", "baseline_cpu_wall", "speculative_cpu_wall"])
    for i, (o, b, s, cb, cs) in enumerate(zip(timing.order, timing.baseline_s, timing.speculative_s,
                                             timing.baseline_cpu_ratio, timing.speculative_cpu_ratio)):
        w.writerow([i, o, f"{b:.9f}", f"{s:.9f}", f"{b / s:.6f}", f"{cb:.4f}", f"{cs:.4f}"])
    return buf.getvalue()


def log_trial_result(client, run_id: str, cfg: DictConfig, result) -> None:
    """Metrics (with per-pair histories), and the artifacts: pairs.csv, config.yaml, sample.txt,
    prompts.csv (each prompt of the workload: its counters and times) and, for a batch,
    sequences.csv (each sequence's counters)."""
    import time

    from mlflow.entities import Metric, RunTag
    now = int(time.time() * 1000)
    metrics = [Metric(key, float(v), now, 0) for key, v in result.metrics.items()]
    t = result.timing
    for i, (b, s) in enumerate(zip(t.baseline_s, t.speculative_s)):
        metrics += [Metric("speedup_pair", b / s, now, i), Metric("baseline_s", b, now, i),
                    Metric("speculative_s", s, now, i)]
    tags = [RunTag(f"info.{key}", str(v)) for key, v in result.info.items()]
    for start in range(0, len(metrics), 1000):  # few large transactions: SQLite commits are the cost
        client.log_batch(run_id, metrics=metrics[start:start + 1000], tags=tags if start == 0 else [])
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "pairs.csv").write_text(pairs_csv(t))
        Path(tmp, "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        Path(tmp, "sample.txt").write_text(result.text, encoding="utf-8")
        for name, rows in (("sequences.csv", result.sequences), ("prompts.csv", result.prompts)):
            if rows:
                with open(Path(tmp, name), "w", newline="", encoding="utf-8") as f:
                    w = csv.DictWriter(f, fieldnames=list(rows[0]))
                    w.writeheader()
                    w.writerows(rows)
        client.log_artifacts(run_id, tmp)
