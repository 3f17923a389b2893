"""Entry point.

    python -m src.run draft=int8 k=4                        # one trial, printed and tracked
    python -m src.run -m draft=bigram,int8,int4 k=1,2,4,8   # a sweep on joblib workers

Thin on purpose: compose the config (Hydra), hand it to `job.run_job`. Bad input ends with one
line and exit status 2; a sweep with failed trials exits 1 after running all the others.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .engine.errors import SpecsweepError
from .harness.paths import CONF_DIR

log = logging.getLogger(__name__)


def check_group_choices(args: list[str]) -> None:
    """Catch `draft=nosuch` before Hydra does (its message is a multi-line wall)."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if not sep or "." in group or not (CONF_DIR / group).is_dir():
            continue
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        for choice in value.split(","):
            if choice and choice not in options:
                raise SpecsweepError(f"unknown {group} {choice!r} (available: {', '.join(options)})")


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig):
    from .harness.job import run_job
    return run_job(cfg)


def cli() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main()
    from .harness.callbacks import last_summary
    if last_summary.get("failed"):
        sys.exit(1)  # a sweep with failed trials: all others ran, and the failures are recorded


if __name__ == "__main__":
    cli()
