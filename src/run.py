"""Entry point: `python -m src.run draft=int8 k=4` runs one trial and prints its result.

Thin on purpose: compose the config (Hydra), call `run_trial`, render. Bad input ends with
one line on stderr and exit status 2.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from .errors import SpecsweepError

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


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
def main(cfg: DictConfig) -> None:
    from .report import trial_block
    from .trial import run_trial
    try:
        result = run_trial(cfg)
    except SpecsweepError as e:
        log.error("error: %s", e)
        sys.exit(2)
    for line in trial_block(cfg, result).splitlines():
        log.info(line)


def cli() -> None:
    try:
        check_group_choices(sys.argv[1:])
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
