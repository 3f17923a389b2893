"""The extended model's free-loop form: each trial's loops measured with its components (free_pass_us,
the loop replaying its own proposals at no drafting cost; base_pass_us, the baseline loop), only
the draft's in-loop excess fitted, on the ratio of the paired arms; the loops and the draft time
enter in units of the baseline loop's pass (free_per_base, draft_per_base).

Planted (analysis_fixtures.py's grid and draft times, int4's raised to about int8's as on the real
sweeps; no noise), written out again here, at the speed of the cost rounds:

    free loop   F   = t1 (1 + b k) + O_LOOP + O_LOOP_K k          (not a function of the draft)
    base loop   F_B = t1 + O_BASE
    speculative S   = P (F + DELTA td) + D td (1 + GAMMA),  baseline B = n F_B

a slow draft pays DELTA td more per pass (its first forward after the target's runs cold), which
is not in the (o_pass, gamma) form. The pairs of trial i ran at another speed: their medians are
B and S times SPEED[i] (the ratio B / S holds). The free-loop fit recovers DELTA and GAMMA exactly
and predicts every draft held out exactly. Negative controls: the same trials without their
loops, fitted in the (o_pass, gamma) form, mispredict the cheap draft held out by more than 5%
(the other two drafts' per-pass excess lands in o_pass), and the free-loop fit on the pairs'
absolute times instead of their ratio (no speed change planted: exact) is thrown off by it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.analysis import fixtures as fx
from analysis.cost_models import LOOP_TIMES as LOOPS
from analysis.cost_models import fit_extended, has_free_loop, leave_one_draft_out, predict_trials

O_LOOP, O_LOOP_K = 120.0, 15.0   # us per pass, and per drafted position: the loop's own work
DELTA, GAMMA = 0.3, 0.1
INT4_TD = 1000.0                 # us per drafted char (fixture's int8: 1100)


def planted(speed_change: bool) -> pd.DataFrame:
    t, _ = fx.noisy_frames(fx.Truth(), None)
    int4 = t["draft"] == "int4"  # as on the real sweeps, both quantized copies cost about a target pass
    t.loc[int4, "draft_char_us"] = INT4_TD
    t["c"] = t["draft_char_us"] / t["target_pass_us"]
    k, td, passes = t["k"].astype(float), t["draft_char_us"], t["target_passes"]
    t["free_pass_us"] = t["verify_pass_us"] + O_LOOP + O_LOOP_K * k
    t["base_pass_us"] = t["target_pass_us"] + fx.O_BASE
    t["free_per_base"], t["draft_per_base"] = t["free_pass_us"] / t["base_pass_us"], td / t["base_pass_us"]
    spec_us = passes * (t["free_pass_us"] + DELTA * td) + t["proposed"] * td * (1 + GAMMA)
    # the pairs' speed against the cost rounds', per trial
    speed = np.random.default_rng(0).uniform(0.75, 1.3, len(t)) if speed_change else 1.0
    t["speculative_s_median"] = spec_us * 1e-6 * speed
    t["baseline_s_median"] = t["baseline_passes"] * t["base_pass_us"] * 1e-6 * speed
    return t


@pytest.fixture(scope="module")
def trials() -> pd.DataFrame:
    return planted(speed_change=True)


def measured(t: pd.DataFrame) -> pd.Series:
    return t["baseline_s_median"] / t["speculative_s_median"]


def test_the_free_loop_fit_recovers_the_planted_excess_and_measures_the_overheads(trials):
    assert has_free_loop(trials)
    fit = fit_extended(trials)
    assert fit.free_loop
    assert fit.delta == pytest.approx(DELTA, rel=1e-6) and fit.gamma == pytest.approx(GAMMA, rel=1e-6)
    assert fit.o_base == pytest.approx(fx.O_BASE, rel=1e-6)                          # measured, not fitted
    assert fit.o_pass == pytest.approx(np.median(O_LOOP + O_LOOP_K * trials["k"]))  # measured, not fitted
    np.testing.assert_allclose(fit.predict(trials), measured(trials), rtol=1e-9)


def test_every_draft_held_out_is_predicted_exactly(trials):
    predicted, fits = leave_one_draft_out(trials)
    assert all(f.free_loop for f in fits.values())
    np.testing.assert_allclose(predicted, measured(trials), rtol=1e-6)


def test_negative_control_without_the_loops_the_cheap_draft_held_out_is_off():
    old = planted(speed_change=False).drop(columns=LOOPS)  # no speed change to blame
    assert not has_free_loop(old)
    predicted, fits = leave_one_draft_out(old)
    assert not any(f.free_loop for f in fits.values())
    ape = ((predicted - measured(old)).abs() / measured(old))[old["draft"] == "bigram"]
    assert ape.max() > 0.05


def test_negative_control_fitted_on_absolute_times_a_speed_change_throws_the_fit_off(trials):
    """The same fit on T_S itself rather than on the ratio's implied T_S*: exact without the speed
    change, off with it."""
    def absolute_fit(t):
        passes, drafted, td = t["target_passes"], t["proposed"], t["draft_char_us"]
        t_spec = t["speculative_s_median"] * 1e6  # its absolute time, against the cost rounds' F and td
        design = np.column_stack([passes * td, drafted * td]) / t_spec.to_numpy()[:, None]
        return np.linalg.lstsq(design, ((t_spec - passes * t["free_pass_us"] - drafted * td) / t_spec).to_numpy(),
                               rcond=None)[0]
    assert absolute_fit(planted(speed_change=False)) == pytest.approx([DELTA, GAMMA], rel=1e-6)
    assert absolute_fit(trials) != pytest.approx([DELTA, GAMMA], rel=0.5)


def test_a_store_where_some_trials_lack_the_loops_uses_the_other_form(trials):
    mixed = trials.copy()
    mixed.loc[mixed.index[0], "free_per_base"] = np.nan
    assert not fit_extended(mixed).free_loop
    assert predict_trials(trials, boots=0).fit.free_loop


def test_a_draft_without_the_loops_held_out_is_predicted_in_the_other_form(trials):
    tree = trials[trials["draft"] == "int4"].assign(draft="bigram+tree", **{c: np.nan for c in LOOPS})
    both = pd.concat([trials, tree], ignore_index=True)
    predicted, fits = leave_one_draft_out(both)
    assert not fits["bigram+tree"].free_loop and not fits["bigram"].free_loop  # each fold sees a tree trial
    assert predicted.notna().all()
    assert predict_trials(both, boots=2).intervals[["held_lo", "held_hi"]].notna().all().all()


def test_the_fit_table_shows_delta_and_says_which_overheads_are_measured(trials):
    from analysis.tables import fit_table
    table = fit_table(predict_trials(trials, boots=0))
    rows = table.df.set_index("parameter")
    assert rows.loc["delta", "all drafts"] == pytest.approx(DELTA, rel=1e-6)
    assert "measured" in rows.loc["o_pass", "meaning"] and "measured" in rows.loc["o_base", "meaning"]
    assert "T_B = n F_B" in table.note
    old = fit_table(predict_trials(planted(False).drop(columns=LOOPS), boots=0))
    assert "delta" not in set(old.df["parameter"]) and "T_B = n (t1 + o_base)" in old.note
