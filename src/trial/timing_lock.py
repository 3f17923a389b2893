"""The host's timing lock: at most one timed phase per host at a time, whatever the launcher and
however many sweeps, so trials running in parallel take turns at the clock while their
deterministic work (counters, loading, exactness checks) runs side by side."""
from __future__ import annotations

import tempfile
from contextlib import nullcontext
from pathlib import Path

from ..engine.locks import TIMING_WAIT_S, file_lock

from .spec import TimingSpec

LOCK_NAME = "specsweep-timing.lock"


def timing_lock(timing: TimingSpec):
    """The lock file in this host's temp folder (timing.lock_dir to choose another); a no-op
    context with timing.lock=false."""
    if not timing.lock:
        return nullcontext()
    folder = timing.lock_dir or Path(tempfile.gettempdir())
    return file_lock(folder / LOCK_NAME, "this host's timing lock (other trials are timing)", TIMING_WAIT_S)
