"""The prediction of `python -m src.predict` from its probes (src/trial/probes.py), as pure functions: no
model runs here.

- the prediction table of one probe run (`prediction_table`: the formula of
  src/engine/measuring/formula.py with the loop overheads, per setting) and its bootstrap interval
  over the probes' spread (`replicates`, `interval`);
- the best of several settings, with an interval that holds for all of them at once
  (`best_over_settings`, `best_of_table`), several probe runs combined (`combine_runs`), the
  predicted break-even batch (`break_even_table`), the advice line (`recommendation`);
- the loop overheads fitted on a finished sweep (`fitted_overheads`, `held_out_overheads`), and the
  settings' costs without their measured loops when fitted ones apply (`without_loops`);
- what --validate prints beside the measured cells (`ape_summary`, `regime_errors`,
  `break_even_beside`, `probes_after`, `rounds_timing`).

The method in full: src/predict.py's docstring.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from src.engine.measuring.formula import Overheads, chars_per_pass, iid_chars_per_pass, seed_speedup, speedup

INTERVAL_LEVEL = 0.95           # the predicted speedup's interval: central share of the replicates
INTERVAL_REPS = 2000            # bootstrap replicates of the probes
INTERVAL_SEED = 0               # seeded: a prediction's interval is reproducible from its probes


def replicates(m: dict, overheads: Overheads, reps: int = INTERVAL_REPS,
               rng: np.random.Generator | None = None) -> np.ndarray:
    """`reps` bootstrap replicates of one setting's predicted speedup from its probes (m["spread"]):
    the sequences (units) resampled with replacement for cpp and the drafted chars per pass; the
    timing rounds resampled with replacement, one draw of round indices for t1, tv and td together
    (they were timed interleaved, a round at one machine speed), each the median over the drawn
    rounds as the point estimate is over all rounds; a table draft's replays resampled for td. A
    setting's measured loops (m["overheads"], `loop_probes`) are drawn in the same rounds (its
    baseline and free loops' times); fitted or given loop overheads are held at their values. A
    setting without a spread gives its point value."""
    rng = rng if rng is not None else np.random.default_rng(INTERVAL_SEED)
    sp = m.get("spread")   # a Spread (src/trial/probes.py), or None
    overheads = m.get("overheads", overheads)   # the setting's own measured loops, where it has them
    if sp is None:
        return np.full(reps, float(speedup(m["cpp"], m["target_pass_us"], m["verify_pass_us"], m["draft_char_us"],
                                           m["nodes"], overheads)))
    u = np.asarray(sp.units, dtype=float)
    pick = rng.integers(0, len(u), (reps, len(u)))
    passes = u[pick, 1].sum(1)
    cpp, nodes = u[pick, 0].sum(1) / passes, u[pick, 2].sum(1) / passes
    r = {name: np.asarray(v, dtype=float) for name, v in sp.rounds.items()}
    rounds = rng.integers(0, len(r["target"]), (reps, len(r["target"])))
    t1, tv, td = (np.median(r[name][rounds], axis=1) for name in ("target", "verify", "draft"))
    if "overheads" in m and {"base", "free"} <= set(r):   # measured loops: drawn in the same rounds
        base, free = (np.median(r[name][rounds], axis=1) for name in ("base", "free"))
        overheads = Overheads(base - t1, free - tv, overheads.gamma, overheads.source)
    if sp.replays:
        replays = np.asarray(sp.replays, dtype=float)
        td = sp.draft_scale * np.median(replays[rng.integers(0, len(replays), (reps, len(replays)))], axis=1)
    return np.asarray(speedup(cpp, t1, tv, td, nodes, overheads), dtype=float)


def interval(values: np.ndarray, level: float = INTERVAL_LEVEL) -> tuple[float, float]:
    """The central `level` percentile interval of bootstrap replicates."""
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def setting_replicates(costs: dict, overheads: Overheads, reps: int = INTERVAL_REPS) -> dict:
    """label -> its replicates (`replicates`), the settings drawn one after another from one
    seeded generator (each setting's probes are its own runs: independent draws)."""
    rng = np.random.default_rng(INTERVAL_SEED)
    return {label: replicates(m, overheads, reps, rng) for label, m in costs.items()}


def prediction_table(survival, costs: dict, overheads: Overheads, a: float | None = None,
                     level: float = INTERVAL_LEVEL, reps: dict | None = None) -> pd.DataFrame:
    """One row per setting: k (or tree shape), cpp, c, tv/t1, the seed formula cpp / (1 + n c),
    the predicted speedup and, where the costs carry their probes' spread (`Spread`), its interval
    lo-hi at `level` (`replicates`). costs: label -> dict(k, target_pass_us, verify_pass_us,
    draft_char_us, nodes, optionally cpp (else chars_per_pass(survival, k)), draft_char_us_warm,
    spread and overheads: the setting's measured loops, which then stand for `overheads`, shown as
    columns o_base, o_pass); survival: S_1.. for chains; a: the first position's overlap, for the
    i.i.d. column (chains). reps: the settings' replicates where the caller drew them already
    (`setting_replicates` of the same costs and overheads)."""
    if not all("spread" in m for m in costs.values()):
        reps = None
    elif reps is None:
        reps = setting_replicates(costs, overheads)
    rows = []
    for label, m in costs.items():
        cpp = m["cpp"] if "cpp" in m else chars_per_pass(survival, m["k"])
        t1, tv, td, n = m["target_pass_us"], m["verify_pass_us"], m["draft_char_us"], m["nodes"]
        o = m.get("overheads", overheads)
        row = {"setting": label, "k": m["k"], "drafted": n, "cpp": cpp}
        if a is not None:
            row["cpp iid"] = float(iid_chars_per_pass(a, m["k"]))   # NaN where the draft has no q (prompt lookup)
        if "draft_char_us_warm" in m:
            row["c warm"] = m["draft_char_us_warm"] / t1
        if "draft_char_us_alone" in m:
            row["c alone"] = m["draft_char_us_alone"] / t1
        if "overheads" in m:
            row |= {"o_base": o.o_base, "o_pass": o.o_pass}
        row |= {"c": td / t1, "tv/t1": tv / t1, "seed formula": seed_speedup(cpp, n, td / t1),
                "predicted": float(speedup(cpp, t1, tv, td, n, o))}
        if reps is not None:
            row["lo"], row["hi"] = interval(reps[label], level)
        rows.append(row)
    return pd.DataFrame(rows)


def category_costs(costs: dict, category: str) -> dict | None:
    """The settings' costs with each one's sampled sequences narrowed to those of one workload
    category (`Spread.categories`), its chars per pass re-taken from them: the per-category
    prediction (the component times and loops are the workload's, measured once). None where the
    probes do not tell the categories apart (a tree, a batch, a policy, transformers' loop)."""
    out = {}
    for label, m in costs.items():
        spread = m.get("spread")
        if spread is None or not spread.categories:
            return None
        rows = np.array([c == category for c in spread.categories])
        if not rows.any():
            return None
        units = spread.units[rows]
        out[label] = {**m, "cpp": float(units[:, 0].sum() / units[:, 1].sum()),
                      "spread": replace(spread, units=units, categories=(category,) * int(rows.sum()))}
    return out


def best_over_settings(costs: dict, overheads: Overheads, level: float = INTERVAL_LEVEL,
                       reps: dict | None = None) -> dict:
    """The best predicted setting and an interval for the best speedup over the settings: the largest
    of bounds that hold for all settings at once (seed_bootstrap.best_of_interval over the settings'
    replicates), so the luck of picking the highest of several noisy predictions is in it: (setting,
    its k, predicted point, lo, hi). With one setting, its own interval. reps: as prediction_table's."""
    reps = reps if reps is not None else setting_replicates(costs, overheads)
    return best_of_table(prediction_table(np.zeros(0), costs, overheads, reps=reps), reps, level)


def best_of_table(table: pd.DataFrame, reps: dict, level: float = INTERVAL_LEVEL) -> dict:
    """`best_over_settings` of a prediction table (its setting, k and predicted columns) and its
    settings' replicates (label -> array, the same length for every setting)."""
    from .seed_bootstrap import best_of_interval
    best = table.loc[table["predicted"].idxmax()]
    lo, hi = best_of_interval(table["predicted"].to_numpy(), np.stack([reps[label] for label in table["setting"]]),
                              level)
    return {"setting": best["setting"], "k": int(best["k"]), "predicted": float(best["predicted"]), "lo": lo, "hi": hi}


def combine_runs(runs: list[tuple[pd.DataFrame, dict]], level: float = INTERVAL_LEVEL) -> tuple[pd.DataFrame, dict]:
    """One prediction from R independent probe runs of the same settings (each a prediction table
    with its replicates; run r on its own sequences, `probe_seed`, and its own timing rounds, at
    another moment of the machine): every numeric column per setting is the median over the runs
    (the predicted speedup: the median of the runs' predictions, so one run caught in a slow or
    fast spell does not move it), and lo-hi is the central `level` interval of the runs' replicates
    pooled (R x INTERVAL_REPS per setting): each run's own spread and the spread between the runs
    (the machine's speed moving from one to the next). One run: its table and replicates unchanged."""
    if len(runs) == 1:
        return runs[0]
    tables = [t for t, _ in runs]
    labels = list(tables[0]["setting"])
    if any(list(t["setting"]) != labels for t in tables):
        raise ValueError("the runs' tables must list the same settings in the same order")
    table = tables[0].copy()
    for col in table.columns:
        if col not in ("setting", "k", "lo", "hi") and pd.api.types.is_numeric_dtype(table[col]):
            table[col] = np.median(np.stack([t[col].to_numpy(dtype=float) for t in tables]), axis=0)
    pooled = {label: np.concatenate([reps[label] for _, reps in runs]) for label in runs[0][1]}
    if "lo" in table:
        bounds = [interval(pooled[label], level) for label in labels]
        table["lo"], table["hi"] = [b[0] for b in bounds], [b[1] for b in bounds]
    return table, pooled


def break_even_table(best: pd.DataFrame) -> pd.DataFrame:
    """Per engine measured at two batch sizes or more, the predicted break-even batch: best: one row
    per regime (engine, batch, predicted, lo, hi, setting) from `best_over_settings`. Each engine's row gives the best
    prediction at each B and where the point, the lower and the upper ends fall below 1x
    (analysis.regimes.break_even_rows: linear in log2 B between the grid's sizes; '> B' it pays at every
    B, '< B' at none), the same rule as the report's measured batch table."""
    from .regimes import batch_label, break_even_rows
    ends = break_even_rows(best, keys=("engine",), value="predicted").set_index("engine")
    rows = []
    for engine, g in best.groupby("engine", sort=True):
        if engine not in ends.index:   # one batch size: no crossing to place
            continue
        e, row = ends.loc[engine], {"engine": engine}
        for r in g.sort_values("batch").itertuples():
            row[f"B={r.batch}"] = f"{r.predicted:.2f} [{r.lo:.2f}-{r.hi:.2f}] {setting_label(r.setting)}"
        row["break-even B"] = " ".join((batch_label(e["point"], e["bs"]),
                                        f"[{batch_label(e['first'], e['bs'])} - {batch_label(e['last'], e['bs'])}]"))
        row["_point"], row["_lo"], row["_hi"] = e["point"], e["first"], e["last"]
        rows.append(row)
    return pd.DataFrame(rows)


def setting_label(setting) -> str:
    return f"tree {setting}" if isinstance(setting, str) else f"k={int(setting)}"


def ape_summary(cells: pd.DataFrame, paper_drafts) -> pd.DataFrame:
    """Median and max APE (percent) of cells (columns draft_name, `ape %`) for the paper drafts (in any
    cell: a tree, an engine, a batch, a policy of one counts as one) and the others."""
    base = cells["draft_name"]
    rows = []
    for group, mask in (("paper drafts (" + ", ".join(paper_drafts) + ")", base.isin(paper_drafts)),
                        ("new drafts", ~base.isin(paper_drafts))):
        ape = cells.loc[mask, "ape %"].dropna()
        rows.append({"drafts": group, "cells": len(ape), "median APE %": ape.median() if len(ape) else np.nan,
                     "max APE %": ape.max() if len(ape) else np.nan})
    return pd.DataFrame(rows)


def without_loops(costs: dict) -> dict:
    """The settings' costs less what was measured in the loop's order (their loops, a model draft's
    proposal after a verify pass): fitted or given overheads (gamma on the lone proposal) apply instead."""
    out = {}
    for label, m in costs.items():
        m = {key: v for key, v in m.items() if key != "overheads"}
        if "draft_char_us_alone" in m:
            m["draft_char_us"] = m.pop("draft_char_us_alone")
            if "spread" in m:
                rounds = dict(m["spread"].rounds)
                rounds["draft"] = rounds.pop("draft alone")
                m["spread"] = replace(m["spread"], rounds=rounds)
        out[label] = m
    return out


def fitted_overheads(uri: str, experiment: str, sweep_id: str, drafts: list[str] | None) -> Overheads:
    """The extended model's o_base, o_pass, gamma fitted on the finished trials of a sweep (those
    of `drafts` only, if given)."""
    from .sweep_data import connect, load_sweep
    data = load_sweep(connect(uri), experiment, sweep_id)
    t = data.finished
    if drafts:
        t = t[t["draft_name"].isin(drafts)]
    return overheads_from(t, f"sweep {data.sweep.sweep_id}" + (f" ({', '.join(drafts)})" if drafts else ""),
                          data.sweep.sweep_id)


def overheads_from(t: pd.DataFrame, source: str, sweep_id: str) -> Overheads:
    """The extended model's (o_pass, gamma) form fitted on trials t (no free loop runs in predict)."""
    from src.engine.errors import SpecsweepError
    from .cost_models import EXTENDED_INPUTS, fit_extended
    missing = [c for c in EXTENDED_INPUTS if c not in t.columns]
    if t.empty or missing:
        raise SpecsweepError(f"sweep {sweep_id!r} has no finished trials to fit the overheads on"
                             + (f" (they lack {', '.join(missing)})" if missing and not t.empty else ""))
    fit = fit_extended(t, free_loop=False)
    return Overheads(fit.o_base, fit.o_pass, fit.gamma, f"extended model fitted on {fit.trials} trials of {source}")


def held_out_overheads(finished: pd.DataFrame, sweep_id: str, draft: str, engine: str, batch: int) -> Overheads:
    """The overheads for one validated cell, fitted on the trials of `finished` (a sweep's) of
    every other draft in every other regime: neither the cell's draft nor its (engine, batch)
    enters its prediction. None such: no overheads (0), and the source says so."""
    from src.engine.errors import SpecsweepError
    engines = finished["engine"].fillna("eager") if "engine" in finished else pd.Series("eager", index=finished.index)
    batches = finished["batch"].fillna(1) if "batch" in finished else pd.Series(1, index=finished.index)
    other = finished[(finished["draft_name"] != draft) & ~((engines == engine) & (batches == batch))]
    source = f"sweep {sweep_id} without {draft} and without {engine} at batch {batch}"
    try:
        return overheads_from(other, source, sweep_id)
    except SpecsweepError:
        return Overheads(source=f"none (no trial of {source}: loop overheads taken as 0)")


def recommendation(table: pd.DataFrame) -> str:
    """The advice line: the setting with the highest predicted speedup; 'do not speculate' when none
    is above 1x; where its interval reaches 1x, the probes cannot tell it from no gain, and it says so."""
    best = table.loc[table["predicted"].idxmax()]
    setting = setting_label(best["setting"])
    if best["predicted"] <= 1:
        return f"recommended: do not speculate (no setting predicted above 1x; best {setting} at {best['predicted']:.2f}x)"
    text = f"recommended: speculate: {setting} (predicted {best['predicted']:.2f}x"
    if "lo" not in best:
        return text + ")"
    text += f" [{best['lo']:.2f}-{best['hi']:.2f}])"
    return text + ("" if best["lo"] > 1 else ": its interval reaches 1x, the probes cannot tell it from no gain")


def probes_after(starts: pd.Series, now: pd.Timestamp) -> str:
    """How long after the sweep's trials these probes began (`now`: their start): a shared
    machine's speed drifts between the two (a draft whose loop alternates two models' weights
    through the caches the most), and that drift is part of the error printed."""
    first, last = starts.min(), starts.max()
    hours = (now - last).total_seconds() / 3600
    return (f"the sweep's trials started from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC; these probes began "
            f"{hours:.1f} h after its last (the machine's drift in between is part of each error)")


def rounds_timing(starts: list[pd.Series], began: list[pd.Timestamp]) -> str:
    """When each round of the sweep's trials ran and how long after its last trial the probe run
    that follows it began (round r's trials' start times, probe run r's start): the probes sample
    the machine in the same stretch of time as the trials they are judged against."""
    lines = [f"{len(starts)} rounds, each the sweep's trials then a probe run of every cell; each value the median "
             "over the probe runs"]
    for r, (s, b) in enumerate(zip(starts, began)):
        lines.append(f"  round {r + 1}: trials started {s.min():%Y-%m-%d %H:%M} to {s.max():%H:%M} UTC, probe run "
                     f"{r + 1} began {(b - s.max()).total_seconds() / 60:.1f} min after its last")
    return "\n".join(lines)


def break_even_beside(best: pd.DataFrame, cells: pd.DataFrame, pairs: pd.DataFrame, level: float) -> pd.DataFrame:
    """Per draft (its cell less the regime) and engine measured at two batch sizes or more: the
    predicted break-even batch (`break_even_table` over `best`, the best predicted setting per
    regime) beside the measured one (analysis.regimes.break_even_rows over the regimes table of
    the validated cells and their pairs, the report's rule)."""
    from .regimes import Regime, batch_label, break_even_rows, regimes_table
    shown = cells.rename(columns={"meas lo": "lo", "meas hi": "hi"}).assign(draft_name=cells["cell"])
    regimes, regime_pairs = {}, {}
    for (engine, batch), g in shown.groupby(["engine", "batch"], sort=True):
        regimes[Regime(engine, int(batch))] = g[["draft", "draft_name", "k", "measured", "lo", "hi"]]
        regime_pairs[Regime(engine, int(batch))] = pairs[pairs["draft"].isin(set(g["draft"]))]
    measured = break_even_rows(regimes_table(regimes, regime_pairs, level).df).set_index(["draft", "engine"])
    rows = []
    for draft, g in best.groupby("draft", sort=True):
        for p in break_even_table(g.drop(columns="draft")).to_dict("records"):
            row = {"draft": draft, "engine": p["engine"], "predicted break-even B": p["break-even B"]}
            if (draft, p["engine"]) in measured.index:
                m = measured.loc[(draft, p["engine"])]
                bs = m["bs"]
                row["measured break-even B"] = (f"{batch_label(m['point'], bs)} [{batch_label(m['first'], bs)} - "
                                                f"{batch_label(m['last'], bs)}]")
                row["_measured"] = m["point"]
            row["_predicted"] = p["_point"]
            rows.append(row)
    return pd.DataFrame(rows)


NARROW = 0.10   # a measured interval narrower than this share of its median: the cell can judge a 10% error


def regime_errors(cells: pd.DataFrame) -> pd.DataFrame:
    """Per regime (engine, batch) of validated cells (columns engine, batch, predicted, pred lo, pred
    hi, measured, meas lo, meas hi, ape %): the cells, the median and max APE %, the median width of
    the cells' measured intervals (percent of their median), the cells whose measured interval is
    narrower than NARROW and the max APE % among them (where a 10% error can be told from the
    measurement's own noise), and the share of cells whose measured median lies inside the
    prediction's interval (which holds the probes' spread only, not the model's error)."""
    c = cells.dropna(subset=["measured"])
    width = (c["meas hi"] - c["meas lo"]) / c["measured"] * 100
    inside = (c["measured"] >= c["pred lo"]) & (c["measured"] <= c["pred hi"])
    c = c.assign(width=width, narrow=width < NARROW * 100, inside=inside)
    rows = []
    for (engine, batch), g in c.groupby(["engine", "batch"], sort=True):
        narrow = g[g["narrow"]]
        rows.append({"engine": engine, "batch": int(batch), "cells": len(g), "median APE %": g["ape %"].median(),
                     "max APE %": g["ape %"].max(), "median meas width %": g["width"].median(),
                     "narrow cells": len(narrow), "max APE % (narrow)": narrow["ape %"].max() if len(narrow) else np.nan,
                     "measured inside pred %": 100 * g["inside"].mean()})
    return pd.DataFrame(rows)
