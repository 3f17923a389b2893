"""Timing on a noisy shared machine: paired, alternated runs reported as ratios.

Protocol (pyperf, torch.utils.benchmark, Kalibera & Jones): one untimed warm-up of each arm,
then baseline/speculative pairs in alternating order (B,S / S,B / ...) so drift does not always
land on the same arm. Each pair gives a ratio baseline/speculative; the median ratio is the
speedup, and order statistics of the sorted ratios give a distribution-free confidence interval
for it (`median_interval`, intervals.py): with n ratios, [X_(j), X_(n+1-j)] covers the median with probability
1 - 2 * BinomCDF(j - 1; n, 1/2), e.g. [min, max] at 93.75% for n = 5, 96.9% for n = 6.

Fixed (target_width None or 0): exactly `pairs` pairs. Adaptive: `pairs` is the minimum; pairs
are added until the interval at the stated level is at most `target_width` of the median wide
(checked after an even number of pairs, so B,S and S,B are equally many), or a cap is reached
(`max_pairs` pairs, or `max_seconds` of timed runs); the caps never cut below `pairs`.
The coverage reported is the interval's coverage at the number of pairs it stopped at. Stopping
because the interval is narrow (optional stopping) costs a little of it: in simulations with
5% noise per run, intervals reported at ~97% covered the planted median ~95% of the time, which
is the level asked for (tests/engine/measuring/test_timing.py checks this).

Every timed run also records CPU time / wall time: well below 1 for a single-threaded run means
the process was descheduled. Component costs (`interleaved_medians`) are timed in interleaved
rounds so that a burst of load cannot hit one component alone; `round_ratio` takes two
components' ratio within each round, as a pair does. Rounds are repeated the way pairs are
(`adaptive_rounds`): a minimum, then one more round at a time until a caller's width test
passes or a cap (rounds, seconds) is reached.

Everything here takes callables and clocks, so tests can plant a timer.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..errors import SpecsweepError
from .intervals import confidence_of_range, median_interval

Clock = Callable[[], float]

FIXED, WIDTH, PAIRS_CAP, TIME_CAP = "fixed", "width", "pairs cap", "time cap"  # why a paired timing stopped
ROUNDS_CAP = "rounds cap"  # why adaptive cost rounds stopped (or WIDTH, TIME_CAP, FIXED)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str = "cpu", clock: Clock = time.perf_counter,
          cpu_clock: Clock = time.process_time) -> tuple[float, float]:
    """Run fn once; return (wall seconds, CPU seconds / wall seconds)."""
    synchronize(device)
    w0, c0 = clock(), cpu_clock()
    fn()
    synchronize(device)
    wall = clock() - w0
    return wall, ((cpu_clock() - c0) / wall if wall > 0 else 1.0)


def interleaved_medians(blocks: dict[str, tuple[Callable[[], object], int]], rounds: int = 7,
                        device: str = "cpu", clock: Clock = time.perf_counter) -> dict[str, float]:
    """name -> median over `rounds` of the mean seconds per call of one block of `reps` calls.

    blocks: name -> (fn, reps). Each fn is called once untimed first. Round r times one block of
    every component, in an order rotated by r (A B C, B C A, C A B, ...), so a burst of load
    lasting a few blocks lands on several components, in few rounds of each, instead of on all
    rounds of one component; the median over rounds then drops it."""
    per_call = interleaved_rounds(blocks, rounds, device, clock)
    return {name: statistics.median(v) for name, v in per_call.items()}


def round_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[r] / b[r]: two components' ratio taken within each round, where the
    machine ran at one speed, as a pair's ratio is. On a machine whose speed changes from round to
    round the ratio of the two medians can mix a fast round of one with a slow round of the
    other (tests/engine/measuring/test_timing.py plants that)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def interleaved_rounds(blocks: dict[str, tuple[Callable[[], object], int]], rounds: int = 7,
                       device: str = "cpu", clock: Clock = time.perf_counter) -> dict[str, list[float]]:
    """name -> the mean seconds per call of its block in each of `rounds` rotated rounds
    (interleaved_medians, which takes their medians)."""
    return adaptive_rounds(blocks, rounds, device=device, clock=clock)[0]


def adaptive_rounds(blocks: dict[str, tuple[Callable[[], object], int]], rounds: int = 7,
                    enough: Callable[[dict[str, list[float]]], bool] | None = None,
                    max_rounds: int | None = None, max_seconds: float | None = None,
                    device: str = "cpu", clock: Clock = time.perf_counter) -> tuple[dict[str, list[float]], str]:
    """(name -> mean seconds per call of its block in each round, why it stopped).

    Each fn is called once untimed first; round r then times one block of every component in an
    order rotated by r. Fixed (enough None): exactly `rounds` rounds (FIXED). Adaptive: `rounds`
    is the minimum; after each further round, enough(per_call) stops it (WIDTH), else max_rounds
    rounds (ROUNDS_CAP) or max_seconds of timed blocks (TIME_CAP) do; the caps never cut below
    `rounds`. Rounds are added whole, so every component gets as many blocks as every other."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    if enough is not None and max_rounds is None and max_seconds is None:
        raise ValueError("adaptive rounds need a cap: max_rounds or max_seconds")
    names = list(blocks)
    for fn, _ in blocks.values():
        fn()  # warm-ups
    per_call: dict[str, list[float]] = {name: [] for name in names}
    timed_s, r = 0.0, 0
    while True:
        s = r % len(names)
        for name in names[s:] + names[:s]:
            fn, reps = blocks[name]
            wall, _ = timed(lambda: [fn() for _ in range(reps)], device, clock)
            per_call[name].append(wall / reps)
            timed_s += wall
        r += 1
        if r < rounds:
            continue
        if enough is None:
            return per_call, FIXED
        if enough(per_call):
            return per_call, WIDTH
        if max_rounds is not None and r >= max_rounds:
            return per_call, ROUNDS_CAP
        if max_seconds is not None and timed_s >= max_seconds:
            return per_call, TIME_CAP


def adaptive(target_width: float | None) -> bool:
    return bool(target_width)  # None or 0: a fixed number of pairs


def stop_reason(ratios: list[float], timed_s: float, pairs: int, target_width: float | None = None,
                max_pairs: int | None = None, max_seconds: float | None = None,
                level: float = 0.95) -> str | None:
    """Why a paired timing with these ratios so far stops now, or None to add a pair.

    Fixed (no target_width): after `pairs` pairs. Adaptive: never before `pairs`; WIDTH once,
    after an even number of pairs, the interval reaches `level` and is at most target_width of
    the median wide; else PAIRS_CAP at max_pairs pairs, TIME_CAP after max_seconds of timed runs."""
    n = len(ratios)
    if n < pairs:
        return None
    if not adaptive(target_width):
        return FIXED
    if n % 2 == 0:
        lo, hi, coverage = median_interval(ratios, level)
        if coverage >= level and (hi - lo) / statistics.median(ratios) <= target_width:
            return WIDTH
    if max_pairs is not None and n >= max_pairs:
        return PAIRS_CAP
    if max_seconds is not None and timed_s >= max_seconds:
        return TIME_CAP
    return None


def _number(name, value, lo, hi=math.inf, open_lo=False) -> None:
    """A SpecsweepError of one sentence unless value is a finite number in range."""
    bad = (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
           or value < lo or (open_lo and value == lo) or value >= hi)
    if bad:
        rng = f"in ({lo}, {hi})" if hi < math.inf else f"{'>' if open_lo else '>='} {lo}"
        raise SpecsweepError(f"timing.{name} must be a number {rng}, got {value!r}")


def _count_or_none(name, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SpecsweepError(f"timing.{name} must be an integer >= 1 or null, got {value!r}")


def _adaptive_options(width_name: str, width, confidence, count_name: str, count, seconds_name: str, seconds):
    """(width or None, level), every setting of an adaptive measurement checked: a width, its
    confidence and its two caps (a count, seconds), one of which an adaptive width needs."""
    if width is not None:
        _number(width_name, width, 0)
    _number("confidence", confidence, 0, 1, open_lo=True)
    _count_or_none(count_name, count)
    if seconds is not None:
        _number(seconds_name, seconds, 0, open_lo=True)
    if adaptive(width) and count is None and seconds is None:
        raise SpecsweepError(f"timing.{width_name} needs a cap: set timing.{count_name} or timing.{seconds_name}")
    return width or None, float(confidence)


def timing_options(target_width=None, confidence=0.95, max_pairs=None, max_seconds=None) -> dict:
    """paired_timing's keyword arguments, each checked (a SpecsweepError of one sentence if bad).
    target_width None or 0: a fixed number of pairs, and the caps are not needed."""
    width, level = _adaptive_options("target_width", target_width, confidence, "max_pairs", max_pairs,
                                     "max_seconds", max_seconds)
    return {"target_width": width, "level": level, "max_pairs": max_pairs, "max_seconds": max_seconds}


def cost_round_options(cost_width=None, confidence=0.95, cost_max_rounds=None, cost_max_seconds=None) -> dict:
    """measure_cost's adaptive-round keyword arguments (width, level, max_rounds, max_seconds), each
    checked as timing_options checks the pairs'. cost_width None or 0: a fixed number of rounds."""
    width, level = _adaptive_options("cost_width", cost_width, confidence, "cost_max_rounds", cost_max_rounds,
                                     "cost_max_seconds", cost_max_seconds)
    return {"width": width, "level": level, "max_rounds": cost_max_rounds, "max_seconds": cost_max_seconds}


@dataclass
class PairedTiming:
    baseline_s: list[float]            # per pair (a workload's: per round, its prompts' runs added up)
    speculative_s: list[float]
    baseline_cpu_ratio: list[float]
    speculative_cpu_ratio: list[float]
    order: list[str]  # "BS" or "SB" per pair (a workload's: its first prompt's order in the round)
    level: float = 0.95                # stated confidence level of the interval for the median
    stop: str = FIXED                  # FIXED, WIDTH, PAIRS_CAP or TIME_CAP
    prompt_baseline_s: list[list[float]] = field(default_factory=list)     # per prompt, its run in each round
    prompt_speculative_s: list[list[float]] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [b / s for b, s in zip(self.baseline_s, self.speculative_s)]

    @property
    def timed_s(self) -> float:
        return sum(self.baseline_s) + sum(self.speculative_s)

    def summary(self) -> dict:
        r = self.ratios
        lo, hi, coverage = median_interval(r, self.level)
        median = statistics.median(r)
        out = {
            "speedup_median": median,
            "speedup_min": min(r),
            "speedup_max": max(r),
            "speedup_range_confidence": confidence_of_range(len(r)),
            "speedup_lo": lo,
            "speedup_hi": hi,
            "speedup_interval_confidence": coverage,
            "interval_rel_width": (hi - lo) / median,
            "pairs_used": len(r),
            "timed_s": self.timed_s,
            "baseline_iqr_rel": _iqr_rel(self.baseline_s),
            "speculative_iqr_rel": _iqr_rel(self.speculative_s),
            "min_cpu_wall_ratio": min(self.baseline_cpu_ratio + self.speculative_cpu_ratio),
            "baseline_s_median": statistics.median(self.baseline_s),
            "speculative_s_median": statistics.median(self.speculative_s),
        }
        if self.stop != FIXED:  # adaptive: did it stop on the width (1) or on a cap (0)
            out["width_reached"] = int(self.stop == WIDTH)
        return out


def _iqr_rel(xs: list[float]) -> float:
    """Interquartile range / median: spread of one arm (> 0.10 warn, > 0.25 unreliable)."""
    if len(xs) < 2:
        return 0.0
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return (q[2] - q[0]) / statistics.median(xs)


def paired_timing(baseline: Callable[[], object], speculative: Callable[[], object], pairs: int,
                  device: str = "cpu", **options) -> PairedTiming:
    """Alternated pairs (B,S / S,B / ...) after one untimed warm-up of each arm, until
    `stop_reason` says stop: exactly `pairs` of them when target_width is None or 0. One
    prompt's `paired_workload_timing` (its keywords)."""
    return paired_workload_timing([baseline], [speculative], pairs, device, **options)


def paired_workload_timing(baselines: list[Callable[[], object]], speculatives: list[Callable[[], object]],
                           pairs: int, device: str = "cpu", *, target_width: float | None = None,
                           max_pairs: int | None = None, max_seconds: float | None = None, level: float = 0.95,
                           clock: Clock = time.perf_counter, cpu_clock: Clock = time.process_time) -> PairedTiming:
    """Paired timing over a workload: baselines[i] and speculatives[i] run prompt i. One untimed
    warm-up of every prompt's arms (each prompt's shapes compiled before any timed run), then
    rounds: round r runs every prompt's two arms back to back, prompt i in the order B,S when
    r + i is even and S,B when odd, so drift lands on both arms of every prompt alike. A round is
    a pair: its baseline and speculative times are its prompts' runs added up (the workload's total
    time, as the field's speedup over a benchmark is total baseline time over total speculative
    time), and rounds stop as pairs do (`stop_reason`). Each prompt's own runs are kept per round
    (prompt_baseline_s, prompt_speculative_s). With one prompt this is plain paired timing."""
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    if not baselines or len(baselines) != len(speculatives):
        raise ValueError(f"a workload needs as many baselines as speculative arms, at least one: got "
                         f"{len(baselines)} and {len(speculatives)}")
    if adaptive(target_width) and max_pairs is None and max_seconds is None:
        raise ValueError("an adaptive paired timing needs a cap: max_pairs or max_seconds")
    for b, s in zip(baselines, speculatives):
        b()
        s()  # untimed warm-ups
    n = len(baselines)
    res = PairedTiming([], [], [], [], [], level=level, prompt_baseline_s=[[] for _ in range(n)],
                       prompt_speculative_s=[[] for _ in range(n)])
    ratios: list[float] = []
    while True:
        r = len(res.order)
        wall = {"B": 0.0, "S": 0.0}
        cpu = {"B": 0.0, "S": 0.0}
        for i in range(n):
            order = "BS" if (r + i) % 2 == 0 else "SB"
            for arm in order:
                w, c = timed(baselines[i] if arm == "B" else speculatives[i], device, clock, cpu_clock)
                (res.prompt_baseline_s if arm == "B" else res.prompt_speculative_s)[i].append(w)
                wall[arm] += w
                cpu[arm] += c * w
        res.baseline_s.append(wall["B"])
        res.speculative_s.append(wall["S"])
        res.baseline_cpu_ratio.append(cpu["B"] / wall["B"] if wall["B"] > 0 else 1.0)
        res.speculative_cpu_ratio.append(cpu["S"] / wall["S"] if wall["S"] > 0 else 1.0)
        res.order.append("BS" if r % 2 == 0 else "SB")
        ratios.append(res.baseline_s[-1] / res.speculative_s[-1])
        stop = stop_reason(ratios, res.timed_s, pairs, target_width, max_pairs, max_seconds, level)
        if stop is not None:
            res.stop = stop
            return res
