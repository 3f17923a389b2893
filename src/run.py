"""The command line: one trial, or a sweep of them (`python -m src.run --help`).

    python -m src.run draft=int8 k=4                        # one trial, printed and tracked
    python -m src.run -m draft=bigram,int8,int4 k=1,2,4,8   # a sweep on joblib workers

Thin on purpose: Hydra composes the config, `src/sweep/job.py: run_job` does the rest. Bad
input ends with one line and exit status 2; a sweep with failed trials exits 1 after running
all the others (src/sweep/callbacks.py).
"""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from . import sweep  # noqa: F401  (its warning filter, before Hydra composes the launcher configs)
from .engine.errors import SpecsweepError
from .trial.conf import check_group_choices


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from .sweep.job import run_job  # here, not at the top: `--help` needs none of it
    run_job(cfg)


def cli() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
