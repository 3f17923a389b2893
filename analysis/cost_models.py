"""Cost models: predict a cell's speedup from its counters and component times.

Per trial: n chars generated (= target passes of the baseline), P target passes and D drafted
chars (k per pass) of the speculative run, a per-position acceptance (accepted / tested
positions), cpp chars per pass; component times in microseconds: t1 one 1-char target pass,
tv(k) one (k+1)-char verify pass, td draft time per drafted char; c = td / t1.

a. seed         cpp / (1 + k c)                                   (measured cpp and c)
b. closed form  (1 - a^(n+1)) / ((1 - a) (1 + n c)), n = k        (Leviathan et al. Thm 3.8;
                or under a policy its mean drafted length, as in a.)
   Both count only target passes and draft time, and price a verify pass like a 1-char pass.
c. extended     time of one generation
                    baseline     T_B = n (t1 + o_base)
                    speculative  T_S = P (tv(k) + o_pass) + D td (1 + gamma)
                    tv(k) = t1 (1 + b k)
                predicted speedup = T_B / T_S.
   For a tree, k in tv(k) is the tree's node count (a verify pass scores every node; metric
   `tree_nodes`) and D counts the drafted nodes.
   Four parameters, shared by all drafts, from three fits across trials, each linear in its
   parameters (the bounds and the loss are below):
                    b               tv - t1 = t1 b k                           (measured verify passes)
                    o_base          T_B - n t1 = n o_base                      (measured baseline medians)
                    o_pass, gamma   T_S - P tv(k) - D td = P o_pass + D td gamma  (speculative medians)
   Each equation is divided by its measured time (tv, T_B, T_S: relative residuals): each trial
   then weighs by its percentage error, the measure the models are judged by. o_pass + gamma k td
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
   The free-loop form, used where every fitted trial measured its loops (LOOP_TIMES; chains with
   timing.free_loop, the default), timed in the same interleaved rounds as t1, tv and td:
   free_pass_us F, the speculative loop replaying the trial's own proposals at no drafting cost
   (src/engine/measuring/replay.py: the verify pass as it runs in the loop plus the loop's own work), and
   base_pass_us F_B, the baseline loop per char. The model takes its times in units of F_B, each
   ratio taken within a cost round and then the median over rounds (free_per_base f = F / F_B,
   draft_per_base d = td / F_B), as a pair's ratio is taken within the pair:
                    baseline     T_B = n
                    speculative  T_S = P (f + delta d) + D d (1 + gamma)
   The loops' overheads are measured, not fitted (Extended.o_pass and o_base report the medians of
   F - tv and F_B - t1 over the fitted trials). Only the draft's in-loop excess is fitted, linear
   in delta (per pass: a draft's first forward of a pass runs after the target's and finds the
   caches cold) and gamma (per drafted char), each a fraction of td, from the measured ratio:
                    delta, gamma    T_S* - P f - D d = P d delta + D d gamma,
                                    T_S* = n (speculative_s_median / baseline_s_median)
   T_S* is the speculative time the pairs' ratio implies. No absolute time enters: on a machine
   whose speed changes from round to round and between the cost rounds and the pairs (on the
   shared 2-core VM of the noisy-machine benchmark a one-char target pass measured 1,370-2,674
   us across the trials of one quiet sweep), ratios taken at one moment hold and absolute times
   do not. Both fitted terms vanish with td, so a cheap draft held out is predicted from its own
   measurements alone. In the (o_pass, gamma) form the fold without the bigram draft, left with
   two drafts of about the same td, cannot tell o_pass from a per-pass cost proportional to td:
   on a real 2-seed slice it fitted o_pass = 1,097 us against 352 us with the bigram, and
   mispredicted the bigram by up to 43%. tests/analysis/test_analysis_free_loop.py plants that case.
   Trials without the loop times (trees, timing.free_loop=false, older stores) are fitted in
   the (o_pass, gamma) form; a fit takes the free-loop form only where all its trials have them
   (`has_free_loop`) and, in the held-out folds, the predicted trials too (`free_form`).
   Validated leave-one-draft-out: the parameters are fitted on the other drafts' trials and
   predict the held-out draft's trials from that draft's own counters and component times.
   And fitted on the seed's drafts only (PAPER_DRAFTS), predicting every other draft: the
   "paper" model, whose error on the new drafts is reported apart (model_errors).
   The fit is bounded and robust (fit_extended(t), robust=True). Bounded: every parameter is
   >= 0, which is physics (a verify pass never costs less than a 1-char pass, overheads and the
   in-loop excess are not negative); on a noisy machine an unbounded fit returned o_base = -95 us
   and gamma = -0.07. Robust: each of the three equations minimises sum_i rho((r_i / F_SCALE)^2)
   with the soft-L1 loss rho(z) = 2 (sqrt(1 + z) - 1) on the relative residuals r_i, scale
   F_SCALE = 0.01 (1% of the measured time): a residual below ~1% counts as in least squares, a
   larger one only linearly, so one mis-measured trial (say a draft time far from its cell's
   other seeds, which leaves a residual of tens of percent) cannot drag o_pass and gamma along.
   (scipy.optimize.least_squares, trf, started from the bounded linear least-squares solution;
   scipy comes with mlflow.) fit_extended(t, robust=False) is the plain, unbounded linear least
   squares, kept as the negative control and shown beside the robust fit in the fit table.
   Outlying trials are also flagged (flag_outliers): a trial whose component time (target pass,
   verify pass, draft time per char, overhead per pass) lies more than OUTLIER_Z = 5 robust
   standard deviations from its cell's median, the robust standard deviation being
   1.4826 MAD over the cell's seeds, floored at MAD_FLOOR = 2% of the cell's median (of the
   verify pass for the overhead, which can be near 0) so that seeds that agree to the
   microsecond do not flag every small difference. A cell needs three seeds to flag anything.
   Flagged trials are not dropped: they are listed, and the parameters are fitted again without
   them to show how far they moved the fit.
   The spread of a cell's prediction over the fits (all drafts, and each leave-one-draft-out
   fold) is its model interval [pred_extended_lo, pred_extended_hi]: not a confidence interval,
   but how far the prediction moves when a whole draft is left out of the fit.
   Each held-out cell also gets a bootstrap interval [held_lo, held_hi] (held_out_intervals):
   its prediction refitted BOOTSTRAP times, each time on a resample of the other drafts' trials
   drawn with replacement within each draft (every draft stays in every refit), the central
   BOOT_LEVEL of those predictions. It is how far the fold's own measurement noise moves the
   held-out prediction: where the remaining drafts barely tell o_pass from gamma (two drafts of
   about the same td), the refits trade one for the other and the interval is wide, and the
   report says so (the share of held-out cells whose measured speedup lies inside it, and the
   median width) instead of presenting the point prediction as if it were determined.

Every model predicts each trial from the trial's own inputs; a cell's prediction is the median
over its seeds, compared with the cell's pooled median speedup by the absolute percentage
error APE = |predicted - measured| / measured.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear

from src.engine.measuring.formula import iid_chars_per_pass, seed_speedup

from .sweep_data import CELL, KEY
from .seed_bootstrap import best_gain_interval, seed_groups

log = logging.getLogger(__name__)

MODELS = {"seed": "seed formula", "closed": "closed form", "extended": "extended (all drafts)",
          "held_out": "extended (draft held out)", "paper": "extended (paper drafts' fit)"}
# The seed study's drafts: the "paper" model is the extended model fitted on their trials alone, so
# every other draft's cells are predicted by a fit that never saw them (the drafts issue's test).
PAPER_DRAFTS = ("bigram", "int8", "int4")
SEED_INPUTS = ["k", "chars_per_pass", "c"]
CLOSED_INPUTS = ["k", "position_acceptance", "c"]
EXTENDED_INPUTS = ["k", "target_passes", "proposed", "baseline_passes", "target_pass_us", "verify_pass_us",
                   "draft_char_us", "baseline_s_median", "speculative_s_median"]
PARAMS = ["b", "o_pass", "gamma", "o_base"]  # the (o_pass, gamma) form; the free-loop form adds delta

F_SCALE = 0.01      # soft-L1 scale of the relative residuals: 1% of the measured time
OUTLIER_Z = 5.0     # flag |x - cell median| > OUTLIER_Z robust standard deviations
MAD_TO_SD = 1.4826  # MAD -> standard deviation of a normal distribution
MAD_FLOOR = 0.02    # the robust standard deviation is at least 2% of the reference median
BOOTSTRAP = 100     # refits per held-out fold for its bootstrap interval
BOOT_LEVEL = 0.95   # central share of the refits' predictions the interval spans
BOOT_SEED = 0       # the resamples are seeded: a report is reproducible
# component time -> the column whose cell median sets the floor of its robust standard deviation
COMPONENTS = {"target_pass_us": "target_pass_us", "verify_pass_us": "verify_pass_us",
              "draft_char_us": "draft_char_us", "overhead_us_per_pass": "verify_pass_us"}


def seed_formula(t: pd.DataFrame) -> pd.Series:
    return seed_speedup(t["chars_per_pass"], drafted_per_pass(t), t["c"])


def drafted_per_pass(t: pd.DataFrame) -> pd.Series:
    """Chars a pass drafts: k, or under an adaptive draft-length policy (k its cap) the trial's
    mean (metric `drafted_mean`)."""
    k = t["k"].astype(float)
    return t["drafted_mean"].astype(float).fillna(k) if "drafted_mean" in t else k


def closed_form(t: pd.DataFrame) -> pd.Series:
    """The i.i.d. closed form at the drafted length n (k, or a policy's mean drafted length):
    (1 - a^(n+1)) / ((1 - a)(1 + n c))."""
    n = drafted_per_pass(t)
    return seed_speedup(iid_chars_per_pass(t["position_acceptance"].astype(float), n), n, t["c"])


@dataclass(frozen=True)
class Extended:
    b: float        # verify pass cost per extra drafted position, in units of t1
    o_pass: float   # us per speculative pass beyond the verify pass (free_loop: the trials' measured
                    # median of free_pass_us - verify_pass_us, not a fitted parameter)
    gamma: float    # in-loop excess of a drafted char, as a fraction of the draft's own time td
    o_base: float   # us per baseline pass beyond the target pass (free_loop: the trials' measured
                    # median of base_pass_us - target_pass_us)
    trials: int     # trials the parameters were fitted on
    robust: bool = True  # bounded soft-L1 fit; False: plain unbounded least squares
    delta: float = 0.0   # free_loop: in-loop excess per pass, as a fraction of td (0 otherwise)
    free_loop: bool = False  # T_B and T_S from each trial's measured loops (base_pass_us, free_pass_us)

    def times(self, t: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
        """(T_B, T_S) in microseconds; in the free-loop form in units of the baseline loop's pass."""
        t1, td, passes = t["target_pass_us"], t["draft_char_us"], t["target_passes"]
        if self.free_loop:  # in units of the baseline loop's pass (the per-round ratios)
            td = t["draft_per_base"]
            return (t["baseline_passes"].astype(float),
                    passes * (t["free_per_base"] + self.delta * td) + t["proposed"] * td * (1 + self.gamma))
        drafting = t["proposed"] * td * (1 + self.gamma)
        baseline = t["baseline_passes"] * (t1 + self.o_base)
        return baseline, passes * (t1 * (1 + self.b * verify_nodes(t)) + self.o_pass) + drafting

    def predict(self, t: pd.DataFrame) -> pd.Series:
        baseline, speculative = self.times(t)
        return baseline / speculative


def verify_nodes(t: pd.DataFrame) -> pd.Series:
    """Drafted positions a verify pass scores beyond the last committed char: k for a chain (an
    adaptive policy's mean drafted length: the verify cost is linear in it), the tree's node count
    for a tree (metric `tree_nodes`; trials that predate it are chains)."""
    chain = drafted_per_pass(t)
    if "tree_nodes" not in t:
        return chain
    return t["tree_nodes"].astype(float).fillna(chain)


def _rank(a: np.ndarray) -> int:
    """Rank of the design matrix with its columns scaled to unit length (the columns differ by ~1e3)."""
    norms = np.linalg.norm(a, axis=0)
    return int(np.linalg.matrix_rank(a / np.where(norms > 0, norms, 1.0)))


def _solve(a: np.ndarray, y: np.ndarray, robust: bool) -> np.ndarray:
    """x minimising the residuals a x - y: plain least squares, or soft-L1 (scale F_SCALE) with x >= 0."""
    if not robust:
        return np.linalg.lstsq(a, y, rcond=None)[0]
    start = lsq_linear(a, y, bounds=(0, np.inf)).x
    fit = least_squares(lambda x: a @ x - y, start, jac=lambda x: a, bounds=(0, np.inf), method="trf",
                        loss="soft_l1", f_scale=F_SCALE, x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12)
    return np.maximum(fit.x, 0.0)  # trf keeps x inside the bounds; the clip only removes rounding


# the free-loop form's measured loops: per pass, and the free loop and the draft per char in units
# of the baseline loop's pass, taken within each cost round (measure_cost)
LOOP_TIMES = ["free_pass_us", "base_pass_us", "free_per_base", "draft_per_base"]


def has_free_loop(t: pd.DataFrame) -> bool:
    """Every trial measured its loops (LOOP_TIMES): the free-loop form of the model applies."""
    return set(LOOP_TIMES) <= set(t.columns) and len(t) > 0 and bool(t[LOOP_TIMES].notna().all().all())


def fit_extended(t: pd.DataFrame, robust: bool = True, free_loop: bool | None = None) -> Extended:
    """The parameters from the trials' counters, component times and arm medians (module docstring).
    free_loop: fit the free-loop form (delta, gamma) rather than (o_pass, gamma); None: where every
    trial has the loop times (`has_free_loop`)."""
    k = verify_nodes(t).to_numpy(float)
    t1, td = t["target_pass_us"].to_numpy(float), t["draft_char_us"].to_numpy(float)
    n, passes, drafted = (t[c].to_numpy(float) for c in ("baseline_passes", "target_passes", "proposed"))
    # verify pass: tv = t1 (1 + b k), residual relative to the measured tv
    tv = t["verify_pass_us"].to_numpy(float)
    (b,) = _solve((t1 * k / tv)[:, None], (tv - t1) / tv, robust)

    t_base = t["baseline_s_median"].to_numpy(float) * 1e6
    t_spec = t["speculative_s_median"].to_numpy(float) * 1e6
    if has_free_loop(t) if free_loop is None else free_loop:
        # in units of the baseline loop's pass: the speculative time the pairs' ratio implies (the
        # machine's speed may differ between the cost rounds and the pairs; the arms' ratio holds)
        free, td_rel = t["free_per_base"].to_numpy(float), t["draft_per_base"].to_numpy(float)
        implied = n * t_spec / t_base
        left = implied - passes * free - drafted * td_rel
        design = np.column_stack([passes * td_rel, drafted * td_rel]) / implied[:, None]
        if _rank(design) < 2:
            log.warning("the fitted trials span one k: the draft's in-loop excess per pass and per drafted "
                        "char cannot be told apart")
        delta, gamma = _solve(design, left / implied, robust)
        o_pass = float(np.median(t["free_pass_us"].to_numpy(float) - tv))
        o_base = float(np.median(t["base_pass_us"].to_numpy(float) - t1))
        return Extended(float(b), o_pass, float(gamma), o_base, len(t), robust, float(delta), True)
    (o_base,) = _solve((n / t_base)[:, None], (t_base - n * t1) / t_base, robust)
    left = t_spec - passes * t1 * (1 + b * k) - drafted * td
    design = np.column_stack([passes, drafted * td]) / t_spec[:, None]
    if _rank(design) < 2:
        log.warning("the fitted trials span one k and one draft time: the per-pass overhead and the draft's "
                    "in-loop excess cannot be told apart")
    o_pass, gamma = _solve(design, left / t_spec, robust)
    return Extended(float(b), float(o_pass), float(gamma), float(o_base), len(t), robust)


def free_form(fitted: pd.DataFrame, predicted: pd.DataFrame) -> bool:
    """Fit `fitted` in the free-loop form to predict `predicted`: only where both measured their loops
    (a tree draft held out, say, has none to be predicted from)."""
    return has_free_loop(fitted) and has_free_loop(predicted)


def fit_to_predict(fitted: pd.DataFrame, predicted: pd.DataFrame, robust: bool = True) -> Extended:
    """fit_extended on `fitted`, in the form `predicted` can be predicted in (`free_form`)."""
    return fit_extended(fitted, robust, free_loop=free_form(fitted, predicted))


OUTLIER_COLUMNS = KEY + ["run_id", "component", "value", "cell median", "robust z"]
FIT_PREFIX = "fit: "  # per-trial prediction columns of each extended fit (all drafts, each fold)


def flag_outliers(finished: pd.DataFrame) -> pd.DataFrame:
    """One row per (trial, component time) that disagrees with its cell's other seeds (module docstring):
    draft, k, seed, run_id, component, value, cell median, robust z = (value - median) / robust sd."""
    rows = []
    present = {c: ref for c, ref in COMPONENTS.items() if c in finished.columns and ref in finished.columns}
    for _, g in finished.groupby(CELL, sort=True):
        if len(g) < 3:
            continue  # with two seeds both deviate from their median by the same amount
        for col, ref in present.items():
            x = g[col].astype(float)
            med = x.median()
            sd = max(MAD_TO_SD * (x - med).abs().median(), MAD_FLOOR * abs(g[ref].astype(float).median()))
            if not np.isfinite(sd) or sd <= 0:
                continue
            z = (x - med) / sd
            for i in g.index[z.abs() > OUTLIER_Z]:
                rows.append({**{c: g.at[i, c] for c in KEY}, "run_id": g.at[i, "run_id"] if "run_id" in g else "",
                             "component": col, "value": x[i], "cell median": med, "robust z": z[i]})
    return pd.DataFrame(rows, columns=OUTLIER_COLUMNS)


def has_inputs(t: pd.DataFrame, model: str, inputs: list[str]) -> bool:
    missing = [c for c in inputs if c not in t.columns]
    if missing:
        log.warning("%s skipped: the trials lack %s", MODELS[model], ", ".join(missing))
    return not missing and len(t) > 0


def leave_one_draft_out(t: pd.DataFrame, robust: bool = True) -> tuple[pd.Series, dict[str, Extended]]:
    """Per-trial predictions of each draft's trials by a model fitted without that draft."""
    predicted = pd.Series(np.nan, index=t.index)
    fits = {}
    drafts = sorted(t["draft"].unique())
    if len(drafts) < 2:
        log.warning("one draft only: no leave-one-draft-out validation")
        return predicted, fits
    for draft in drafts:
        held = t["draft"] == draft
        fits[draft] = fit_to_predict(t[~held], t[held], robust)
        predicted[held] = fits[draft].predict(t[held])
    return predicted, fits


INTERVAL_COLUMNS = CELL + ["held_lo", "held_hi"]


def group_members(groups: np.ndarray) -> list[np.ndarray]:
    """The positions of each group's members, groups in sorted order (what resample_within draws from)."""
    return [np.flatnonzero(groups == g) for g in sorted(set(groups))]


def resample_within(members: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Positions of a bootstrap resample drawn with replacement within each group (`group_members`):
    every group keeps its count, so no refit loses a draft (which could leave its parameters
    undetermined)."""
    return np.concatenate([rng.choice(m, size=len(m), replace=True) for m in members])


def held_out_intervals(t: pd.DataFrame, boots: int = BOOTSTRAP, seed: int = BOOT_SEED) -> pd.DataFrame:
    """draft, k, held_lo, held_hi: per held-out cell, the central BOOT_LEVEL interval of its prediction
    (median over its seeds, as the point prediction) over `boots` robust refits, each on a bootstrap
    resample of the other drafts' trials drawn within each draft (module docstring)."""
    drafts = sorted(t["draft"].unique())
    if len(drafts) < 2 or boots < 1:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    rng = np.random.default_rng(seed)
    tail = (1 - BOOT_LEVEL) / 2
    out = []
    for draft in drafts:
        held = (t["draft"] == draft).to_numpy()
        rest, target = t[~held], t[held]
        members = group_members(rest["draft"].to_numpy())  # found once per fold, drawn from per refit
        free = free_form(rest, target)  # decided once per fold, not per refit
        cells = []  # each refit's cell predictions (a Series over the held draft's k)
        for _ in range(boots):
            pred = fit_extended(rest.iloc[resample_within(members, rng)], free_loop=free).predict(target)
            cells.append(pred.groupby(target["k"]).median())
        table = pd.concat(cells, axis=1)  # rows: the held draft's k; columns: refits
        lo, hi = table.quantile(tail, axis=1), table.quantile(1 - tail, axis=1)
        out += [{"draft": draft, "k": k, "held_lo": lo[k], "held_hi": hi[k]} for k in table.index]
    return pd.DataFrame(out, columns=INTERVAL_COLUMNS)


@dataclass
class ModelResults:
    trials: pd.DataFrame            # draft, k, seed, one predicted speedup column per model, and one
                                    # per extended fit (FIT_PREFIX + all / without <draft>)
    fit: Extended | None            # robust, fitted on every finished trial
    held_out: dict[str, Extended]   # draft -> robust fit without that draft
    plain: Extended | None = None   # plain least squares on every finished trial (the negative control)
    without_flagged: Extended | None = None  # robust, without the trials flag_outliers lists
    flagged: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=OUTLIER_COLUMNS))
    paper: Extended | None = None   # robust, fitted on the PAPER_DRAFTS' trials alone
    intervals: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=INTERVAL_COLUMNS))
                                    # held_out_intervals: per held-out cell its bootstrap interval


def predict_trials(finished: pd.DataFrame, boots: int = BOOTSTRAP) -> ModelResults:
    """Every model's per-trial predictions, the extended fits, and (boots > 0) the held-out bootstrap
    intervals from `boots` refits per fold; boots = 0 skips them (the fits alone, in a fraction of
    the time)."""
    preds, fit, held, plain, clean, paper = {}, None, {}, None, None, None
    intervals = pd.DataFrame(columns=INTERVAL_COLUMNS)
    flagged = flag_outliers(finished)
    if has_inputs(finished, "seed", SEED_INPUTS):
        preds["seed"] = seed_formula(finished)
    if has_inputs(finished, "closed", CLOSED_INPUTS):
        preds["closed"] = closed_form(finished)
    table = finished[KEY].copy()
    if has_inputs(finished, "extended", EXTENDED_INPUTS):
        fit = fit_extended(finished)
        plain = fit_extended(finished, robust=False)
        preds["extended"] = fit.predict(finished)
        preds["held_out"], held = leave_one_draft_out(finished)
        intervals = held_out_intervals(finished, boots)
        bad = finished.set_index(KEY).index.isin(flagged.set_index(KEY).index.unique())
        clean = fit_extended(finished[~bad]) if bad.any() and (~bad).any() else fit
        is_paper = finished["draft"].isin(PAPER_DRAFTS)
        if is_paper.any() and (~is_paper).any():  # something to fit on, and something held out
            paper = fit_to_predict(finished[is_paper], finished[~is_paper])
            preds["paper"] = paper.predict(finished)
    for model in MODELS:
        table[f"pred_{model}"] = preds.get(model, np.nan)
    if fit is not None:
        table[FIT_PREFIX + "all"] = fit.predict(finished)
        for draft, f in held.items():
            table[f"{FIT_PREFIX}without {draft}"] = f.predict(finished)
    return ModelResults(table, fit, held, plain, clean, flagged, paper, intervals)


def cell_predictions(trial_preds: pd.DataFrame, speedup: pd.DataFrame,
                     intervals: pd.DataFrame | None = None) -> pd.DataFrame:
    """draft, k, measured (pooled median), lo, hi (its interval), min, max (the pooled range), per model
    pred_<m> and ape_<m> (percent),
    pred_extended_lo / _hi: the lowest and highest cell prediction over the extended model's fits, and
    held_lo / held_hi: the held-out prediction's bootstrap interval (`intervals`, held_out_intervals)."""
    fits = [c for c in trial_preds.columns if c.startswith(FIT_PREFIX)]
    preds = trial_preds.groupby(CELL)[[f"pred_{m}" for m in MODELS] + fits].median()
    if len(fits) > 1:  # per fit the cell's median over its seeds; then the spread over the fits
        preds["pred_extended_lo"], preds["pred_extended_hi"] = preds[fits].min(axis=1), preds[fits].max(axis=1)
    else:  # one fit (or none): no spread to bound the prediction with
        preds["pred_extended_lo"] = preds["pred_extended_hi"] = np.nan
    preds = preds.drop(columns=fits)
    cells = speedup[CELL + ["median", "lo", "hi", "min", "max"]].rename(columns={"median": "measured"})
    cells = cells.merge(preds.reset_index(), on=CELL, how="outer")
    bounds = intervals if intervals is not None else pd.DataFrame(columns=INTERVAL_COLUMNS)
    cells = cells.merge(bounds.astype({"k": cells["k"].dtype}), on=CELL, how="left")
    cells = cells.sort_values(CELL).reset_index(drop=True)
    for m in MODELS:
        cells[f"ape_{m}"] = (cells[f"pred_{m}"] - cells["measured"]).abs() / cells["measured"] * 100
    return cells


def model_errors(cells: pd.DataFrame) -> pd.DataFrame:
    """Per model: cells compared, median and max APE. The paper drafts' fit is judged on the other
    drafts' cells only (the cells it never saw); its in-sample cells would flatter it. The held-out
    row also says how many of its cells' measured speedups lie inside their bootstrap interval
    (held_lo, held_hi), in how many that interval overlaps the measured median's own interval
    (lo, hi: the measurement is noisy too), and the interval's median width in percent of the
    point prediction."""
    rows = []
    for m, label in MODELS.items():
        ape = cells[f"ape_{m}"]
        if m == "paper":
            ape, label = ape[~cells["draft"].isin(PAPER_DRAFTS)], label + ", new drafts held out"
        ape = ape.dropna()
        if m == "paper" and ape.empty:
            continue  # a sweep of the paper drafts alone: nothing held out to judge it on
        rows.append({"model": label, "cells": len(ape), "median APE %": ape.median() if len(ape) else np.nan,
                     "max APE %": ape.max() if len(ape) else np.nan,
                     **(interval_scores(cells) if m == "held_out" else NO_INTERVAL_SCORES)})
    return pd.DataFrame(rows)


NO_INTERVAL_SCORES = {"inside interval": "", "intervals overlap": "", "interval width %": np.nan}


def interval_scores(cells: pd.DataFrame) -> dict:
    """The held-out bootstrap intervals against the measured cells (model_errors), blank without them."""
    if not {"held_lo", "held_hi"} <= set(cells.columns):
        return NO_INTERVAL_SCORES
    scored = cells.dropna(subset=["measured", "pred_held_out", "held_lo", "held_hi"])
    if scored.empty:
        return NO_INTERVAL_SCORES
    inside = scored["measured"].between(scored["held_lo"], scored["held_hi"])
    out = {**NO_INTERVAL_SCORES, "inside interval": f"{int(inside.sum())}/{len(scored)}",
           "interval width %": ((scored["held_hi"] - scored["held_lo"]) / scored["pred_held_out"] * 100).median()}
    if {"lo", "hi"} <= set(scored.columns):
        meets = (scored["held_lo"] <= scored["hi"]) & (scored["held_hi"] >= scored["lo"])
        out["intervals overlap"] = f"{int(meets.sum())}/{len(scored)}"
    return out


def clear_of_the_others(groups: dict, draft: str, best: int, others: list[int], level: float) -> str:
    """"yes" / "no" (best_k's clear call from the seed bootstrap), "" where it cannot be made."""
    against = [groups[(draft, k)] for k in others if (draft, k) in groups]
    if (draft, best) not in groups or not against:
        return ""
    lo, _ = best_gain_interval([groups[(draft, best)]], against, level)
    return "yes" if lo > 0 else "no"


def best_k(cells: pd.DataFrame, pairs: pd.DataFrame | None = None, level: float = 0.95) -> pd.DataFrame:
    """Per draft: the k with the highest measured median speedup, its interval [lo, hi], whether it is
    clear of the others, and the k each model picks among the measured k (among the predicted k
    for a draft without pair timings, whose measured columns are then blank).

    clear (`clear_of_the_others`, from `pairs`: draft, k, seed, ratio): "yes" where the seed
    bootstrap's interval at `level` for the best k's gain over the best of the other k (that best
    re-chosen in every replicate: analysis/seed_bootstrap.py) lies above 0, else "no"; blank with
    one measured k or without pairs. Pooled intervals are not compared: they leave out the seeds'
    spread and call equal cells apart far more often than their level says
    (tests/analysis/test_seed_bootstrap.py)."""
    groups = seed_groups(pairs) if pairs is not None and len(pairs) else {}
    rows = []
    for draft, g in cells.groupby("draft", sort=True):
        measured = g.dropna(subset=["measured"])
        row = {"draft": draft, "measured best k": pd.NA, "measured": np.nan, "lo": np.nan, "hi": np.nan,
               "clear": ""}
        if len(measured):
            best = measured.loc[measured["measured"].idxmax()]
            others = measured[measured["k"] != best["k"]]
            row |= {"measured best k": int(best["k"]), "measured": best["measured"], "lo": best["lo"],
                    "hi": best["hi"], "clear": clear_of_the_others(groups, draft, int(best["k"]),
                                                                   [int(k) for k in others["k"]], level)}
        pool = measured if len(measured) else g
        for m in (m for m in MODELS if m != "paper" or cells["pred_paper"].notna().any()):  # it needs new drafts
            preds = pool[f"pred_{m}"].dropna()
            row[f"{m} best k"] = int(pool.loc[preds.idxmax(), "k"]) if len(preds) else pd.NA
        if len(measured) or any(not pd.isna(row[f"{m} best k"]) for m in MODELS):
            rows.append(row)
    df = pd.DataFrame(rows)
    for col in ["measured best k"] + [f"{m} best k" for m in MODELS]:
        if col in df:
            df[col] = df[col].astype("Int64")
    return df
