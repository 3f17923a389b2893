"""Each cell checked against its sweep: measurements that contradict themselves are flagged, not
read as answers, with the command that reruns just the flagged cells.

A sweep measures the same things many times over: the target's one-char pass in every cell, the
verify pass of k + 1 chars at each k, the baseline's pass count at every seed. Where those
disagree beyond what timing noise does, a cell was measured wrong (the machine changed under
it, say), whatever its interval says: the interval covers the pairs of one run, not the run.

- **verify**: for the same draft, policy, tree, engine, batch, target and workload (a pass's cost
  grows with the context it reads, and workloads' prompts differ in length), a verify pass of more
  chars (a larger k) costs less than one of fewer chars by more than VERIFY_TOL: both cells of
  the pair are flagged (which one is wrong the sweep cannot tell).
- **target pass**: a cell whose one-char target pass (median over its seeds) lies farther than
  TARGET_TOL from the median over the sweep's cells of the same target, engine, batch and workload.
- **counters**: a counter that must be the same at every seed of a cell (MATCHING_COUNTERS: the
  baseline's target passes, n_chars at batch 1) differs among its seeds.

`rerun_commands` writes the `python -m src.run -m ...` lines that rerun the flagged cells alone
(one line per group of cells that differ only in k), every seed of each, with resume=false.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import replace

import pandas as pd

from .sweep_data import CELL, CELL_PARTS, Sweep, cell_labels
from .tables import Table

VERIFY_TOL = 0.10   # a wider verify pass may come out cheaper by at most 10%: component medians of one sweep
# scatter by a few percent on a quiet machine (1% planted), and the contradicting cells were 18-24% off
TARGET_TOL = 0.20   # a cell's one-char pass within 20% of the sweep's median: the same computation in every cell;
# the cells measured 10-32% slow when the machine changed under them
MATCHING_COUNTERS = ("baseline_passes",)
VERIFY_GROUP = ["draft_name", "draft_options", "policy", "tree", "engine", "batch", "target_key", "workload"]  # all but k
TARGET_GROUP = ["target_key", "engine", "batch", "workload"]
FLAG_COLUMNS = [*CELL, "check", "reason"]


def _groups(finished: pd.DataFrame, metric: str, group: list[str]) -> list[pd.DataFrame]:
    """The cells, each with the median over its seeds of `metric`, one frame per group of `group`'s
    columns; none where the trials lack the metric."""
    if metric not in finished.columns:
        return []
    have = finished.dropna(subset=[metric])
    keys = [c for c in group if c in have.columns]
    cells = have.groupby([*CELL, *keys], dropna=False, sort=True)[metric].median().reset_index()
    return [g for _, g in cells.groupby(keys, dropna=False, sort=False)]


def verify_contradictions(finished: pd.DataFrame, tol: float = VERIFY_TOL) -> list[dict]:
    out = []
    for g in _groups(finished, "verify_pass_us", VERIFY_GROUP):
        rows = g.sort_values("k").to_dict("records")
        for i, small in enumerate(rows):
            for large in rows[i + 1:]:
                if small["verify_pass_us"] > large["verify_pass_us"] * (1 + tol):
                    why = (f"its {small['k'] + 1}-char verify pass at k = {small['k']} ({small['verify_pass_us']:,.0f} us) "
                           f"costs {small['verify_pass_us'] / large['verify_pass_us'] - 1:.0%} more than the "
                           f"{large['k'] + 1}-char one at k = {large['k']} ({large['verify_pass_us']:,.0f} us): one of "
                           f"the two was measured wrong")
                    out += [{"draft": c["draft"], "k": c["k"], "check": "verify", "reason": why} for c in (small, large)]
    return out


def target_pass_outliers(finished: pd.DataFrame, tol: float = TARGET_TOL) -> list[dict]:
    out = []
    for g in _groups(finished, "target_pass_us", TARGET_GROUP):
        if len(g) < 3:   # a median of two cells says which is off no better than either
            continue
        median = g["target_pass_us"].median()
        for c in g.to_dict("records"):
            off = c["target_pass_us"] / median - 1
            if abs(off) > tol:
                out.append({"draft": c["draft"], "k": c["k"], "check": "target pass",
                            "reason": f"its one-char target pass ({c['target_pass_us']:,.0f} us) is {off:+.0%} off the "
                                      f"sweep's median for the same target and engine ({median:,.0f} us, "
                                      f"{len(g)} cells)"})
    return out


def counter_mismatches(finished: pd.DataFrame) -> list[dict]:
    out = []
    for name in (c for c in MATCHING_COUNTERS if c in finished.columns):
        for (draft, k), g in finished.dropna(subset=[name]).groupby(CELL, sort=True):
            values = sorted(g[name].unique())
            if len(values) > 1:
                out.append({"draft": draft, "k": k, "check": "counters",
                            "reason": f"{name} differs among its seeds ({', '.join(f'{v:g}' for v in values)}), "
                                      "where every seed counts the same"})
    return out


def contradictions(finished: pd.DataFrame) -> pd.DataFrame:
    """draft, k, check, reason: one row per contradiction a cell is part of (a cell may have several)."""
    rows = verify_contradictions(finished) + target_pass_outliers(finished) + counter_mismatches(finished)
    return pd.DataFrame(rows, columns=FLAG_COLUMNS).drop_duplicates().reset_index(drop=True)


def flagged_cells(flags: pd.DataFrame) -> set[tuple[str, int]]:
    return {(d, int(k)) for d, k in zip(flags["draft"], flags["k"])}


def mark(df: pd.DataFrame, flags: pd.DataFrame, k_column: str = "k") -> pd.DataFrame:
    """`df` (rows with a draft and a k column) with a column "flagged": the checks a row's cell
    failed ("verify; target pass"), "" for a cell that contradicts nothing."""
    checks = flags.groupby(CELL)["check"].agg(lambda c: "; ".join(dict.fromkeys(c)))
    out = df.copy()
    out["flagged"] = [checks.get((d, int(k)), "") if pd.notna(k) else "" for d, k in zip(out["draft"], out[k_column])]
    return out


MARKED = ("speedup", "predicted_vs_measured")   # the tables whose rows are cells, marked in a column "flagged"


def mark_tables(tables: list[Table], flags: pd.DataFrame) -> list[Table]:
    """The report's tables with the flagged cells marked: a "flagged" column in the cell tables
    (MARKED), and in the best-k table the draft's flagged k; a recommendation that would rest on a
    flagged cell says it is not an answer."""
    if flags.empty:
        return tables
    out = []
    for t in tables:
        if t.name in MARKED:
            t = replace(t, df=mark(t.df, flags), note=t.note + FLAGGED_NOTE)
        elif t.name == "best_k":
            df = t.df.copy()
            by_draft = flags.groupby("draft")["k"].agg(lambda ks: sorted({int(k) for k in ks}))
            df["flagged k"] = [", ".join(map(str, by_draft.get(d, []))) for d in df["draft"]]
            df["recommendation"] = [not_an_answer(r, by_draft.get(d, [])) for d, r in zip(df["draft"], df["recommendation"])]
            t = replace(t, df=df, note=t.note + FLAGGED_NOTE)
        out.append(t)
    return out


FLAGGED_NOTE = (" flagged: the cell's measurements contradict the sweep's other cells (the flagged table says how): "
                "not an answer until rerun (the report's summary gives the command).")


def mark_regimes(answer: Table, regimes: dict) -> Table:
    """The answer per regime (analysis/regimes.regimes_table: draft less the regime, engine, batch,
    best k) with a column "flagged": the checks its cell failed in its regime's report (`regimes`:
    Regime -> that regime's Report)."""
    checks = {}
    for regime, rep in regimes.items():
        if rep.flags.empty:
            continue
        short = dict(zip(zip(rep.cells["draft"], rep.cells["k"].astype(int)),
                         cell_labels(rep.cells, leave_out=("engine", "batch"))))
        for (draft, k), g in rep.flags.groupby(CELL):
            checks[(regime.engine, regime.batch, short.get((draft, int(k)), draft), int(k))] = \
                "; ".join(dict.fromkeys(g["check"]))
    if not checks:
        return answer
    df = answer.df.copy()
    df["flagged"] = [checks.get((e, int(b), d, int(k)), "") for e, b, d, k in
                     zip(df["engine"], df["batch"], df["draft"], df["best k"])]
    return replace(answer, df=df, note=answer.note + FLAGGED_NOTE.replace("the report's summary", "its regime's report"))


def not_an_answer(text: str, flagged_ks: list[int]) -> str:
    """A recommendation that names a flagged k, said to be no answer."""
    m = re.search(r"speculate with k = (\d+)", text)
    if m and int(m.group(1)) in flagged_ks:
        return f"not an answer: k = {m.group(1)} is flagged (its measurement contradicts the sweep; rerun it); {text}"
    return text


OVERRIDE = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")   # a run of words and quoted strings


def _overrides(text: str) -> list[str]:
    """The sweep's overrides as its parent run recorded them, joined by spaces as Hydra got them
    (the shell's quotes gone, Hydra's kept: "k=1,2 prompt='The cat '"), split at the spaces outside
    quotes."""
    return OVERRIDE.findall(text or "")


CELL_KEYS = ("draft", "k", "engine", "batch", "policy", "verify", "verify.widths", "workload", "resume")


def rerun_commands(flags: pd.DataFrame, finished: pd.DataFrame, sweep: Sweep) -> list[str]:
    """`python -m src.run -m ...` lines that rerun the flagged cells only, every seed, resume=false:
    the sweep's own command (its sweep file, its overrides) with the cell's coordinates replacing
    the swept ones; one line per group of flagged cells that differ only in k."""
    if flags.empty:
        return []
    parts = finished.drop_duplicates("draft").set_index("draft")
    base = ["python", "-m", "src.run", "-m"]
    if sweep.name and sweep.name != "adhoc":
        base += ["--config-dir", "sweeps", "--config-name", sweep.name]
    cells = sorted(flagged_cells(flags))
    groups: dict[tuple, list[int]] = {}
    for draft, k in cells:
        p = parts.loc[draft]
        groups.setdefault(tuple(p.get(c, "") for c in CELL_PARTS), []).append(k)
    lines = []
    for key, ks in groups.items():   # one line per cell less its k (sweep_data.CELL_PARTS)
        c = dict(zip(CELL_PARTS, key))
        options = dict(o.split("=", 1) for o in str(c["draft_options"] or "").split(",") if "=" in o)
        own = [f"draft={c['draft_name']}", *(f"draft.{o}={v}" for o, v in options.items()),
               f"k={','.join(map(str, sorted(ks)))}", f"engine={c['engine']}", f"batch={int(c['batch'])}",
               f"policy={c['policy']}"]
        if c["tree"]:
            own += ["verify=tree", f"verify.widths=[{str(c['tree']).replace('-', ',')}]"]
        if isinstance(c["workload"], str) and c["workload"]:
            own.append(f"workload={c['workload']}")
        replaced = set(CELL_KEYS) | {f"draft.{o}" for o in options}
        kept = [o for o in _overrides(sweep.command_overrides) if o.split("=", 1)[0].lstrip("+~") not in replaced]
        lines.append(" ".join(base + [shlex.quote(o) for o in kept + own + ["resume=false"]]))
    return lines


def one_seed_note(finished: pd.DataFrame) -> str | None:
    """A sentence when cells have one seed: their intervals leave the run-to-run spread unmeasured."""
    seeds = finished.groupby(CELL)["seed"].nunique()
    single = int((seeds == 1).sum())
    if not single:
        return None
    which = "Every cell has" if single == len(seeds) else f"{single} of {len(seeds)} cells have"
    return (f"{which} one seed: the interval covers the pairs of that one run, not the run-to-run spread, which "
            "one seed leaves unmeasured (a rerun of the same command can land outside it); run two seeds or "
            "more (seed=0,1) to measure it.")
