"""A sweep over batch sizes is analysed one (engine, batch) regime at a time, and the batch table
puts each draft's best cell against B with its break-even batch. Planted: the same drafts under
time models whose verify pass costs more per char as B grows (as a batched pass stops being
overhead-bound), so the drafts pay at B = 1 and stop paying at larger B."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.figures import speedup_vs_batch
from analysis.sweep_data import Sweep, SweepData
from analysis.regimes import (Regime, batch_table, break_even, break_even_rows, crossing, only_regime, regimes_of,
                              regimes_table, speedup_by_batch, verify_cost_table)
from analysis.report import build_report
from tests.analysis import fixtures as fx

# batch size -> planted time model: the verify pass's cost per drafted char (b) grows with B
TRUTHS = {1: fx.Truth(), 16: fx.Truth(b=0.6), 64: fx.Truth(b=1.5, o_pass=400.0)}


def batch_sweep() -> SweepData:
    frames = []
    for batch, truth in TRUTHS.items():
        trials, pairs = fx.noisy_frames(truth, None)
        trials["engine"], trials["batch"] = "eager", batch
        if batch > 1:   # as analysis.sweep_data labels a batch's cells
            for frame in (trials, pairs):
                frame["draft"] = frame["draft"] + f"@B{batch}"
                frame["run_id"] = frame["run_id"] + f"@B{batch}"
        frames.append((trials, pairs))
    trials = pd.concat([t for t, _ in frames], ignore_index=True)
    pairs = pd.concat([p for _, p in frames], ignore_index=True)
    return SweepData(Sweep("batch", "batch", "parent", "0", fx.START), trials, trials.iloc[0:0][["run_id", "status"]],
                     pairs)


def test_crossing_interpolates_in_log2_b():
    bs = [1, 4, 16, 64]
    # 1.5 at B = 4 and 0.9 at B = 16: 1 is 5/6 of the way from log2 4 = 2 to log2 16 = 4
    assert crossing(bs, [2.0, 1.5, 0.9, 0.5]) == pytest.approx(2 ** (2 + 2 * 5 / 6))
    assert crossing(bs, [2.0, 1.5, 1.2, 1.0]) == math.inf       # pays (>= 1) at every B of the grid
    assert crossing(bs, [0.9, 0.8, 0.7, 0.6]) == 0.5            # below the grid
    point, first, last = break_even(bs, [2.0, 1.5, 0.9, 0.5], [1.8, 1.2, 0.8, 0.4], [2.2, 1.7, 1.1, 0.7])
    assert first <= point <= last and last == pytest.approx(2 ** (4 + 2 * 0.1 / 0.4))


def test_each_batch_size_gets_its_own_fit_and_the_batch_table_its_break_even():
    data = batch_sweep()
    assert regimes_of(data) == [Regime("eager", 1), Regime("eager", 16), Regime("eager", 64)]
    reports = {}
    for regime in regimes_of(data):
        part = only_regime(data, regime)
        assert set(part.finished["batch"]) == {regime.batch}
        reports[regime] = build_report(part, boots=0)
        assert reports[regime].models.fit.b == pytest.approx(TRUTHS[regime.batch].b, rel=1e-3)
    answer = regimes_table({r: rep.cells for r, rep in reports.items()}).df
    assert sorted(zip(answer["draft"], answer["batch"])) == sorted((d, b) for d in fx.DRAFTS for b in TRUTHS)
    table = batch_table(answer).df
    assert list(table["draft"]) == sorted(fx.DRAFTS)
    for _, row in table.iterrows():
        mine = answer[answer["draft"] == row["draft"]].sort_values("batch")
        point, first, last = break_even(mine["batch"].tolist(), mine["speedup"].tolist(), mine["lo"].tolist(),
                                        mine["hi"].tolist())
        assert first <= point <= last
        for b, r in zip(mine["batch"], mine.itertuples()):   # each B's entry is that regime's best cell
            assert row[f"B={b}"].startswith(f"{r.speedup:.2f} [")
    # the planted truths: int4 pays at B = 1 and not at B = 64, so its break-even lies inside the grid
    assert fx.true_speedup("int4", 2, truth=TRUTHS[1]) > 1 > max(fx.true_speedup("int4", k, truth=TRUTHS[64])
                                                                 for k in fx.K)
    int4 = table[table["draft"] == "int4"].iloc[0]["break-even B"]
    assert not int4.startswith(("<", ">")), int4
    assert 1 < float(int4.split(" ")[0]) < 64


def test_the_verify_cost_table_and_the_figure():
    data = batch_sweep()
    vc = verify_cost_table(data.finished).df
    assert list(vc["batch"]) == [1, 16, 64]
    for _, row in vc.iterrows():   # the planted line tv = t1 (1 + b k) at every k
        for k in fx.K:
            assert row[f"k={k}"] == pytest.approx(1 + TRUTHS[row["batch"]].b * k, rel=1e-9)
    reports = {r: build_report(only_regime(data, r), boots=0) for r in regimes_of(data)}
    answer = regimes_table({r: rep.cells for r, rep in reports.items()}).df
    fig = speedup_vs_batch(speedup_by_batch(answer))
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) >= len(fx.DRAFTS)
    assert batch_table(answer[answer["batch"] == 1]) is None   # one batch size: no batch table


def test_a_batched_trials_batch_metric_does_not_shadow_its_param():
    """A batched trial logs `batch` as a param and as a metric: the tidy frame keeps one column
    (the param's), and the regimes come out of it (two columns once made it a frame of names)."""
    from analysis.sweep_data import tidy_runs
    raw = pd.DataFrame({"run_id": ["a", "b"], "status": ["FINISHED"] * 2, "params.draft": ["bigram"] * 2,
                        "params.k": ["2"] * 2, "params.seed": ["0"] * 2, "params.batch": ["1", "16"],
                        "metrics.batch": [1.0, 16.0], "metrics.speedup": [1.2, 0.9]})
    tidy = tidy_runs(raw)
    assert list(tidy.columns).count("batch") == 1 and tidy["batch"].tolist() == [1, 16]
    assert tidy["draft"].tolist() == ["bigram", "bigram@B16"] and tidy["speedup"].tolist() == [1.2, 0.9]
    data = SweepData(Sweep("s", "batch", "run", "1", pd.Timestamp(0)), tidy, pd.DataFrame({"run_id": []}),
                     pd.DataFrame({"run_id": []}))
    assert regimes_of(data) == [Regime("eager", 1), Regime("eager", 16)]


# ---- the break-even batch's interval from the seed bootstrap, on planted sweeps ------------------

PLANTED_CURVE = {1: 1.6, 4: 1.2, 16: 0.8, 64: 0.4}   # linear in log2 B: crosses 1 at B = 8 exactly
LEVEL = 0.95


def planted_break_even(rng, equal_k: int = 3):
    """One planted draft: at each B `equal_k` k of one true speedup (the curve above), 5 seeds of
    4-8 pairs each (seed and pair noise as test_seed_bootstrap's cells). Returns the report's
    break-even row and, from the same data, the percentile interval of the break-even re-estimated in
    each of 2000 seed-bootstrap replicates (the best k chosen anew in each): the negative control."""
    from analysis.aggregate import pooled_speedup
    from analysis.seed_bootstrap import REPS, replicate_medians, seed_groups
    from tests.analysis.test_seed_bootstrap import simulated_cell
    cells, pairs = {}, {}
    for b, centre in PLANTED_CURVE.items():
        p = pd.DataFrame([("d", k, s, r) for k in range(1, equal_k + 1)
                          for s, ratios in enumerate(simulated_cell(rng, centre, pairs=(4, 8))) for r in ratios],
                         columns=["draft", "k", "seed", "ratio"])
        pairs[Regime("eager", b)] = p
        cells[Regime("eager", b)] = pooled_speedup(p, LEVEL).rename(columns={"median": "measured"}).assign(draft_name="d")
    row = break_even_rows(regimes_table(cells, pairs, LEVEL).df).iloc[0]
    boot = np.random.default_rng(0)
    best = np.stack([np.max([replicate_medians(g, REPS, boot) for g in seed_groups(pairs[Regime("eager", b)]).values()],
                            axis=0) for b in PLANTED_CURVE])                                   # (B, R)
    again = np.log2([crossing(list(PLANTED_CURVE), best[:, r].tolist()) for r in range(best.shape[1])])
    return row, 2 ** np.quantile(again, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])


@pytest.mark.slow
def test_the_break_even_intervals_hold_the_planted_break_even():
    """Over 100 planted drafts (3 equal k per B, 5 seeds) the report's break-even range holds the true
    break-even (8) in 100 (98 with another seed; asserted >= 90: 95% nominal, a false alarm needs it
    4 binomial sds low), about 1.4 doublings of B wide; its point's median 9.1 (the best of 3 equal k
    reads high). The percentile interval of the re-estimated break-even (the negative control: about
    0.5 doublings wide, centred on the picked k's upward luck) holds it in 48 (37; asserted < 75).
    Joining pointwise intervals is conservative for a crossing: the chosen cells' pooled intervals
    (no seed stage) held it in 98-100 too, so what this guards is the range's construction (a point
    or a re-estimated percentile interval in its place is caught), not the seed stage."""
    rng = np.random.default_rng(11)
    rows, control = zip(*(planted_break_even(rng) for _ in range(100)))
    held = np.mean([r["first"] <= 8 <= r["last"] for r in rows])
    held_control = np.mean([lo <= 8 <= hi for lo, hi in control])
    assert held >= 0.9 and held_control < 0.75, (held, held_control)
    assert all(r["bs"] == [1, 4, 16, 64] and r["first"] <= r["point"] <= r["last"] for r in rows)
    assert 7 < np.median([r["point"] for r in rows]) < 10
