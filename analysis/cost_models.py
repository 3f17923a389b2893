"""Cost models: predict a cell's speedup from its counters and component times.

Per trial: n chars generated (= target passes of the baseline), P target passes and D drafted
chars (k per pass) of the speculative run, a per-position acceptance (accepted / tested
positions), cpp chars per pass; component times in microseconds: t1 one 1-char target pass,
tv(k) one (k+1)-char verify pass, td draft time per drafted char; c = td / t1.

a. seed         cpp / (1 + k c)                                   (measured cpp and c)
b. closed form  (1 - a^(k+1)) / ((1 - a) (1 + k c))               (Leviathan et al. Thm 3.8)
   Both count only target passes and draft time, and price a verify pass like a 1-char pass.
c. extended     time of one generation
                    baseline     T_B = n (t1 + o_base)
                    speculative  T_S = P (tv(k) + o_pass) + D td (1 + gamma)
                    tv(k) = t1 (1 + b k)
                predicted speedup = T_B / T_S.
   Four parameters, shared by all drafts, each from a linear least-squares fit across trials:
                    b               tv / t1 - 1 = b k                          (measured verify passes)
                    o_base          T_B - n t1 = n o_base                      (measured baseline medians)
                    o_pass, gamma   T_S - P tv(k) - D td = P o_pass + D td gamma  (speculative medians)
   The time equations are divided by the measured time (relative residuals): each trial then
   weighs by its percentage error, the measure the models are judged by. o_pass + gamma k td
   is the trial's logged overhead_us_per_pass, up to the verify model.
   gamma: a drafted char costs more inside the loop than td, the draft's time measured alone
   (a k-char proposal timed over and over near the prompt). Likely causes, both scaling with the
   draft's own work: between two proposals the target's verify pass runs and evicts the draft's
   weights from the caches, and in the loop the draft attends over a growing context. So the
   excess is a fraction gamma of td per drafted char: a bigram table (td ~ 1 us) pays next to
   nothing, a target-sized draft pays in proportion. The sweeps show this pattern: the bigram
   draft's overhead per pass stays flat in k, a quantized draft's grows with k.
   No constant per-char term sits beside gamma td: on the sweeps it is ~0 where it can be told
   apart (the bigram draft's overhead does not grow with k), and among drafts of about the same
   td (the quantized drafts, which are all that is left when the bigram draft is held out) it
   cannot be told apart from gamma td, so a fit with both is arbitrary there. o_pass and gamma
   are told apart by trials at two or more k (columns P and D td = k P td) or by drafts of
   different td.
   Validated leave-one-draft-out: the parameters are fitted on the other drafts' trials and
   predict the held-out draft's trials from that draft's own counters and component times.
   Least squares is not robust: one trial whose component times were mis-measured (say a
   draft time far from its cell's other seeds) leaves a large residual and can pull o_pass
   and gamma far off, most of all in a leave-one-draft-out fit on two drafts; the fit table's
   'without X' columns show how far the parameters move between folds.

Every model predicts each trial from the trial's own inputs; a cell's prediction is the median
over its seeds, compared with the cell's pooled median speedup by the absolute percentage
error APE = |predicted - measured| / measured.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .load import CELL, KEY

log = logging.getLogger(__name__)

MODELS = {"seed": "seed formula", "closed": "closed form", "extended": "extended (all drafts)",
          "held_out": "extended (draft held out)"}
SEED_INPUTS = ["k", "chars_per_pass", "c"]
CLOSED_INPUTS = ["k", "position_acceptance", "c"]
EXTENDED_INPUTS = ["k", "target_passes", "proposed", "baseline_passes", "target_pass_us", "verify_pass_us",
                   "draft_char_us", "baseline_s_median", "speculative_s_median"]


def seed_formula(t: pd.DataFrame) -> pd.Series:
    return t["chars_per_pass"] / (1 + t["k"] * t["c"])


def expected_chars_per_pass(a: pd.Series, k: pd.Series) -> pd.Series:
    """(1 - a^(k+1)) / (1 - a): chars per pass with i.i.d. per-position acceptance a; k+1 at a = 1."""
    with np.errstate(divide="ignore", invalid="ignore"):
        value = (1 - a ** (k + 1)) / (1 - a)
    return value.where(a < 1, k + 1)


def closed_form(t: pd.DataFrame) -> pd.Series:
    return expected_chars_per_pass(t["position_acceptance"], t["k"]) / (1 + t["k"] * t["c"])


@dataclass(frozen=True)
class Extended:
    b: float        # verify pass cost per extra drafted position, in units of t1
    o_pass: float   # us per speculative pass beyond the verify pass
    gamma: float    # in-loop excess of a drafted char, as a fraction of the draft's own time td
    o_base: float   # us per baseline pass beyond the target pass
    trials: int     # trials the parameters were fitted on

    def times(self, t: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """(T_B, T_S) in microseconds."""
        t1 = t["target_pass_us"]
        baseline = t["baseline_passes"] * (t1 + self.o_base)
        speculative = (t["target_passes"] * (t1 * (1 + self.b * t["k"]) + self.o_pass)
                       + t["proposed"] * t["draft_char_us"] * (1 + self.gamma))
        return baseline, speculative

    def predict(self, t: pd.DataFrame) -> pd.Series:
        baseline, speculative = self.times(t)
        return baseline / speculative


def _lstsq(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, int]:
    solution, _, rank, _ = np.linalg.lstsq(a, y, rcond=None)
    return solution, rank


def fit_extended(t: pd.DataFrame) -> Extended:
    k = t["k"].to_numpy(float)
    t1, td = t["target_pass_us"].to_numpy(float), t["draft_char_us"].to_numpy(float)
    n, passes, drafted = (t[c].to_numpy(float) for c in ("baseline_passes", "target_passes", "proposed"))
    (b,), _ = _lstsq(k[:, None], t["verify_pass_us"].to_numpy(float) / t1 - 1)

    t_base = t["baseline_s_median"].to_numpy(float) * 1e6
    (o_base,), _ = _lstsq((n / t_base)[:, None], (t_base - n * t1) / t_base)

    t_spec = t["speculative_s_median"].to_numpy(float) * 1e6
    left = t_spec - passes * t1 * (1 + b * k) - drafted * td
    (o_pass, gamma), rank = _lstsq(np.column_stack([passes, drafted * td]) / t_spec[:, None], left / t_spec)
    if rank < 2:
        log.warning("the fitted trials span one k and one draft time: the per-pass overhead and the draft's "
                    "in-loop excess cannot be told apart")
    return Extended(float(b), float(o_pass), float(gamma), float(o_base), len(t))


def has_inputs(t: pd.DataFrame, model: str, inputs: list[str]) -> bool:
    missing = [c for c in inputs if c not in t.columns]
    if missing:
        log.warning("%s skipped: the trials lack %s", MODELS[model], ", ".join(missing))
    return not missing and len(t) > 0


def leave_one_draft_out(t: pd.DataFrame) -> tuple[pd.Series, dict[str, Extended]]:
    """Per-trial predictions of each draft's trials by a model fitted without that draft."""
    predicted = pd.Series(np.nan, index=t.index)
    fits = {}
    drafts = sorted(t["draft"].unique())
    if len(drafts) < 2:
        log.warning("one draft only: no leave-one-draft-out validation")
        return predicted, fits
    for draft in drafts:
        held = t["draft"] == draft
        fits[draft] = fit_extended(t[~held])
        predicted[held] = fits[draft].predict(t[held])
    return predicted, fits


@dataclass
class ModelResults:
    trials: pd.DataFrame            # draft, k, seed and one predicted speedup column per model
    fit: Extended | None            # fitted on every finished trial
    held_out: dict[str, Extended]   # draft -> fit without that draft


def predict_trials(finished: pd.DataFrame) -> ModelResults:
    preds, fit, held = {}, None, {}
    if has_inputs(finished, "seed", SEED_INPUTS):
        preds["seed"] = seed_formula(finished)
    if has_inputs(finished, "closed", CLOSED_INPUTS):
        preds["closed"] = closed_form(finished)
    if has_inputs(finished, "extended", EXTENDED_INPUTS):
        fit = fit_extended(finished)
        preds["extended"] = fit.predict(finished)
        preds["held_out"], held = leave_one_draft_out(finished)
    table = finished[KEY].copy()
    for model in MODELS:
        table[f"pred_{model}"] = preds.get(model, np.nan)
    return ModelResults(table, fit, held)


def cell_predictions(trial_preds: pd.DataFrame, speedup: pd.DataFrame) -> pd.DataFrame:
    """draft, k, measured (pooled median), min, max, and per model: pred_<m> and ape_<m> (percent)."""
    preds = trial_preds.groupby(CELL)[[f"pred_{m}" for m in MODELS]].median().reset_index()
    cells = speedup[CELL + ["median", "min", "max"]].rename(columns={"median": "measured"})
    cells = cells.merge(preds, on=CELL, how="outer").sort_values(CELL).reset_index(drop=True)
    for m in MODELS:
        cells[f"ape_{m}"] = (cells[f"pred_{m}"] - cells["measured"]).abs() / cells["measured"] * 100
    return cells


def model_errors(cells: pd.DataFrame) -> pd.DataFrame:
    """Per model: cells compared, median and max APE."""
    rows = []
    for m, label in MODELS.items():
        ape = cells[f"ape_{m}"].dropna()
        rows.append({"model": label, "cells": len(ape), "median APE %": ape.median() if len(ape) else np.nan,
                     "max APE %": ape.max() if len(ape) else np.nan})
    return pd.DataFrame(rows)


def best_k(cells: pd.DataFrame) -> pd.DataFrame:
    """Per draft: the k with the highest measured median speedup, whether it is clear (its [min, max]
    lies above every other k's), and the k each model picks."""
    rows = []
    for draft, g in cells.groupby("draft", sort=True):
        g = g.dropna(subset=["measured"])
        if g.empty:
            continue
        best = g.loc[g["measured"].idxmax()]
        others = g[g["k"] != best["k"]]
        clear = "" if others.empty else "yes" if (others["max"] < best["min"]).all() else "no"
        row = {"draft": draft, "measured best k": int(best["k"]), "measured": best["measured"],
               "min": best["min"], "max": best["max"], "clear": clear}
        for m in MODELS:
            preds = g[f"pred_{m}"].dropna()
            row[f"{m} best k"] = int(g.loc[preds.idxmax(), "k"]) if len(preds) else pd.NA
        rows.append(row)
    return pd.DataFrame(rows)
