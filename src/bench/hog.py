"""A controlled background load for benchmarks: one busy child process per core, stopped by pid.

    with CpuHog(cores=2) as hog:     # two children, pinned to the first two cores the caller may use
        ...                          # hog.pids, hog.alive()
    # stopped here, also on an exception or Ctrl-C

Each child spins (a pure-Python busy loop, no imports beyond os/sys/time) on one core for
`duty` of every `period` seconds and sleeps the rest (duty 1.0: spins all the time). It is
pinned to its core where the platform allows (os.sched_setaffinity), so N children contend
for N known cores whatever the scheduler does. The children are stopped by pid: SIGTERM,
then SIGKILL after a grace period, then reaped. A child also exits by itself once its parent
is gone (it checks its parent pid every few milliseconds), so a benchmark killed with SIGKILL
leaves no spinning process behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field

from ..engine.errors import SpecsweepError

# argv: parent pid, core (-1: not pinned), duty, period in seconds
CHILD = r"""
import os, sys, time
parent, core, duty, period = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
if core >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {core})
check = min(period, 0.005)  # how often the parent pid is checked while spinning
while os.getppid() == parent:
    end = time.perf_counter() + duty * period
    while time.perf_counter() < end and os.getppid() == parent:
        stop = min(end, time.perf_counter() + check)
        while time.perf_counter() < stop:
            pass
    if duty < 1:
        time.sleep((1 - duty) * period)
"""


def exit_on_sigterm() -> None:
    """SIGTERM raises SystemExit(143) in the main thread, so `with CpuHog(...)` blocks and finally
    clauses run on the way out, as they do for Ctrl-C (the default SIGTERM action skips them)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity set), else 0..cpu_count-1."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def default_hog_cores() -> int:
    """All usable cores but the one the timed trial runs on, plus one more so that the timed
    core itself is contended: as many children as usable cores (2 on a 2-core machine)."""
    return len(usable_cores())


@dataclass
class CpuHog:
    cores: int = field(default_factory=default_hog_cores)
    duty: float = 1.0        # fraction of each period spent spinning
    period: float = 0.1      # seconds
    pin: bool = True         # pin child i to the i-th usable core (cycling when cores > usable cores)
    grace: float = 5.0       # seconds between SIGTERM and SIGKILL
    procs: list[subprocess.Popen] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.cores, bool) or not isinstance(self.cores, int) or self.cores < 0:
            raise SpecsweepError(f"hog cores must be an integer >= 0, got {self.cores!r}")
        if not 0 < self.duty <= 1:
            raise SpecsweepError(f"hog duty must be in (0, 1], got {self.duty!r}")
        if not self.period > 0:
            raise SpecsweepError(f"hog period must be > 0 s, got {self.period!r}")

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def alive(self) -> int:
        """How many children are still running."""
        return sum(p.poll() is None for p in self.procs)

    def start(self) -> "CpuHog":
        if self.procs:
            raise RuntimeError("the hog is running already")
        usable = usable_cores()
        try:
            for i in range(self.cores):
                core = usable[i % len(usable)] if self.pin else -1
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(os.getpid()), str(core), repr(self.duty), repr(self.period)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGTERM every child by pid, SIGKILL those left after `grace` seconds, reap them all."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
        self.procs = []

    def __enter__(self) -> "CpuHog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
