"""The report's tables, in the seed's shapes, as numbers (rendering lives in outputs.py).

Each builder takes the finished trials (and the pooled pair statistics or model results) and
returns a `Table`: a DataFrame with readable column names, the number format of each column
for the text renderings, and a note saying what the numbers are taken over.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .aggregate import DEFAULT_LEVEL, cell_medians
from .seed_bootstrap import cell_bounds_seeds, seed_groups
from .cost_models import (BOOT_LEVEL, BOOTSTRAP, F_SCALE, MAD_FLOOR, OUTLIER_Z, ModelResults, best_k,
                          model_errors)

SPREAD_WARN, SPREAD_BAD, CPU_WALL_LOW = 0.10, 0.25, 0.8  # thresholds of src/trial/render.py's warnings


@dataclass
class Table:
    name: str                 # file stem
    title: str
    df: pd.DataFrame
    formats: dict[str, str] = field(default_factory=dict)  # column -> format spec; default by dtype
    note: str = ""


def status_table(status: pd.DataFrame) -> Table:
    return Table("status", "Trials per cell", status, note=(
        "seeds: grid points (draft x k x seed spanned by the sweep's runs); failed: no FINISHED run "
        "and at least one FAILED, KILLED or still RUNNING (killed worker) run; missing: no FINISHED run "
        "(failed included). Only finished trials enter the other tables."))


def acceptance_table(finished: pd.DataFrame) -> Table:
    cols = {"acceptance": "acceptance", "chars_per_pass": "chars per pass", "target_passes": "target passes",
            "baseline_passes": "baseline passes", "position_acceptance": "per-position acceptance",
            "analytic_acceptance": "analytic acceptance"}
    df = cell_medians(finished, list(cols)).rename(columns=cols)
    return Table("acceptance", "Acceptance", df,
                 {"chars per pass": ".2f", "target passes": "g", "baseline passes": "g"},
                 "Median over seeds. acceptance = accepted / proposed draft chars; per-position = accepted / "
                 "tested positions (up to the first rejection); analytic = mean over tested positions of "
                 "sum_x min(p, q); baseline passes = target passes without speculation (n_chars).")


def position_table(finished: pd.DataFrame) -> Table:
    k_max = int(finished["k"].max()) if len(finished) else 0
    cols = {f"acceptance_pos_{i}": f"draft {i} kept" for i in range(1, k_max + 1)}
    df = cell_medians(finished, list(cols)).rename(columns=cols)
    return Table("acceptance_by_position", "Acceptance by draft position", df,
                 note="Fraction of target passes whose i-th drafted char was accepted; median over seeds.")


def timing_flags(finished: pd.DataFrame) -> pd.Series:
    """Per cell: the worst arm spread (IQR / median) and CPU/wall ratio of its trials, in words."""
    def flags(g: pd.DataFrame) -> str:
        out = []
        spread = g[["baseline_iqr_rel", "speculative_iqr_rel"]].max().max()  # NaN-skipping
        if spread > SPREAD_BAD:
            out.append(f"unreliable: spread {spread:.0%}")
        elif spread > SPREAD_WARN:
            out.append(f"noisy: spread {spread:.0%}")
        cpu = g["min_cpu_wall_ratio"].min()
        if cpu < CPU_WALL_LOW:
            out.append(f"descheduled: CPU/wall {cpu:.2f}")
        return "; ".join(out)
    needed = ["baseline_iqr_rel", "speculative_iqr_rel", "min_cpu_wall_ratio"]
    if any(c not in finished.columns for c in needed):
        return pd.Series(dtype=str)
    return finished.groupby(["draft", "k"])[needed].apply(flags).rename("timing flags")


def verdict(lo: float, hi: float) -> str:
    if pd.isna(lo) or pd.isna(hi):
        return ""  # no pair timings for this cell
    if lo > 1:
        return "faster"
    if hi < 1:
        return "slower"
    return "no demonstrated change"  # the range straddles 1.0


def cpu_models(trials: pd.DataFrame) -> pd.Series:
    """Each trial's CPU model tag; "unknown" where the run has none (it cannot be told to match)."""
    if "cpu_model" not in trials.columns:
        return pd.Series("unknown", index=trials.index, name="cpu_model")
    return trials["cpu_model"].astype(object).where(trials["cpu_model"].notna(), "unknown").rename("cpu_model")


def cpu_models_per_cell(finished: pd.DataFrame) -> pd.Series:
    """Per cell: how many CPU models its finished trials ran on (> 1: pair timings pooled across them)."""
    return cpu_models(finished).groupby([finished["draft"], finished["k"]]).nunique().rename("CPU models")


def speedup_table(finished: pd.DataFrame, speedup: pd.DataFrame) -> Table:
    cpp = cell_medians(finished, ["chars_per_pass"]).rename(columns={"chars_per_pass": "chars per pass"})
    df = cpp.drop(columns="seeds").merge(speedup, on=["draft", "k"], how="left")
    df["verdict"] = [verdict(lo, hi) for lo, hi in zip(df["lo"], df["hi"])]
    df = df.merge(timing_flags(finished).reset_index(), on=["draft", "k"], how="left")
    df = df.merge(cpu_models_per_cell(finished).reset_index(), on=["draft", "k"], how="left")
    if "timing flags" not in df:
        df["timing flags"] = ""
    mixed = df["CPU models"] > 1
    df["timing flags"] = [("; ".join(filter(None, [f, f"mixed CPU models ({n})"])) if m else f)
                          for f, n, m in zip(df["timing flags"].fillna(""), df["CPU models"], mixed)]
    df = df.rename(columns={"seed_median": "median of seed medians", "confidence": "interval confidence"})
    return Table("speedup", "Measured speedup", df,
                 {"chars per pass": ".2f", "median": ".2f", "lo": ".2f", "hi": ".2f", "min": ".2f", "max": ".2f",
                  "median of seed medians": ".2f", "interval confidence": ".4f"},
                 "Speedup = baseline time / speculative time of one alternated pair. median, min and max "
                 "are over ALL pairs of all seeds of the cell (pooled ratios); lo-hi = the interval for that "
                 "median at the trials' timing.confidence: with 2 seeds or more (interval = seed bootstrap) "
                 "the percentile interval of the seed bootstrap (seeds resampled, then each seed's pairs), "
                 "which holds the seeds' spread, interval confidence = the level; with 1 seed (interval = "
                 "pairs (1 seed)) the distribution-free interval of its pairs (order statistics X_(j), "
                 "X_(n+1-j)), interval confidence = its exact coverage for n pairs, the timing noise of one "
                 "text only. The verdict reads lo-hi. min-max: the range of the pooled ratios. Timing flags: worst IQR/median "
                 f"of an arm over the cell's trials (> {SPREAD_WARN:.0%} noisy, > {SPREAD_BAD:.0%} unreliable), "
                 f"CPU/wall below {CPU_WALL_LOW}. CPU models: distinct cpu_model tags of the cell's trials (a "
                 "missing tag counts as 'unknown'); more than one: the pooled pairs mix CPUs (flagged).")


def memory_table(finished: pd.DataFrame) -> Table:
    cols = {"memory_target_bytes": "target MiB", "memory_draft_bytes": "draft MiB", "memory_bytes": "held MiB",
            "peak_rss_bytes": "process peak MiB"}
    df = cell_medians(finished, list(cols)).rename(columns=cols)
    for c in cols.values():
        df[c] = df[c] / 2 ** 20
    df["draft / target"] = df["draft MiB"] / df["target MiB"]
    return Table("memory", "Memory", df, {c: ".1f" for c in cols.values()} | {"draft / target": ".2f"},
                 "Median over seeds, after the trial's runs (caches at their largest). target, draft: the bytes of "
                 "every tensor and array each holds (weights, KV caches, tables; the target's left out of the "
                 "draft's); process peak: the trial process's resident-set high-water mark (what the counts cannot "
                 "see too: Python's lists, ONNX Runtime's and inductor's copies, and what ran before in the process).")


def cost_table(finished: pd.DataFrame) -> Table:
    rows = [{"what": "one target pass", "time us": finished["target_pass_us"].median(), "c": np.nan}]
    for draft, g in finished.groupby("draft", sort=True):
        rows.append({"what": f"{draft} draft, per char", "time us": g["draft_char_us"].median(),
                     "c": g["c"].median()})
    return Table("cost", "Cost", pd.DataFrame(rows), {"time us": ".0f"},
                 "Median over all finished trials (of the draft). The draft's time per char includes its "
                 "per-call cost spread over k chars, so it varies with k: see the cost by k table.")


def cost_by_k_table(finished: pd.DataFrame) -> Table:
    cols = {"target_pass_us": "target pass us", "verify_pass_us": "verify pass us",
            "draft_char_us": "draft us per char", "c": "c", "overhead_us_per_pass": "overhead us per pass"}
    df = cell_medians(finished, list(cols))
    df.insert(df.columns.get_loc("verify_pass_us") + 1, "verify / target",
              df["verify_pass_us"] / df["target_pass_us"])
    df = df.rename(columns=cols)
    return Table("cost_by_k", "Cost by k", df,
                 {"target pass us": ".0f", "verify pass us": ".0f", "draft us per char": ".1f",
                  "overhead us per pass": ".0f"},
                 "Median over seeds. verify pass = one (k+1)-char target pass; overhead per pass = measured "
                 "speculative time minus verify passes and draft time, per pass.")


def predictions_table(cells: pd.DataFrame) -> Table:
    short = {"seed": "seed formula", "closed": "closed form", "extended": "extended", "held_out": "held out",
             "paper": "paper fit"}
    df = cells[["draft", "k", "measured"]].rename(columns={"measured": "measured median"})
    formats = {"measured median": ".2f"}
    for m, label in short.items():
        if m == "paper" and cells[f"pred_{m}"].isna().all():
            continue  # a sweep of the paper drafts alone (or of none): nothing held out
        df[label] = cells[f"pred_{m}"]
        df[f"{label} APE %"] = cells[f"ape_{m}"]
        formats |= {label: ".2f", f"{label} APE %": ".1f"}
        if m == "held_out" and "held_lo" in cells:
            df["held out lo"], df["held out hi"] = cells["held_lo"], cells["held_hi"]
            formats |= {"held out lo": ".2f", "held out hi": ".2f"}
    return Table("predicted_vs_measured", "Predicted vs measured", df, formats,
                 "Predicted speedup per cell (median over seeds of each trial's prediction) against the "
                 "measured pooled median; APE = |predicted - measured| / measured. Held out: the extended "
                 "model fitted without the cell's draft, with lo-hi its bootstrap interval (Cost model errors). Paper fit (when the sweep has other drafts): the "
                 "extended model fitted on the seed's drafts (bigram, int8, int4) only.")


def model_errors_table(cells: pd.DataFrame) -> Table:
    return Table("model_errors", "Cost model errors", model_errors(cells),
                 {"median APE %": ".1f", "max APE %": ".1f", "interval width %": ".0f"},
                 "APE over the cells with a measured speedup. Held out: inside interval = cells whose measured "
                 f"median lies in the held-out prediction's {BOOT_LEVEL:.0%} bootstrap interval ({BOOTSTRAP} refits "
                 "of the fold, its trials resampled within each draft); intervals overlap = cells where it "
                 "overlaps the measured median's own interval; interval width = its median width, in "
                 "percent of the prediction. A wide interval says the other drafts do not determine the fit.")


def fit_table(results: ModelResults) -> Table | None:
    if results.fit is None:
        return None
    free = results.fit.free_loop
    meaning = {"b": "verify pass cost per drafted position (x t1)",
               "o_pass": "overhead per speculative pass, us" + (" (measured: median free loop - tv)" if free else ""),
               "gamma": "in-loop excess per drafted char (x td)",
               "o_base": "overhead per baseline pass, us" + (" (measured: median base loop - t1)" if free else ""),
               **({"delta": "in-loop excess per pass (x td)"} if free else {}), "trials": "trials fitted on"}
    df = pd.DataFrame({"parameter": list(meaning), "meaning": list(meaning.values())})
    df["all drafts"] = [getattr(results.fit, p) for p in meaning]
    if results.without_flagged is not None:
        df["without flagged trials"] = [getattr(results.without_flagged, p) for p in meaning]
    if results.plain is not None:
        df["plain least squares"] = [getattr(results.plain, p) for p in meaning]
    if results.paper is not None:
        df["paper drafts only"] = [getattr(results.paper, p) for p in meaning]
    for draft, fit in results.held_out.items():
        df[f"without {draft}"] = [getattr(fit, p) for p in meaning]
    formats = {c: ".4g" for c in df.columns[2:]}
    form = ("T_B = n F_B; T_S = P (F + delta td) + D td (1 + gamma), F_B and F the trial's measured baseline "
            "and free loops per pass (the free loop replays its own proposals at no drafting cost), so o_base "
            "and o_pass are measured, not fitted; delta and gamma are fitted on the ratio of the paired arms"
            if free else "T_B = n (t1 + o_base); T_S = P (t1 (1 + b k) + o_pass) + D td (1 + gamma), k a tree's "
            "node count for a tree")
    return Table("extended_fit", "Extended cost model: fitted parameters", df, formats,
                 f"{form}; parameters shared by "
                 "all drafts, bounded >= 0, fitted with a soft-L1 loss on the relative residuals (scale "
                 f"{F_SCALE:.0%} of the measured time), so one mis-measured trial weighs little. 'without flagged "
                 "trials': the same fit without the trials of the outliers table; 'plain least squares': unbounded, "
                 "not robust, for comparison only; 'paper drafts only': fitted on bigram, int8 and int4 (it "
                 "predicts every other draft's cells, held out); 'without X': fitted leaving draft X out (used for its held-out "
                 "predictions).")


def outliers_table(results: ModelResults) -> Table:
    df = results.flagged.rename(columns={"component": "component time"})
    return Table("outliers", "Flagged trials: component times far from their cell's other seeds", df,
                 {"value": ".1f", "cell median": ".1f", "robust z": ".1f"},
                 f"A trial's component time is flagged when |value - cell median| > {OUTLIER_Z:g} x 1.4826 x MAD "
                 f"over the cell's seeds (the MAD term floored at {MAD_FLOOR:.0%} of the cell's median; of its "
                 "verify pass for the overhead per pass); cells need three seeds. Flagged trials stay in every "
                 "table; the fit table shows the parameters without them.")


def where_1(lo: float, hi: float) -> str:
    """Where an interval lies with respect to 1 (no change)."""
    if lo > 1:
        return "lies above 1"
    if hi < 1:
        return "lies below 1"
    return "straddles 1"


def recommendation(g: pd.DataFrame, lower: dict | None = None) -> str:
    """One draft's cells -> what to do, with the reason. "speculate with k = K" only where the cell's
    measured interval [lo, hi] (aggregate.pooled_speedup: the seed bootstrap's) lies above 1, or, for a draft without pair timings, where the extended
    model's spread over its fits does; otherwise "not demonstrated" and why. lower: k -> the cell's
    lower bound holding for all the draft's measured k at once (seed_bootstrap.cell_bounds_seeds;
    given where every k has two seeds or more): then a k is recommended only where that bound lies
    above 1, so that the luck of picking the best of several k is not read as a gain, and where the
    best k's own interval lies above 1 but its joint bound does not, the text says so. Where the
    model's best k is not the recommended (or best measured) k, the text says what that k measured; a
    cell whose pairs come from several CPU models (column cpu_models, where present) says so."""
    g = g.assign(**{c: g[c] if c in g else np.nan for c in ("pred_extended", "pred_extended_lo",
                                                             "pred_extended_hi")})
    measured = g.dropna(subset=["measured"])
    if measured.empty:
        model = g.dropna(subset=["pred_extended"])
        if model.empty:
            return "not demonstrated: no pair timings and no model prediction"
        above = model[model["pred_extended_lo"] > 1]
        if len(above):
            r = above.loc[above["pred_extended"].idxmax()]
            return (f"speculate with k = {int(r['k'])} (not measured: the extended model predicts "
                    f"{r['pred_extended']:.2f}x, {r['pred_extended_lo']:.2f}-{r['pred_extended_hi']:.2f} "
                    "over its fits)")
        r = model.loc[model["pred_extended"].idxmax()]
        spread = ("with no other fit to bound it" if pd.isna(r["pred_extended_lo"]) else
                  f"{r['pred_extended_lo']:.2f}-{r['pred_extended_hi']:.2f} over its fits, which "
                  + where_1(r["pred_extended_lo"], r["pred_extended_hi"]))
        return (f"not demonstrated: no pair timings; the extended model's best k = {int(r['k'])} is predicted "
                f"{r['pred_extended']:.2f}x, {spread}")

    def measured_text(r: pd.Series) -> str:
        slower = ": a slowdown" if r["hi"] < 1 else ""
        mixed = f", pairs pooled over {int(r['cpu_models'])} CPU models" if r.get("cpu_models", 1) > 1 else ""
        return (f"{r['measured']:.2f}x, interval {r['lo']:.2f}-{r['hi']:.2f} {where_1(r['lo'], r['hi'])}"
                f"{slower}{mixed}")

    top = measured.loc[measured["measured"].idxmax()]
    joint = lower is not None and len(measured) > 1
    bound = measured["k"].map(lambda k: lower[int(k)]) if joint else measured["lo"]
    shown = measured[bound > 1]
    notes = []
    if len(shown):
        pick = shown.loc[shown["measured"].idxmax()]
        text = f"speculate with k = {int(pick['k'])} (measured {measured_text(pick)}"
        text += (f"; at least {lower[int(pick['k'])]:.2f}x bounded with all {len(measured)} k at once)" if joint
                 else ")")
        if pick["k"] != top["k"]:
            notes.append(f"k = {int(top['k'])} measured a higher median, {measured_text(top)}")
    else:
        pick = top
        text = f"not demonstrated: best measured k = {int(top['k'])}, {measured_text(top)}"
        if joint and top["lo"] > 1:
            text += (f", but bounded with all {len(measured)} k at once its lower end is "
                     f"{lower[int(top['k'])]:.2f}x: the best of {len(measured)} k can measure that high by luck")
    model = measured.dropna(subset=["pred_extended"])
    if len(model):
        m = model.loc[model["pred_extended"].idxmax()]
        if m["k"] != pick["k"]:
            notes.append(f"the extended model's best k = {int(m['k'])} (predicted {m['pred_extended']:.2f}x) "
                         f"measured {measured_text(m)}")
    return "; ".join([text] + notes)


def joint_lower(g: pd.DataFrame, pairs: pd.DataFrame | None, level: float) -> dict | None:
    """k -> the lower bound of each measured cell of one draft holding for all of them at once
    (seed_bootstrap.cell_bounds_seeds), None where a cell has fewer than two seeds or no pairs."""
    measured = g.dropna(subset=["measured"])
    if pairs is None or not len(pairs) or measured.empty:
        return None
    groups = seed_groups(pairs)
    cells = [groups.get((d, int(k)), []) for d, k in zip(measured["draft"], measured["k"])]
    if min(len(c) for c in cells) < 2:
        return None
    lo, _ = cell_bounds_seeds(cells, level)
    return {int(k): float(x) for k, x in zip(measured["k"], lo)}


def best_k_table(cells: pd.DataFrame, pairs: pd.DataFrame | None = None, level: float = DEFAULT_LEVEL) -> Table:
    df = best_k(cells, pairs, level)
    if df.empty:
        return Table("best_k", "Best k", df)
    df["model agrees"] = ["" if pd.isna(m) or pd.isna(k) else "yes" if m == k else "no"
                          for m, k in zip(df["extended best k"], df["measured best k"])]
    df["recommendation"] = [recommendation(cells[cells["draft"] == d], joint_lower(cells[cells["draft"] == d], pairs,
                                                                               level)) for d in df["draft"]]
    df = df.rename(columns={"measured": "measured median", "held_out best k": "held-out best k",
                            "seed best k": "seed formula best k", "closed best k": "closed form best k",
                            "paper best k": "paper fit best k"})
    return Table("best_k", "Best k per draft", df, {"measured median": ".2f", "lo": ".2f", "hi": ".2f"},
                 "Measured best k: highest pooled median speedup among the measured k; lo-hi: its interval (see the "
                 "speedup table); clear: the seed bootstrap's interval (seeds, then each seed's pairs, resampled) for its "
                 "gain over the best of the other k, re-chosen in every replicate, lies above 0; model best k: highest prediction "
                 "over the same k. Recommendation: speculate only with a k whose measured interval (the speedup "
                 "table's lo-hi) lies above 1 (the "
                 "highest median among those), and with several k of two seeds or more whose lower bound holding "
                 "for all the draft's k at once (the seed bootstrap's) does; a draft without pair timings only where the extended model's "
                 "spread over its fits (all drafts, each draft left out) lies above 1. Otherwise not "
                 "demonstrated, with the reason; where the model prefers another k, what that k measured.")


def exactness_table(finished: pd.DataFrame) -> Table | None:
    if "tvd_speculative" not in finished.columns or finished["tvd_speculative"].isna().all():
        return None
    rows = []
    for draft, g in finished.groupby("draft", sort=True):
        tvd = g["tvd_speculative"].dropna()
        if len(tvd):
            rows.append({"sampler": f"{draft} draft", "TVD": tvd.median(), "max TVD": tvd.max(), "trials": len(tvd)})
    direct = finished["tvd_direct"].dropna() if "tvd_direct" in finished.columns else pd.Series(dtype=float)
    if len(direct):
        rows.append({"sampler": "direct from target (baseline)", "TVD": direct.median(), "max TVD": direct.max(),
                     "trials": len(direct)})
    return Table("exactness", "Exactness", pd.DataFrame(rows), {"TVD": ".4f", "max TVD": ".4f"},
                 "TVD of the first generated char's histogram to the exact target distribution, median over the "
                 "trials that ran the check; the direct row is the sampling-noise baseline.")
