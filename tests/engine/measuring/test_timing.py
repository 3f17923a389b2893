"""Adaptive paired timing and interleaved component costs, on planted timers.

Nothing here reads a real clock's value: the arms and components advance a fake clock by
durations drawn from seeded distributions (or planted bursts), and the tests assert counts,
stop reasons and statistical properties of the intervals. The one test on real code
(`test_adaptive_trial_end_to_end`) asserts counts and consistency only, never a time.
"""
from __future__ import annotations

import math
import random
import statistics
import time

import pytest

from src.engine.errors import SpecsweepError
from src.engine.measuring.measure import pass_per_reference
from src.engine.measuring.intervals import relative_width
from src.engine.measuring.timing import (FIXED, PAIRS_CAP, ROUNDS_CAP, TIME_CAP, WIDTH, adaptive_rounds, cost_round_options,
                               interleaved_medians, paired_timing, round_ratio, stop_reason, timed, timing_options)

RATIO = 1.3  # planted: baseline takes 1.3 x the speculative arm's time (before noise)


class FakeClock:
    """A clock that only moves when a planted arm or component says so."""

    def __init__(self):
        self.t = 0.0
        self.calls = 0

    def __call__(self) -> float:
        return self.t


def planted_arms(clock: FakeClock, noise, baseline_s: float = RATIO, speculative_s: float = 1.0):
    """Two arms whose run advances the clock by their time x an independent noise factor. With
    the same noise distribution for both, log(ratio) is symmetric about log(RATIO): the median
    pair ratio is exactly RATIO."""
    def baseline():
        clock.t += baseline_s * noise()

    def speculative():
        clock.t += speculative_s * noise()
    return baseline, speculative


def lognormal(rng: random.Random, sigma: float):
    return lambda: rng.lognormvariate(0.0, sigma)


def heavy_tailed(rng: random.Random):
    """Student-t (3 degrees of freedom) in log space, 30% scale: now and then a run takes
    several times as long (a burst of load), sometimes a fraction."""
    def draw():
        t = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(3)) / 3)
        return math.exp(0.3 * t)
    return draw


def run(noise_seed: int, noise: str, pairs: int = 5, **kw):
    clock, rng = FakeClock(), random.Random(noise_seed)
    draw = lognormal(rng, 0.01) if noise == "low" else heavy_tailed(rng)
    b, s = planted_arms(clock, draw)
    return paired_timing(b, s, pairs, clock=clock, cpu_clock=clock, **kw)


ADAPTIVE = dict(target_width=0.10, max_pairs=24, max_seconds=None, level=0.95)


# (a) low noise: stops at the width, before the cap -----------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_low_noise_stops_at_the_width_before_the_cap(seed):
    t = run(seed, "low", **ADAPTIVE)
    m = t.summary()
    assert t.stop == WIDTH and m["width_reached"] == 1
    assert 5 <= m["pairs_used"] < 24 and m["pairs_used"] % 2 == 0  # as many B,S as S,B
    assert m["pairs_used"] == 6  # the first even count >= 5 whose [min, max] reaches 95% (96.9%)
    assert m["speedup_interval_confidence"] >= 0.95
    assert m["interval_rel_width"] <= 0.10
    assert m["speedup_lo"] <= RATIO <= m["speedup_hi"]
    assert t.order == ["BS", "SB"] * 3


def pairs_csv_rows(timing) -> list[str]:
    from src.sweep.tracking import pairs_csv  # the per-pair artifact a trial logs: one row per pair
    return pairs_csv(timing).strip().splitlines()[1:]


# (b) high noise: stops at a cap --------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_heavy_tailed_noise_stops_at_the_pairs_cap(seed):
    t = run(seed, "heavy", **ADAPTIVE)
    m = t.summary()
    assert t.stop == PAIRS_CAP and m["width_reached"] == 0
    assert m["pairs_used"] == 24 and len(pairs_csv_rows(t)) == 24
    assert m["interval_rel_width"] > 0.10
    assert m["speedup_min"] == min(t.ratios) and m["speedup_max"] == max(t.ratios)  # over all pairs, as before
    assert t.order == ["BS", "SB"] * 12


def test_heavy_tailed_noise_stops_at_the_time_cap():
    t = run(0, "heavy", pairs=2, target_width=0.10, max_pairs=None, max_seconds=20.0)
    m = t.summary()
    assert t.stop == TIME_CAP and m["width_reached"] == 0
    assert m["timed_s"] >= 20.0
    # it stopped at the first pair that crossed 20 s of timed runs
    assert m["timed_s"] - t.baseline_s[-1] - t.speculative_s[-1] < 20.0
    assert m["pairs_used"] == len(t.order) >= 2


def test_caps_never_cut_below_the_minimum():
    t = run(0, "heavy", pairs=9, target_width=0.10, max_pairs=3, max_seconds=0.5)
    assert len(t.ratios) == 9 and t.stop in (PAIRS_CAP, TIME_CAP)


def test_width_is_only_checked_after_an_even_number_of_pairs():
    narrow = [RATIO] * 7
    assert stop_reason(narrow, 0.0, 7, 0.10, 24, None, 0.95) is None      # 7 pairs: not balanced
    assert stop_reason(narrow + [RATIO], 0.0, 7, 0.10, 24, None, 0.95) == WIDTH
    assert stop_reason(narrow[:4], 0.0, 3, 0.10, 24, None, 0.95) is None  # 4 pairs: [min, max] is 87.5% < 95%
    assert stop_reason(narrow[:6], 0.0, 3, 0.10, 24, None, 0.95) == WIDTH


# (c) the order-statistic interval (src/engine/measuring/intervals.py): tests/engine/measuring/test_intervals.py

# (d) Monte-Carlo: the interval covers the true median as often as stated ---------------------

TRIALS = 2000


def test_adaptive_interval_coverage_monte_carlo():
    """The whole adaptive procedure, 2000 planted trials at a noise (5% per run) where it stops
    anywhere between 6 and 24 pairs. Stopping when the interval is narrow (optional stopping)
    costs some coverage: each stopped interval's fixed-n coverage is ~97%, the procedure's is
    ~95% (about 0.950 in 50000 simulated trials at this noise). We require >= the level - 3
    standard errors (0.95 - 0.0146); an implementation whose true coverage is exactly 0.95 fails
    with probability about 0.13% (one-sided normal tail at 3 se) for an arbitrary seed."""
    rng, level = random.Random(7), 0.95
    hits, stops = 0, {WIDTH: 0, PAIRS_CAP: 0}
    for _ in range(TRIALS):
        clock = FakeClock()
        b, s = planted_arms(clock, lognormal(rng, 0.05))
        t = paired_timing(b, s, 5, target_width=0.10, max_pairs=24, level=level, clock=clock, cpu_clock=clock)
        m = t.summary()
        hits += m["speedup_lo"] <= RATIO <= m["speedup_hi"]
        stops[t.stop] += 1
    se = math.sqrt(level * (1 - level) / TRIALS)
    assert hits / TRIALS >= level - 3 * se, hits / TRIALS
    assert stops[WIDTH] > 0.5 * TRIALS and stops[PAIRS_CAP] > 0  # both ways of stopping were exercised


# (e) target_width null: exactly `pairs` pairs, as before -------------------------------------

@pytest.mark.parametrize("pairs", [1, 2, 5, 7])
@pytest.mark.parametrize("width", [None, 0])
def test_no_target_width_gives_exactly_pairs_pairs(pairs, width):
    for noise in ("low", "heavy"):
        t = run(3, noise, pairs=pairs, target_width=width, max_pairs=24, max_seconds=1.0)
        m = t.summary()
        assert t.stop == FIXED and m["pairs_used"] == len(t.ratios) == pairs
        assert t.order == (["BS", "SB"] * pairs)[:pairs]
        assert "width_reached" not in m  # no width was asked for
        assert m["speedup_range_confidence"] == 1 - 2 * 0.5 ** pairs


def test_options_checked_and_absent_keys_mean_fixed():
    assert timing_options() == {"target_width": None, "level": 0.95, "max_pairs": None, "max_seconds": None}
    assert timing_options(0)["target_width"] is None
    for kw, message in [(dict(target_width=-0.1), "timing.target_width must be a number >= 0"),
                        (dict(confidence=1.0), "timing.confidence must be a number in (0, 1)"),
                        (dict(target_width=0.1, max_pairs=0), "timing.max_pairs must be an integer >= 1"),
                        (dict(target_width=0.1, max_seconds=0), "timing.max_seconds must be a number > 0"),
                        (dict(target_width=0.1), "timing.target_width needs a cap")]:
        with pytest.raises(SpecsweepError, match=message.replace("(", r"\(").replace(")", r"\)")):
            timing_options(**kw)


# Interleaved component costs ----------------------------------------------------------------

COSTS = {"target": 1.0, "verify": 2.0, "draft": 3.0}  # planted seconds per call
BURST = 7  # a burst of load: these many consecutive calls take 10x as long


def planted_components(clock: FakeClock, burst_start: int):
    def component(cost):
        def call():
            slow = burst_start <= clock.calls < burst_start + BURST
            clock.calls += 1
            clock.t += cost * (10 if slow else 1)
        return call
    return {name: component(cost) for name, cost in COSTS.items()}


def median_time(fn, reps: int, repeats: int = 7, device: str = "cpu", clock=time.perf_counter) -> float:
    """The old way, kept as the control here: median over `repeats` of the mean seconds per call over `reps` calls (one component alone)."""
    fn()  # warm-up
    per_call = []
    for _ in range(repeats):
        wall, _ = timed(lambda: [fn() for _ in range(reps)], device, clock)
        per_call.append(wall / reps)
    return statistics.median(per_call)



def test_interleaved_rounds_spread_a_burst_over_components():
    """Wherever a burst of 7 calls lands, interleaved rounds (rotating order, 1 call per block,
    7 rounds) hit each component in at most 3 of its 7 rounds: every median is the planted cost.
    Timed one component after the other (the old way), a burst that lands on one component's
    7 repeats moves its median 10x."""
    for start in range(3 + 3 * 7):
        clock = FakeClock()
        fns = planted_components(clock, start)
        got = interleaved_medians({name: (fn, 1) for name, fn in fns.items()}, rounds=7, clock=clock)
        assert got == COSTS, start
    clock = FakeClock()
    fns = planted_components(clock, 9)  # after target's warm-up + 7 repeats and verify's warm-up
    sequential = {name: median_time(fn, 1, 7, clock=clock) for name, fn in fns.items()}
    assert sequential["target"] == COSTS["target"] and sequential["draft"] == COSTS["draft"]
    assert sequential["verify"] == 10 * COSTS["verify"]  # the whole burst on one component


def test_a_ratio_within_rounds_holds_where_the_ratio_of_medians_does_not():
    """The machine runs fast in rounds 0-3 and half as fast in rounds 4-6, and a burst (10x) hits
    component A in two fast rounds: A's median comes from a slow round, B's from a fast one, so
    the ratio of the medians is 2x off (negative control); the median of the per-round ratios is
    the planted 3."""
    speed = [1, 1, 1, 1, 2, 2, 2]
    a = [3.0 * s * (10 if r in (0, 1) else 1) for r, s in enumerate(speed)]
    b = [1.0 * s for s in speed]
    assert round_ratio(a, b) == 3.0
    assert statistics.median(a) / statistics.median(b) == 6.0
    with pytest.raises(ValueError):
        round_ratio(a, b[:-1])


def test_interleaved_rounds_rotate_the_order():
    order = []
    blocks = {name: ((lambda name=name: order.append(name)), 1) for name in "ABC"}
    interleaved_medians(blocks, rounds=4, clock=FakeClock())
    assert order == list("ABC") + list("ABC" "BCA" "CAB" "ABC")  # warm-ups, then rotating rounds


# On real code: counts and consistency only ---------------------------------------------------


# Adaptive cost rounds -------------------------------------------------------------------------

def planted_rounds(clock: FakeClock, noise):
    """Two components, A at 1 s a call and B at 3 s, each call x an independent noise factor:
    the per-round ratio B / A has median 3 and a spread set by the noise."""
    def component(cost):
        def call():
            clock.t += cost * noise()
        return call
    return {"A": (component(1.0), 1), "B": (component(3.0), 1)}


def ratio_width(per_call, level=0.95):
    return relative_width([b / a for a, b in zip(per_call["A"], per_call["B"])], level)


@pytest.mark.parametrize("seed", range(5))
def test_adaptive_rounds_stop_at_the_first_round_the_width_is_reached(seed):
    """Noise (lognormal, 5% a call) that needs more than the minimum of 7 rounds for a 10%
    interval: the rounds stop at the first round where the width test passes, never earlier and
    never later, and every component has a block in every round."""
    clock = FakeClock()
    enough = lambda pc: ratio_width(pc) <= 0.10  # noqa: E731
    per_call, stop = adaptive_rounds(planted_rounds(clock, lognormal(random.Random(seed), 0.05)), rounds=7,
                                     enough=enough, max_rounds=200, clock=clock)
    n = len(per_call["A"])
    assert stop == WIDTH and len(per_call["B"]) == n and n > 7  # (12-17 rounds at these seeds)
    assert ratio_width(per_call) <= 0.10
    assert all(ratio_width({name: v[:m] for name, v in per_call.items()}) > 0.10 for m in range(7, n))


def test_adaptive_rounds_stop_at_a_cap_when_the_width_cannot_be_reached():
    """Heavy-tailed noise and a 1% width: the rounds stop at max_rounds exactly (ROUNDS_CAP), or
    at the first round whose timed blocks pass max_seconds (TIME_CAP), and say which."""
    enough = lambda pc: ratio_width(pc) <= 0.01  # noqa: E731
    clock = FakeClock()
    per_call, stop = adaptive_rounds(planted_rounds(clock, heavy_tailed(random.Random(3))), rounds=7,
                                     enough=enough, max_rounds=12, clock=clock)
    assert stop == ROUNDS_CAP and len(per_call["A"]) == len(per_call["B"]) == 12
    clock = FakeClock()
    per_call, stop = adaptive_rounds(planted_rounds(clock, heavy_tailed(random.Random(3))), rounds=7,
                                     enough=enough, max_rounds=1000, max_seconds=100.0, clock=clock)
    timed = [a + b for a, b in zip(per_call["A"], per_call["B"])]  # 1 call a block: seconds per round
    assert stop == TIME_CAP and sum(timed) >= 100.0 > sum(timed[:-1])
    # the caps never cut below the minimum
    clock = FakeClock()
    per_call, stop = adaptive_rounds(planted_rounds(clock, heavy_tailed(random.Random(3))), rounds=7,
                                     enough=enough, max_rounds=2, max_seconds=1e-9, clock=clock)
    assert len(per_call["A"]) == 7 and stop in (ROUNDS_CAP, TIME_CAP)


def test_fixed_rounds_and_bad_arguments():
    clock = FakeClock()
    per_call, stop = adaptive_rounds(planted_rounds(clock, heavy_tailed(random.Random(0))), rounds=5, clock=clock)
    assert stop == FIXED and len(per_call["A"]) == 5
    with pytest.raises(ValueError, match="need a cap"):
        adaptive_rounds(planted_rounds(clock, lambda: 1.0), enough=lambda pc: True, clock=clock)
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        adaptive_rounds(planted_rounds(clock, lambda: 1.0), rounds=0, clock=clock)
    assert cost_round_options() == {"width": None, "level": 0.95, "max_rounds": None, "max_seconds": None}
    assert cost_round_options(0.05, 0.9, 21, None) == {"width": 0.05, "level": 0.9, "max_rounds": 21,
                                                      "max_seconds": None}
    for kw, message in [(dict(cost_width=-1), "timing.cost_width must be a number >= 0"),
                        (dict(cost_width=0.05, cost_max_rounds=1.5), "timing.cost_max_rounds must be an integer"),
                        (dict(cost_width=0.05, cost_max_seconds=0), "timing.cost_max_seconds must be a number > 0"),
                        (dict(cost_width=0.05), "timing.cost_width needs a cap")]:
        with pytest.raises(SpecsweepError, match=message):
            cost_round_options(**kw)


def test_pass_per_reference_adds_the_components_per_round():
    """Per round: (free loop per pass + one proposal) / (baseline loop per pass), from the blocks'
    seconds per call; without loops, (verify pass + one proposal) / target pass."""
    per_call = {"target": [1.0, 2.0], "verify": [1.5, 3.0], "draft": [0.5, 2.0],
                "free loop": [20.0, 30.0], "base loop": [100.0, 300.0]}
    loops = {"free": (None, 10), "base": (None, 100)}
    assert pass_per_reference(per_call, loops) == [(2.0 + 0.5) / 1.0, (3.0 + 2.0) / 3.0]
    assert pass_per_reference(per_call, {}) == [(1.5 + 0.5) / 1.0, (3.0 + 2.0) / 2.0]


