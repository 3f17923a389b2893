"""The one exception type for bad input and unusable files, and how an entry point answers it.

Entry points turn it into a single-line message (`error: ...` on stderr) and exit status 2,
never a traceback: `refuse(message)` does that; every command reaches it through the front door
(src/door.py).
"""
from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import NoReturn


class SpecsweepError(Exception):
    """A problem the user can fix (bad config value, missing corpus, corrupt file)."""


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXTS = ("no space left on device", "database or disk is full", "disk quota exceeded")


def disk_full(error: BaseException, folders=()) -> str | None:
    """Why `error` is a full disk, in a few words, or None: an OSError of ENOSPC or EDQUOT anywhere in
    its chain of causes (a file's name when it has one), SQLite's "database or disk is full" however
    MLflow or SQLAlchemy wrapped it, or else one of `folders` on a file system with no space left."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
            return f"{os.strerror(e.errno)}{f': {e.filename}' if e.filename else ''}"
        text = str(e).lower()
        for full in FULL_TEXTS:
            if full in text:
                return full
        e = e.__cause__ or e.__context__
    for folder in folders:
        if folder is not None and no_space(Path(folder)):
            return f"no space left on the file system of {folder}"
    return None


def no_space(folder: Path, below: int = 1 << 20) -> bool:
    """The file system holding `folder` (or its nearest existing parent) has less than `below` bytes free."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < below


def unreadable(path: Path) -> str | None:
    """Why the file at `path` cannot be read (its first byte tried: a mode that denies reading, a
    folder that cannot be entered), in a few words; None when it can."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return e.strerror or str(e)
    return None


def error_line(message: str) -> None:
    """`error: MESSAGE` on stderr, on a line of its own: after a line break where a progress bar
    (tqdm's, which ends no line) may hold the current line."""
    bar = getattr(sys.modules.get("tqdm"), "tqdm", None)
    drawn = bool(getattr(bar, "_instances", None))
    print(("\n" if drawn else "") + f"error: {message}", file=sys.stderr, flush=True)


def refuse(message: str) -> NoReturn:
    """Bad input at an entry point: one line on stderr, exit status 2."""
    error_line(message)
    raise SystemExit(2)
