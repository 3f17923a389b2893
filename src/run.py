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
import sys

# Before Hydra and MLflow are imported: Hydra hands its errors to `cli` (which says them in one
# line) instead of printing its own report; MLflow keeps its INFO lines off stderr. Workers
# inherit both.
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from . import sweep  # noqa: E402,F401  (its warning filter, before Hydra composes the launcher configs)
from .engine.errors import SpecsweepError, disk_full  # noqa: E402
from .trial.conf import check_group_choices  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from .sweep.job import run_job  # here, not at the top: `--help` needs none of it
    run_job(cfg)


def one_line(e: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages (the override, what is wrong, a hint) as one line."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip() and "hydra.cc/docs" not in line]
    cause = e.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in lines:
            lines.append(first)
    text = " ".join(lines[:3]) or type(e).__name__
    override = getattr(e, "override", None)  # an override Hydra could not parse
    return f"bad override {override!r}: {text}" if override and str(override) not in text else text


def cli() -> None:
    import logging
    # a log file that cannot be written (a full disk) must not print a traceback per log line:
    # the console still shows each line, and the failure itself is said once (src/sweep/job.py)
    logging.raiseExceptions = False
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    try:
        check_group_choices(sys.argv[1:])
        main()
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (HydraException, OmegaConfBaseException) as e:  # a bad override, an unknown key, a bad list
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # Hydra's own files (the job's config, its log) on a full disk: one line
        full = disk_full(e)
        if not full:
            raise
        print(f"error: the disk is full ({full}): free space and rerun the same command", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
