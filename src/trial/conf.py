"""What conf/ offers: the options of each config group, a check of the group choices on a
command line before Hydra sees them (its message for an unknown option is a multi-line wall),
and `command_line`, which runs a Hydra entry point (`python -m src.run`, `make bench`) the way
every command here ends: one line and exit 2 for bad input, one line and exit 1 for a full disk."""
from __future__ import annotations

import logging
import os
import sys

from ..engine.errors import SpecsweepError, disk_full, error_line, refuse
from ..paths import CONF_DIR


def group_options(group: str) -> list[str]:
    """The options of a config group (its conf/<group>/*.yaml), sorted; [] for no such group."""
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def check_group_choices(args: list[str]) -> None:
    """Refuse `draft=nosuch` (or `-m draft=bigram,nosuch`) with one sentence naming the options."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if not sep or "." in group or "@" in group or not (CONF_DIR / group).is_dir():
            continue
        options = group_options(group)
        for choice in value.split(","):
            if choice and choice not in options:
                raise SpecsweepError(f"unknown {group} {choice!r} (available: {', '.join(options)})")


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


def command_line(main) -> None:
    """Run `main` (a function under @hydra.main) as a command: its SpecsweepError and Hydra's or
    OmegaConf's errors (a bad override, an unknown key, a bad list) are one line on stderr and exit
    2; a full disk (Hydra's own files included) is one line and exit 1; Ctrl-C is one line and exit
    130; never Hydra's own report or a traceback for these."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")   # Hydra raises its errors to us instead of printing them
    # a log file that cannot be written (a full disk) must not print a traceback per log line:
    # the console still shows each line, and the failure itself is said once
    logging.raiseExceptions = False
    try:
        check_group_choices(sys.argv[1:])
        main()
    except SpecsweepError as e:
        refuse(str(e))
    except KeyboardInterrupt:   # Ctrl-C (a sweep's parent says its own stop line: src/sweep/callbacks.py)
        error_line("stopped: interrupted (SIGINT); rerun the same command")
        sys.exit(130)
    except Exception as e:
        if type(e).__module__.split(".")[0] in ("hydra", "omegaconf"):
            refuse(one_line(e))
        full = disk_full(e)
        if not full:
            raise
        error_line(f"the disk is full ({full}): free space and rerun the same command")
        sys.exit(1)
