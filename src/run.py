"""The command line: one trial, or a sweep of them (`python -m src.run --help`).

    python -m src.run draft=int8 k=4                        # one trial, printed and tracked
    python -m src.run -m draft=bigram,int8,int4 k=1,2,4,8   # a sweep on joblib workers

Thin on purpose: Hydra composes the config, `src/sweep/job.py: run_job` does the rest. Bad
input ends with one line on stderr (`error: ...`) and exit status 2, a single run and a sweep
alike, before any work; a sweep with failed trials exits 1 after running all the others
(src/sweep/callbacks.py); a full disk ends either with one line that says so and exit status 1.
"""
from __future__ import annotations

import os

# Before Hydra and MLflow are imported: Hydra hands its errors to the front door (src/door.py, which says them in one
# line) instead of printing its own report; MLflow keeps its INFO lines off stderr. Workers
# inherit both.
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from .door import hydra_command  # noqa: E402  (and its warning filter, before Hydra composes the launcher configs)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from .sweep.job import run_job  # here, not at the top: `--help` needs none of it
    run_job(cfg)


def cli() -> None:
    hydra_command(main)


if __name__ == "__main__":
    cli()
