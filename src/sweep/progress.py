"""A sweep's progress, counted from the server: each job logs it as it ends."""
from __future__ import annotations

import logging
import time

from .context import SweepContext
from .ledger import invocation_counts

log = logging.getLogger(__name__)


def hms(seconds: float) -> str:
    if seconds != seconds:  # NaN: nothing done yet
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def report_progress(client, ctx: SweepContext) -> None:
    """Logged by each job as it ends, counted from the server: 'trials done / to run, ETA'."""
    counts = invocation_counts(client, ctx.experiment_id, ctx.invocation)
    failed = counts.get("FAILED", 0) + counts.get("KILLED", 0)
    done = counts.get("FINISHED", 0) + failed
    elapsed = time.time() - ctx.started
    eta = elapsed / done * max(0, ctx.to_run - done) if done else float("nan")
    log.info("progress: %d/%d trials done (%d failed), elapsed %s, ETA %s", done, ctx.to_run, failed,
             hms(elapsed), hms(eta))
