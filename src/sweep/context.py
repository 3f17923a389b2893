"""The parent-to-worker contract: what a sweep's parent tells every job, inside the job's config.

The parent (src/sweep/callbacks.py) plans the sweep, opens its parent run and publishes each
target to the tracking server, then appends one override `sweep={...}` to the task overrides,
so every job's composed config carries a `sweep` node with these fields, on any launcher and any
host: no file only the parent's host can read. A single run (no -m) has `sweep: null`.

Everything else a worker needs (which cells are done, how many have finished, the target's
bytes) it reads from the tracking server.
"""
from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field, fields

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class PublishedTarget:
    key: str          # the engine's cache key (src/engine/models/train.py cache_key)
    run_id: str       # the target run holding `checkpoint/target-<key>.pt`
    sha256: str       # of that checkpoint: a worker verifies its copy against it


@dataclass(frozen=True)
class SweepContext:
    sweep_id: str                  # tags every trial run of the sweep (also across resumes)
    sweep_name: str
    invocation: str                # this launch of the sweep: its runs, its progress
    parent_run_id: str             # the sweep's parent run; trials are its children
    experiment_id: str
    tracking_uri: str              # a server URI for any launcher beyond this host
    code_version: str              # the commit (+ the diff's hash when dirty): older runs are done by it
    total: int                     # trials planned (the grid)
    to_run: int                    # of them, not already FINISHED when the sweep started
    n_jobs: int                    # parallel workers joblib runs (launchers.n_workers; informational)
    started: float                 # epoch seconds, for the progress ETA
    parent: str                    # "host:pid" of the sweep's parent process: a job there runs in-process
    targets: tuple[PublishedTarget, ...] = field(default_factory=tuple)
    compute_version: str = ""      # what computes (resume.compute_version): a worker whose code differs refuses to run

    def in_parent(self) -> bool:
        """True in the sweep's parent process (joblib at n_jobs=1 runs its jobs there)."""
        return self.parent == this_process()

    def target(self, key: str) -> PublishedTarget | None:
        return next((t for t in self.targets if t.key == key), None)

    def override(self) -> str:
        """The Hydra override that puts this context into every job's config."""
        return "sweep=" + _dict(asdict(self))

    @classmethod
    def from_cfg(cls, cfg: DictConfig) -> "SweepContext | None":
        node = cfg.get("sweep")
        if node is None:
            return None
        data = OmegaConf.to_container(node, resolve=True)
        data["targets"] = tuple(PublishedTarget(**t) for t in data.get("targets") or [])
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _value(v) -> str:
    # Hydra's override grammar: quote every string (URIs hold ':' and '/'), escape quotes
    if isinstance(v, dict):
        return _dict(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _dict(d: dict) -> str:
    return "{" + ",".join(f"{k}:{_value(v)}" for k, v in d.items()) + "}"
