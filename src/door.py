"""The front door: every command composes conf/ here and ends here.

The commands: `python -m src.run` (one trial, or a sweep), `src.predict`, the benchmarks
(`make bench` and `src/bench/`), `src.export`, `analysis.report`, the cluster servers, the README
example. Each reads its arguments with `ArgParser` or Hydra, composes conf/ (those that take
overrides) with `compose`, and runs its work under `command` (an argparse tool) or
`hydra_command` (an entry point under @hydra.main). Bad
input ends before any work as one line on stderr and exit status 2, in the same words for the
same mistake whichever command was given it:

    error: unknown draft 'nosuch' (available: bigram, ...)   a config group's option, a sweep's name
    error: bad override 'k=[1,2': ...                         an override Hydra cannot parse
    error: --seqs: an integer >= 1, got 0                     a command's own argument
    error: k must be an integer >= 1                          a config value (src/trial/spec.py)

A full disk ends with one line and exit status 1, Ctrl-C with one line and exit status 130;
never a traceback or Hydra's own report for these. The words of the engine's and the trial's
refusals are theirs (a SpecsweepError's message); the door only says them.

A leaf beside src/paths.py: it imports the engine's errors and the paths, Hydra only inside
`compose`, and no torch (analysis goes through it too).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Callable, NoReturn

from .engine.errors import SpecsweepError, disk_full, error_line, refuse
from .paths import CONF_DIR, SWEEPS_DIR

__all__ = ["ArgParser", "at_least", "check_group_choices", "check_sweep", "command", "compose", "group_options",
           "hydra_command", "one_line", "refuse", "unknown"]

# conf/hydra/launcher/{joblib,ray,submitit_*}.yaml carry the project's settings under the
# plugins' own names, so Hydra merges each onto the plugin's schema of that name (as it still
# does in hydra-core 1.3) and warns that this is deprecated: the merge is what we want.
warnings.filterwarnings("ignore", message=r"(?s).*is validated against ConfigStore schema with the same name")

INPUT_PACKAGES = ("hydra", "omegaconf")   # their errors are a bad override or config: bad input
STORE_PACKAGES = ("mlflow",)              # a command that reads a store: its errors are a bad store or id


# --- the words ---------------------------------------------------------------------------------

def unknown(what: str, name: str, options: list[str]) -> str:
    """The words for a name that is not one of `options` (a draft, a model, a sweep, a bench)."""
    return f"unknown {what} {name!r} (available: {', '.join(options)})"


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


def bad_input(e: BaseException, reads_store: bool = False) -> str | None:
    """The one line for an exception that is bad input, or None when it is not: a SpecsweepError,
    Hydra's or OmegaConf's errors, and MLflow's for a command that reads a store (a bad URI or id)."""
    if isinstance(e, SpecsweepError):
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    package = type(e).__module__.split(".")[0]
    if package in INPUT_PACKAGES:
        return one_line(e)
    if reads_store and package in STORE_PACKAGES:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


class ArgParser(argparse.ArgumentParser):
    """argparse, whose refusals are one line and exit status 2 (`--help` is unchanged)."""

    def add_argument(self, *args, **kwargs):
        # argparse counts a positional of nargs="*" without a default among the required arguments,
        # and says so when another one is missing ("required: folder, overrides")
        if kwargs.get("nargs") == "*" and args and not args[0].startswith("-"):
            kwargs.setdefault("default", [])
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        refuse(f"{self.prog}: {message.removeprefix('argument ')} (see --help)")


def at_least(lo: int):
    """An argparse `type`: an integer >= lo."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"an integer >= {lo}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"an integer >= {lo}, got {value}")
        return value
    parse.__name__ = f"integer >= {lo}"
    return parse


# --- what conf/ and sweeps/ offer ----------------------------------------------------------------

def group_options(group: str) -> list[str]:
    """The options of a config group (its conf/<group>/*.yaml), sorted; [] for no such group."""
    folder = CONF_DIR / group
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def sweep_names() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def check_group_choices(args: list[str]) -> None:
    """Refuse `draft=nosuch` (or `-m draft=bigram,nosuch`) with one sentence naming the options,
    before Hydra sees it (its message for an unknown option is a multi-line wall)."""
    for arg in args:
        key, sep, value = arg.partition("=")
        group = key.lstrip("+~")
        if not sep or "." in group or "@" in group or not (CONF_DIR / group).is_dir():
            continue
        options = group_options(group)
        for choice in value.split(","):
            if choice and choice not in options:
                raise SpecsweepError(unknown(group, choice, options))


def check_sweep(name: str) -> None:
    """A named sweep (sweeps/NAME.yaml), else the refusal naming the sweeps."""
    if not (SWEEPS_DIR / f"{name}.yaml").is_file():
        raise SpecsweepError(unknown("sweep", name, sweep_names()))


def check_config_name(argv: list[str]) -> None:
    """`--config-dir sweeps --config-name NAME` (how `make sweep SWEEP=NAME` runs): NAME a sweep."""
    def value(flags: tuple[str, ...]) -> str | None:
        for i, arg in enumerate(argv):
            for flag in flags:
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "="):
                    return arg[len(flag) + 1:]
        return None
    folder, name = value(("--config-dir", "-cd")), value(("--config-name", "-cn"))
    if folder is not None and name is not None and Path(folder).resolve() == SWEEPS_DIR.resolve():
        check_sweep(name)


# --- composing -----------------------------------------------------------------------------------

def compose(overrides: list[str], config_dir: Path = CONF_DIR, config_name: str = "config",
            hydra_config: bool = False):
    """conf/config.yaml (or `config_name` of `config_dir`) with `overrides`, as Hydra composes it
    for `python -m src.run`; bad input raised as a SpecsweepError in the door's words."""
    from hydra import compose as hydra_compose, initialize_config_dir
    overrides = list(overrides)
    check_group_choices(overrides)
    if Path(config_dir).resolve() == SWEEPS_DIR.resolve():
        check_sweep(config_name)
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return hydra_compose(config_name, overrides=overrides, return_hydra_config=hydra_config)
    except Exception as e:  # noqa: BLE001 - Hydra's and OmegaConf's errors are bad input; others are not
        words = bad_input(e)
        if words is None:
            raise
        raise SpecsweepError(words) from None


# --- how a command ends ----------------------------------------------------------------------------

def command(work: Callable[[], object], reads_store: bool = False, quiet: bool = False) -> int:
    """Run a command's work and return its exit status: 0 when it returns (or the int it returns);
    bad input (`bad_input`) one line and 2; a full disk one line and 1; Ctrl-C one line and 130
    (a `refuse` in the work exits at once with 2). `reads_store`: MLflow's errors are bad input (a command that reads a store);
    `quiet`: warnings-only logging, MLflow's INFO lines off (they would bury the one line)."""
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")   # Hydra raises its errors to us instead of printing them
    # a log file that cannot be written (a full disk) must not print a traceback per log line:
    # the console still shows each line, and the failure itself is said once
    logging.raiseExceptions = False
    if quiet:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        logging.getLogger("mlflow").setLevel(logging.WARNING)
    try:
        status = work()
    except KeyboardInterrupt:   # (a sweep's parent says its own stop line: src/sweep/callbacks.py)
        error_line("stopped: interrupted (SIGINT); rerun the same command")
        return 130
    except Exception as e:  # noqa: BLE001 - said in one line when it is bad input or a full disk, else raised
        words = bad_input(e, reads_store)
        if words is not None:
            error_line(words)
            return 2
        full = disk_full(e)
        if not full:
            raise
        error_line(f"the disk is full ({full}): free space and rerun the same command")
        return 1
    return status if isinstance(status, int) else 0


def hydra_command(main: Callable[[], object]) -> None:
    """Run `main` (a function under @hydra.main) as a command: its group choices and sweep name
    checked before Hydra parses the command line, then `command`."""
    def work():
        check_group_choices(sys.argv[1:])
        check_config_name(sys.argv[1:])
        main()
    status = command(work)
    if status:
        sys.exit(status)
