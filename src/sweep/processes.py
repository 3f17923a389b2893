"""The processes a sweep's parent started, found and stopped by pid (Linux: /proc)."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def children_of() -> dict[int, list[int]]:
    """parent pid -> its children's pids, for every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int | None = None) -> list[int]:
    """Every process below `pid` (default: this one), children first."""
    tree, out, todo = children_of(), [], [pid or os.getpid()]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


def ignores(pid: int, signum: int) -> bool:
    """Whether process `pid` ignores signal `signum` (Linux: its SigIgn mask); False once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def stop_descendants(grace: float = 5.0) -> list[int]:
    """SIGTERM every descendant of this process, SIGKILL those alive after `grace` s (and any that
    appeared meanwhile); returns the pids signalled. Those that ignore SIGTERM are not waited for:
    a resource tracker (multiprocessing's, loky's) ignores it and would hold every stop for the
    whole grace; it gets SIGKILL with the rest."""
    stopped: list[int] = []
    deadline = time.monotonic() + grace
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in descendants():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if pid not in stopped:
                stopped.append(pid)
        while (sig == signal.SIGTERM and time.monotonic() < deadline
               and any(alive(p) and not ignores(p, signal.SIGTERM) for p in stopped)):
            time.sleep(0.1)
    for pid in stopped:  # reap our own children (the others are their parents' to reap)
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return stopped
