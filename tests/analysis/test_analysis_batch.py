"""A sweep over batch sizes is analysed one (engine, batch) regime at a time, and the batch table
puts each draft's best cell against B with its break-even batch. Planted: the same drafts under
time models whose verify pass costs more per char as B grows (as a batched pass stops being
overhead-bound), so the drafts pay at B = 1 and stop paying at larger B."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.figures import speedup_vs_batch
from analysis.load import Sweep, SweepData
from analysis.regimes import (Regime, batch_table, break_even, crossing, only_regime, regimes_of, regimes_table,
                              speedup_by_batch, verify_cost_table)
from analysis.report import build_report
from tests.analysis import fixtures as fx

# batch size -> planted time model: the verify pass's cost per drafted char (b) grows with B
TRUTHS = {1: fx.Truth(), 16: fx.Truth(b=0.6), 64: fx.Truth(b=1.5, o_pass=400.0)}


def batch_sweep() -> SweepData:
    frames = []
    for batch, truth in TRUTHS.items():
        trials, pairs = fx.noisy_frames(truth, None)
        trials["engine"], trials["batch"] = "eager", batch
        if batch > 1:   # as analysis.load labels a batch's cells
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
    from analysis.load import tidy_runs
    raw = pd.DataFrame({"run_id": ["a", "b"], "status": ["FINISHED"] * 2, "params.draft": ["bigram"] * 2,
                        "params.k": ["2"] * 2, "params.seed": ["0"] * 2, "params.batch": ["1", "16"],
                        "metrics.batch": [1.0, 16.0], "metrics.speedup": [1.2, 0.9]})
    tidy = tidy_runs(raw)
    assert list(tidy.columns).count("batch") == 1 and tidy["batch"].tolist() == [1, 16]
    assert tidy["draft"].tolist() == ["bigram", "bigram@B16"] and tidy["speedup"].tolist() == [1.2, 0.9]
    data = SweepData(Sweep("s", "batch", "run", "1", pd.Timestamp(0)), tidy, pd.DataFrame({"run_id": []}),
                     pd.DataFrame({"run_id": []}))
    assert regimes_of(data) == [Regime("eager", 1), Regime("eager", 16)]
