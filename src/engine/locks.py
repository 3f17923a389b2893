"""File locks that never hang: a bounded wait that says what it waits for.

Every lock of the project (the model cache, a draft's table or heads, a published target's
local copy, the store's one-time set-up, the host's timing lock) goes through `file_lock`.
A lock that is free is taken at once; a lock another process holds is waited for, with one
log line naming what it guards, for at most `timeout` seconds, then refused with one sentence
(SpecsweepError). A lock file that cannot be created (a read-only folder, a folder where no
file can be made: filelock would retry that forever) is refused at once.
"""
from __future__ import annotations

import logging
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import SpecsweepError

log = logging.getLogger(__name__)

# How long each kind of lock is waited for (seconds): the longest its holder can take.
TRAINING_WAIT_S = 6 * 3600     # another process training the same target (the medium one: about 1 h here)
BUILD_WAIT_S = 3600            # another process building a draft's table or training its heads
COPY_WAIT_S = 1800             # another process fetching a published checkpoint
SETUP_WAIT_S = 600             # another process creating the store's schema or publishing a target
TIMING_WAIT_S = 6 * 3600       # the other trials of this host taking their turns at the clock


def check_creatable(folder: Path, what: str) -> None:
    """Refuse, in one sentence, a folder where no file can be created (tried, not guessed:
    os.access says yes to root on a read-only mount, and /proc takes no new file at all)."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:  # the nearest folder that exists
        probe = probe.parent
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".specsweep-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise SpecsweepError(f"cannot create {what} in {folder}: {e.strerror or e}") from None


@contextmanager
def file_lock(path: str | Path, what: str, timeout: float):
    """Hold the lock file `path`, which guards `what` (for the messages), waiting at most `timeout` s."""
    path = Path(path)
    if not path.exists():
        check_creatable(path.parent, f"the lock file for {what}")
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info("waiting for %s: another process holds %s (at most %.0f s)", what, path, timeout)
            lock.acquire(timeout=timeout)
    except Timeout:
        raise SpecsweepError(f"gave up after {timeout:.0f} s waiting for {what}: another process holds the lock "
                             f"{path} (if none is running, delete the file)") from None
    except OSError as e:
        raise SpecsweepError(f"cannot take the lock {path} for {what}: {e.strerror or e}") from None
    try:
        yield
    finally:
        lock.release()
