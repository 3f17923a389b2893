"""The extended model's free-loop form: each trial's loop cost per pass measured (free_pass_us, the
loop replaying its own proposals at no drafting cost), only the draft's in-loop excess fitted.

Planted (analysis_fixtures.py's grid and draft times, int4's raised to about int8's as on the real
sweeps; no noise), written out again here:

    free loop   F = t1 (1 + b k) + O_LOOP + O_LOOP_K k          (measured; not a function of the draft)
    speculative S = P (F + DELTA td) + D td (1 + GAMMA)

a slow draft pays DELTA td more per pass (its first forward after the target's runs cold), which
is not in the (o_pass, gamma) form. The free-loop fit recovers DELTA and GAMMA exactly and predicts
every draft held out exactly. The negative control: the same trials without their free loop, fitted
in the (o_pass, gamma) form, mispredict the cheap draft held out by more than 5%, since the other
two drafts' per-pass excess lands in o_pass.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import analysis_fixtures as fx
from analysis.cost_models import fit_extended, has_free_loop, leave_one_draft_out, predict_trials

O_LOOP, O_LOOP_K = 120.0, 15.0   # us per pass, and per drafted position: the loop's own work
DELTA, GAMMA = 0.3, 0.1
INT4_TD = 1000.0                 # us per drafted char (fixture's int8: 1100)


@pytest.fixture(scope="module")
def trials() -> pd.DataFrame:
    t, _ = fx.noisy_frames(fx.Truth(), None)
    int4 = t["draft"] == "int4"  # as on the real sweeps, both quantized copies cost about a target pass
    t.loc[int4, "draft_char_us"] = INT4_TD
    t["c"] = t["draft_char_us"] / t["target_pass_us"]
    k, td, passes = t["k"].astype(float), t["draft_char_us"], t["target_passes"]
    t["free_pass_us"] = t["verify_pass_us"] + O_LOOP + O_LOOP_K * k
    spec_us = passes * (t["free_pass_us"] + DELTA * td) + t["proposed"] * td * (1 + GAMMA)
    t["speculative_s_median"] = spec_us * 1e-6
    return t


def measured(t: pd.DataFrame) -> pd.Series:
    return t["baseline_s_median"] / t["speculative_s_median"]


def test_the_free_loop_fit_recovers_the_planted_excess_and_measures_o_pass(trials):
    assert has_free_loop(trials)
    fit = fit_extended(trials)
    assert fit.free_loop
    assert fit.delta == pytest.approx(DELTA, rel=1e-6) and fit.gamma == pytest.approx(GAMMA, rel=1e-6)
    assert fit.o_base == pytest.approx(fx.O_BASE, rel=1e-6)
    assert fit.o_pass == pytest.approx(np.median(O_LOOP + O_LOOP_K * trials["k"]))  # measured, not fitted
    np.testing.assert_allclose(fit.predict(trials), measured(trials), rtol=1e-9)


def test_every_draft_held_out_is_predicted_exactly(trials):
    predicted, fits = leave_one_draft_out(trials)
    assert all(f.free_loop for f in fits.values())
    np.testing.assert_allclose(predicted, measured(trials), rtol=1e-6)


def test_negative_control_without_the_free_loop_the_cheap_draft_held_out_is_off(trials):
    old = trials.drop(columns="free_pass_us")
    assert not has_free_loop(old)
    predicted, fits = leave_one_draft_out(old)
    assert not any(f.free_loop for f in fits.values())
    ape = ((predicted - measured(old)).abs() / measured(old))[old["draft"] == "bigram"]
    assert ape.max() > 0.05


def test_a_store_where_some_trials_lack_the_free_loop_uses_the_other_form(trials):
    mixed = trials.copy()
    mixed.loc[mixed.index[0], "free_pass_us"] = np.nan
    assert not fit_extended(mixed).free_loop
    assert predict_trials(trials, boots=0).fit.free_loop
