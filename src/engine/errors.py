"""The one exception type for bad input and unusable files, and how an entry point answers it.

Entry points turn it into a single-line message (`error: ...` on stderr) and exit status 2,
never a traceback: `refuse(message)` does that, and `ArgParser` answers bad arguments the same
way (argparse's own answer is two lines, a usage line and the error).
"""
from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class SpecsweepError(Exception):
    """A problem the user can fix (bad config value, missing corpus, corrupt file)."""


def refuse(message: str) -> NoReturn:
    """Bad input at an entry point: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


class ArgParser(argparse.ArgumentParser):
    """argparse, whose refusals are one line and exit status 2 (`--help` is unchanged)."""

    def error(self, message: str) -> NoReturn:
        refuse(f"{self.prog}: {message} (see --help)")


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
