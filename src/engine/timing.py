"""Timing on a noisy shared machine: paired, alternated runs reported as ratios.

Protocol (pyperf, torch.utils.benchmark, Kalibera & Jones): one untimed warm-up of each arm,
then `pairs` baseline/speculative pairs in alternating order (B,S / S,B / ...) so drift does not
always land on the same arm. Each pair gives a ratio baseline/speculative; with n pairs,
[min, max] of the ratios is a distribution-free confidence interval for the median ratio
(93.75% at n = 5, 98.4% at n = 7). Every timed run also records CPU time / wall time: well
below 1 for a single-threaded run means the process was descheduled.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str = "cpu") -> tuple[float, float]:
    """Run fn once; return (wall seconds, CPU seconds / wall seconds)."""
    synchronize(device)
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    wall = time.perf_counter() - w0
    return wall, (time.process_time() - c0) / wall


def median_time(fn: Callable[[], object], reps: int, repeats: int = 7, device: str = "cpu") -> float:
    """Median over `repeats` of the mean seconds per call over `reps` calls."""
    fn()  # warm-up
    per_call = []
    for _ in range(repeats):
        wall, _ = timed(lambda: [fn() for _ in range(reps)], device)
        per_call.append(wall / reps)
    return statistics.median(per_call)


def confidence_of_range(n_pairs: int) -> float:
    """Coverage of [min, max] of n i.i.d. ratios as an interval for their median: 1 - 2 / 2^n."""
    return 1.0 - 2.0 * 0.5 ** n_pairs


@dataclass
class PairedTiming:
    baseline_s: list[float]
    speculative_s: list[float]
    baseline_cpu_ratio: list[float]
    speculative_cpu_ratio: list[float]
    order: list[str]  # "BS" or "SB" per pair

    @property
    def ratios(self) -> list[float]:
        return [b / s for b, s in zip(self.baseline_s, self.speculative_s)]

    def summary(self) -> dict:
        r = self.ratios
        return {
            "speedup_median": statistics.median(r),
            "speedup_min": min(r),
            "speedup_max": max(r),
            "speedup_range_confidence": confidence_of_range(len(r)),
            "baseline_iqr_rel": _iqr_rel(self.baseline_s),
            "speculative_iqr_rel": _iqr_rel(self.speculative_s),
            "min_cpu_wall_ratio": min(self.baseline_cpu_ratio + self.speculative_cpu_ratio),
            "baseline_s_median": statistics.median(self.baseline_s),
            "speculative_s_median": statistics.median(self.speculative_s),
        }


def _iqr_rel(xs: list[float]) -> float:
    """Interquartile range / median: spread of one arm (> 0.10 warn, > 0.25 unreliable)."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / statistics.median(xs)


def paired_timing(baseline: Callable[[], object], speculative: Callable[[], object], pairs: int,
                  device: str = "cpu") -> PairedTiming:
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    baseline()
    speculative()  # untimed warm-ups
    res = PairedTiming([], [], [], [], [])
    for i in range(pairs):
        order = "BS" if i % 2 == 0 else "SB"
        for arm in order:
            wall, cpu = timed(baseline if arm == "B" else speculative, device)
            if arm == "B":
                res.baseline_s.append(wall)
                res.baseline_cpu_ratio.append(cpu)
            else:
                res.speculative_s.append(wall)
                res.speculative_cpu_ratio.append(cpu)
        res.order.append(order)
    return res
