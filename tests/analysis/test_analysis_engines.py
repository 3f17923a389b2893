"""A sweep over engines is analysed one engine at a time: each engine's cost model (its
verify-cost line b, its loop overheads) is fitted on its own trials, and the regimes table gives
each draft's best cell per engine. Planted: the same drafts under two time models."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.cost_models import fit_extended
from analysis.sweep_data import Sweep, SweepData
from analysis.regimes import Regime, only_regime, regimes_of, regimes_table
from analysis.report import build_report
from tests.analysis import fixtures as fx

EAGER = fx.Truth()                                    # a verify pass nearly free: b = 0.05
FAST = fx.Truth(b=0.25, o_pass=40.0, o_base=10.0)     # a fast engine: the verify pass costs more per char


def two_engines() -> SweepData:
    frames = []
    for engine, truth in (("eager", EAGER), ("onnx", FAST)):
        trials, pairs = fx.noisy_frames(truth, None)
        trials["engine"] = engine
        if engine != "eager":   # as analysis.sweep_data labels another engine's cells
            for frame in (trials, pairs):
                frame["draft"] = frame["draft"] + "@" + engine
                frame["run_id"] = frame["run_id"] + "@" + engine
        frames.append((trials, pairs))
    trials = pd.concat([t for t, _ in frames], ignore_index=True)
    pairs = pd.concat([p for _, p in frames], ignore_index=True)
    return SweepData(Sweep("engines", "engines", "parent", "0", fx.START), trials,
                     trials.iloc[0:0][["run_id", "status"]], pairs)


def test_each_engine_gets_its_own_fit():
    data = two_engines()
    assert regimes_of(data) == [Regime("eager", 1), Regime("onnx", 1)]
    for engine, truth in (("eager", EAGER), ("onnx", FAST)):
        part = only_regime(data, Regime(engine, 1))
        assert set(part.finished["engine"]) == {engine} and set(part.pairs["run_id"]) <= set(part.trials["run_id"])
        fit = build_report(part, boots=0).models.fit
        assert fit.b == pytest.approx(truth.b, rel=1e-3) and fit.o_base == pytest.approx(truth.o_base, rel=1e-3)
        fast = part.finished
        own = (build_report(part, boots=0).models.fit.predict(fast) / fast["speedup_median"] - 1).abs()
        assert own.max() < 0.01   # within the planted pairs' scatter (their ratios' median is not the truth to 1e-3)
    # the negative control: one fit over both regimes mispredicts the fast engine's trials
    joint = fit_extended(data.finished)
    fast = only_regime(data, Regime("onnx", 1)).finished
    assert (joint.predict(fast) / fast["speedup_median"] - 1).abs().max() > 0.05


def test_the_regimes_table_has_each_draft_on_each_engine():
    data = two_engines()
    reports = {r: build_report(only_regime(data, r), boots=0) for r in regimes_of(data)}
    table = regimes_table({r: rep.cells for r, rep in reports.items()}).df
    assert sorted(zip(table["engine"], table["draft"])) == sorted(
        (e, d) for e in ("eager", "onnx") for d in fx.DRAFTS)
    for _, row in table.iterrows():
        cells = reports[Regime(row["engine"], row["batch"])].cells
        mine = cells[cells["draft"].str.split("@").str[0] == row["draft"]]
        assert row["speedup"] == mine["measured"].max()          # its best measured k
        assert row["verdict"] == ("pays" if row["lo"] > 1 else "slower" if row["hi"] < 1 else "not demonstrated")
