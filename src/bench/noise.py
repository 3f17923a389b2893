"""The noisy-machine benchmark (printed, never asserted): `make bench-noise`.

Runs a named sweep (default `paper`; `--seeds 0,1` takes a slice of its seeds; any other Hydra
override passes through, a swept one quoted for Hydra as in "hydra.sweeper.params.k='1,8'")
twice at n_jobs=1, each into a temporary
SQLite store of its own: quiet, then loaded with a CPU hog (src/bench/hog.py: busy children
pinned one per core; by default as many as the usable cores, so that the core the timed trial
runs on is contended too, not only the others). The hog starts just before the loaded sweep and
is stopped by pid just after it, also on an error or Ctrl-C (SIGTERM too).

Each store then goes through the report's own analysis (analysis.report.build_report: the cells'
pooled medians and intervals, the extended cost model's robust fit with in-sample and held-out
errors, flagged trials, the recommendations), and the two are printed side by side:
1. the hog's measured effect (the medians over trials of the one-char target pass, the baseline
   generation and the lowest CPU/wall of a timed run; the sweep's wall time), so the load shows;
2. per cell the quiet and loaded pooled medians with their intervals, whether each median lies
   inside the other's interval, and the share of cells where both do;
3. pairs spent per trial (median, max, share that stopped at the target width) and timed seconds;
4. the cost models' median / max error in sample and with the draft held out, against the
   targets (held-out max at most 5% quiet, 10% loaded);
5. the extended model's parameters (robust fit on all drafts, without flagged trials, each
   held-out fold, and plain least squares), each marked where it sits at its bound 0 or is
   negative (unphysical: only plain least squares can be);
6. the trials flagged as outliers;
7. the recommendations, and whether one contradicts its own cell (says "speculate with k = K"
   where that cell's measured interval does not lie above 1), and whether the loaded advice
   contradicts the quiet measurement of its cell.

    python -m src.bench.noise --sweep smoke
    python -m src.bench.noise --sweep paper --seeds 0,1
    python -m src.bench.noise --sweep paper --hog-cores 1 --keep DIR     # the stores kept in DIR
"""
from __future__ import annotations

import logging
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..door import ArgParser, at_least, check_sweep, command, refuse
from ..engine.errors import SpecsweepError
from .runs import run_sweep, store_uri
from .hog import CpuHog, default_hog_cores, exit_on_sigterm, usable_cores

TARGETS = {"quiet": 5.0, "loaded": 10.0}   # the held-out max APE targets, percent
PARAMS = ["b", "o_pass", "gamma", "o_base"]
# a bounded fit leaves a parameter the data push below 0 at ~1e-15, not at 0 exactly (trf stays
# inside the bounds): below this it counts as at the bound (b, gamma: fractions; o_*: us per pass)
AT_BOUND = 1e-6
RECOMMENDED = re.compile(r"^speculate with k = (\d+)")


@dataclass
class Condition:
    name: str          # "quiet" or "loaded"
    wall: float        # the sweep command's wall seconds
    report: object     # analysis.report.Report
    hog: str = ""      # what loaded the machine, in words


# --- pure functions of the analysis' frames (tests/tools/test_bench_noise.py plants numbers) -----------

def inside(x: float, lo: float, hi: float) -> bool:
    return bool(lo <= x <= hi)


def cell_agreement(quiet: pd.DataFrame, loaded: pd.DataFrame) -> pd.DataFrame:
    """Per cell measured in both (frames with draft, k, measured, lo, hi: the report's cells): both
    medians and intervals, whether each median lies inside the other's interval, and agree (both)."""
    cols = ["draft", "k", "measured", "lo", "hi"]
    both = quiet[cols].dropna().merge(loaded[cols].dropna(), on=["draft", "k"], suffixes=("_quiet", "_loaded"))
    both["quiet in loaded"] = [inside(m, lo, hi) for m, lo, hi in
                               zip(both["measured_quiet"], both["lo_loaded"], both["hi_loaded"])]
    both["loaded in quiet"] = [inside(m, lo, hi) for m, lo, hi in
                               zip(both["measured_loaded"], both["lo_quiet"], both["hi_quiet"])]
    both["agree"] = both["quiet in loaded"] & both["loaded in quiet"]
    return both.sort_values(["draft", "k"]).reset_index(drop=True)


def pairs_spent(finished: pd.DataFrame, pairs: pd.DataFrame | None = None) -> dict:
    """Per trial pairs (metric pairs_used; for runs without it, their pair histories counted in
    `pairs`, the analysis' long frame): median, max, the share that stopped at the target width
    (NaN: fixed pairs, no trial logged width_reached), and the trials' timed seconds in all."""
    if "pairs_used" in finished:
        used = finished["pairs_used"].astype(float)
    else:
        used = pairs.groupby(["draft", "k", "seed"]).size().astype(float) if pairs is not None else pd.Series(dtype=float)
    width = finished["width_reached"].dropna() if "width_reached" in finished else pd.Series(dtype=float)
    return {"trials": len(finished), "median": used.median(), "max": used.max(),
            "width share": width.mean() if len(width) else np.nan,
            "timed s": finished["timed_s"].sum() if "timed_s" in finished else np.nan}


def rounds_spent(finished: pd.DataFrame) -> dict:
    """Per trial cost rounds (metric cost_rounds): median, max, and the share that stopped at the
    cost width (NaN where no trial logged cost_width_reached: fixed rounds, trees, older runs)."""
    used = finished["cost_rounds"].dropna().astype(float) if "cost_rounds" in finished else pd.Series(dtype=float)
    width = finished["cost_width_reached"].dropna() if "cost_width_reached" in finished else pd.Series(dtype=float)
    return {"trials": len(used), "median": used.median(), "max": used.max(),
            "width share": width.mean() if len(width) else np.nan}


def parameter_flags(fit) -> tuple[list[str], list[str]]:
    """(parameters at the bound 0 (within AT_BOUND), negative parameters) of an extended fit; in the
    free-loop form delta too, and o_pass is the measured median loop overhead, negative only if the
    free loop ran faster than the verify pass timed alone."""
    values = {p: getattr(fit, p) for p in PARAMS + (["delta"] if getattr(fit, "free_loop", False) else [])}
    return ([p for p, v in values.items() if 0 <= v < AT_BOUND], [p for p, v in values.items() if v < 0])


def recommended_k(text: str) -> int | None:
    """K of a recommendation "speculate with k = K ...", None for "not demonstrated: ..."."""
    m = RECOMMENDED.match(text)
    return int(m.group(1)) if m else None


def contradiction(cells: pd.DataFrame, draft: str, text: str) -> str:
    """Why the recommendation `text` for `draft` contradicts its own cell in `cells` (the report's
    cells: draft, k, measured, lo, hi), or "" where it does not: it speculates with a k whose
    measured interval does not lie above 1. A model-only recommendation (its cell unmeasured) and
    "not demonstrated" claim nothing a cell could contradict."""
    k = recommended_k(text)
    if k is None:
        return ""
    cell = cells[(cells["draft"] == draft) & (cells["k"] == k)]
    if cell.empty or pd.isna(cell["measured"].iloc[0]):
        return ""
    lo, hi, median = cell["lo"].iloc[0], cell["hi"].iloc[0], cell["measured"].iloc[0]
    return "" if lo > 1 else f"k = {k} measured {median:.2f}x, interval {lo:.2f}-{hi:.2f}, not above 1"


def effect(quiet: pd.DataFrame, loaded: pd.DataFrame) -> list[tuple[str, float, float]]:
    """(what, quiet, loaded): the medians over finished trials of what the hog slows or takes away."""
    rows = []
    for col, what in [("target_pass_us", "one-char target pass, us"), ("verify_pass_us", "verify pass, us"),
                      ("baseline_s_median", "baseline generation, s"), ("speculative_s_median",
                                                                         "speculative generation, s"),
                      ("min_cpu_wall_ratio", "lowest CPU/wall of a timed run")]:
        if col in quiet and col in loaded:
            rows.append((what, float(quiet[col].median()), float(loaded[col].median())))
    return rows


# --- running and printing ----------------------------------------------------------------------

def analyse(uri: str):
    """The report's analysis of the one sweep in the store at `uri`."""
    from analysis.sweep_data import DEFAULT_EXPERIMENT, connect, load_sweep
    from analysis.report import build_report
    return build_report(load_sweep(connect(uri), DEFAULT_EXPERIMENT))


def run_condition(name: str, sweep: str, folder: Path, overrides: list[str], hog: CpuHog | None) -> Condition:
    what = f" with {hog.cores} hog process{'es' * (hog.cores != 1)} (duty {hog.duty:g})" if hog else ""
    print(f"running the {sweep} sweep {name} at n_jobs=1{what} ...", flush=True)
    t0 = time.perf_counter()
    if hog is None:
        run = run_sweep(sweep, 1, folder, overrides)
        note = "none"
    else:
        with hog:
            pids = hog.pids
            run = run_sweep(sweep, 1, folder, overrides)
            alive = hog.alive()
        note = f"{hog.cores} busy process{'es' * (hog.cores != 1)}, duty {hog.duty:g}, pids {pids}"
        if alive < hog.cores:
            note += f"; WARNING: only {alive} still running at the end"
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    return Condition(name, run.wall, analyse(store_uri(folder)), note)


def fmt(x, spec: str = ".3f") -> str:
    return "" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def table(header: list[str], rows: list[list]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


def print_effect(q: Condition, l: Condition) -> None:
    print(f"\n## The load (quiet: {q.hog}; loaded: {l.hog})\n")
    rows = [[what, fmt(a, ".4g"), fmt(b, ".4g"), fmt(b / a, ".2f")]
            for what, a, b in effect(q.report.data.finished, l.report.data.finished)]
    rows.append(["sweep wall time, s", fmt(q.wall, ".0f"), fmt(l.wall, ".0f"), fmt(l.wall / q.wall, ".2f")])
    table(["median over trials", "quiet", "loaded", "loaded / quiet"], rows)


def print_cells(q: Condition, l: Condition) -> None:
    a = cell_agreement(q.report.cells, l.report.cells)
    from analysis.aggregate import configured_level
    level = configured_level(q.report.data.finished)  # the level the report's cells were computed at
    print(f"\n## Cells: pooled median [interval at {level:.0%}], quiet vs loaded\n")
    table(["draft", "k", "quiet", "loaded", "quiet median in loaded interval", "loaded median in quiet interval"],
          [[r["draft"], r["k"], f"{r['measured_quiet']:.3f} [{r['lo_quiet']:.3f}-{r['hi_quiet']:.3f}]",
            f"{r['measured_loaded']:.3f} [{r['lo_loaded']:.3f}-{r['hi_loaded']:.3f}]",
            "yes" if r["quiet in loaded"] else "NO", "yes" if r["loaded in quiet"] else "NO"]
           for _, r in a.iterrows()])
    print(f"\nCells whose medians agree (each inside the other's interval): {int(a['agree'].sum())}/{len(a)}"
          f" ({a['agree'].mean():.0%})" if len(a) else "\nNo cell measured in both conditions.")


def print_pairs(q: Condition, l: Condition) -> None:
    print("\n## Pairs spent per trial\n")
    rows = []
    for c in (q, l):
        p = pairs_spent(c.report.data.finished, c.report.data.pairs)
        rows.append([c.name, p["trials"], fmt(p["median"], "g"), fmt(p["max"], "g"),
                     fmt(p["width share"], ".0%") or "fixed pairs", fmt(p["timed s"], ".0f")])
    table(["condition", "trials", "median", "max", "stopped at the target width", "timed runs, s in all"], rows)
    rows = []
    for c in (q, l):
        r = rounds_spent(c.report.data.finished)
        if r["trials"]:
            rows.append([c.name, r["trials"], fmt(r["median"], "g"), fmt(r["max"], "g"),
                         fmt(r["width share"], ".0%") or "fixed rounds"])
    if rows:
        print("\n## Cost rounds per trial\n")
        table(["condition", "trials", "median", "max", "stopped at the cost width"], rows)


def model_error_rows(c: Condition) -> pd.DataFrame:
    return next(t.df for t in c.report.tables if t.name == "model_errors").set_index("model")


def print_errors(q: Condition, l: Condition) -> None:
    print("\n## Cost model errors (APE over cells, %)\n")
    eq, el = model_error_rows(q), model_error_rows(l)
    table(["model", "quiet median", "quiet max", "loaded median", "loaded max"],
          [[m, fmt(eq.at[m, "median APE %"], ".1f"), fmt(eq.at[m, "max APE %"], ".1f"),
            fmt(el.at[m, "median APE %"], ".1f"), fmt(el.at[m, "max APE %"], ".1f")] for m in eq.index])
    held = "extended (draft held out)"
    for c, e in ((q, eq), (l, el)):
        worst = e.at[held, "max APE %"] if held in e.index else np.nan
        verdict = "no held-out fit" if np.isnan(worst) else "met" if worst <= TARGETS[c.name] else "MISSED"
        print(f"- {c.name}: held-out max error {fmt(worst, '.1f')}% against the target of at most "
              f"{TARGETS[c.name]:g}%: {verdict}")
        if held in e.index and e.at[held, "inside interval"]:
            print(f"  its cells inside their bootstrap interval: {e.at[held, 'inside interval']} (the interval "
                  f"overlapping the measured one: {e.at[held, 'intervals overlap']}), "
                  f"median width {fmt(e.at[held, 'interval width %'], '.0f')}% of the prediction")


def fits(c: Condition) -> list[tuple[str, object]]:
    m = c.report.models
    out = [("robust, all drafts", m.fit)]
    if m.without_flagged is not None and m.without_flagged is not m.fit:
        out.append(("robust, without flagged trials", m.without_flagged))
    out += [(f"robust, without {d}", f) for d, f in m.held_out.items()]
    out.append(("plain least squares, all drafts", m.plain))
    return [(name, f) for name, f in out if f is not None]


def print_fits(q: Condition, l: Condition) -> None:
    print("\n## Extended model: fitted parameters (b, gamma, delta: fractions; o_pass, o_base: us per pass; "
          "form free loop: o_pass measured, delta fitted)\n")
    rows = []
    for c in (q, l):
        for name, f in fits(c):
            at_bound, negative = parameter_flags(f)
            rows.append([c.name, name, "free loop" if f.free_loop else "o_pass fitted", fmt(f.b, ".4g"),
                         fmt(f.o_pass, ".4g"), fmt(f.gamma, ".4g"), fmt(f.delta, ".4g") if f.free_loop else "-",
                         fmt(f.o_base, ".4g"), f.trials, ", ".join(at_bound) or "-", ", ".join(negative) or "-"])
    table(["condition", "fit", "form", "b", "o_pass", "gamma", "delta", "o_base", "trials", "at the bound 0",
           "negative (unphysical)"], rows)


def print_flagged(q: Condition, l: Condition) -> None:
    print("\n## Flagged trials (component times far from their cell's other seeds)\n")
    for c in (q, l):
        trials = [f"{d} k={k} seed={seed} (" + ", ".join(
                      f"{r['component']} {r['value']:.1f} vs {r['cell median']:.1f}, z {r['robust z']:.1f}"
                      for _, r in g.iterrows()) + ")"
                  for (d, k, seed), g in c.report.models.flagged.groupby(["draft", "k", "seed"], sort=True)]
        print(f"- {c.name}: {len(trials)} trial{'s' * (len(trials) != 1)}{': ' if trials else ''}"
              + "; ".join(trials))


def recommendations(c: Condition) -> dict[str, str]:
    best = next((t.df for t in c.report.tables if t.name == "best_k"), pd.DataFrame(columns=["draft"]))
    return dict(zip(best["draft"], best["recommendation"])) if "recommendation" in best else {}


def print_recommendations(q: Condition, l: Condition) -> None:
    print("\n## Recommendations\n")
    rq, rl = recommendations(q), recommendations(l)
    rows = []
    for draft in sorted(set(rq) | set(rl)):
        tq, tl = rq.get(draft, ""), rl.get(draft, "")
        cq, cl = contradiction(q.report.cells, draft, tq), contradiction(l.report.cells, draft, tl)
        cross = contradiction(q.report.cells, draft, tl)  # loaded advice against the quiet measurement
        rows.append([draft, tq, f"YES: {cq}" if cq else "no", tl, f"YES: {cl}" if cl else "no",
                     f"YES: {cross}" if cross else "no", "yes" if recommended_k(tq) == recommended_k(tl) else "no"])
    table(["draft", "quiet", "contradicted by its cell", "loaded", "contradicted by its cell",
           "loaded advice contradicted by the quiet cell", "same advice (k or none)"], rows)


def print_header(q: Condition, l: Condition, sweep: str, overrides: list[str]) -> None:
    finished = pd.concat([q.report.data.finished, l.report.data.finished])
    cpus = sorted(finished["cpu_model"].dropna().astype(str).unique()) if "cpu_model" in finished else []
    print(f"\n# Noisy-machine benchmark: the {sweep} sweep{' ' + ' '.join(overrides) if overrides else ''}, "
          f"quiet vs loaded, n_jobs=1\n")
    print(f"{len(usable_cores())} usable cores; CPU model {', '.join(cpus) or 'unknown'}; "
          f"quiet: {len(q.report.data.finished)} finished trials, loaded: {len(l.report.data.finished)}.")


def report(q: Condition, l: Condition) -> None:
    for part in (print_effect, print_cells, print_pairs, print_errors, print_fits, print_flagged,
                 print_recommendations):
        part(q, l)


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m src.bench.noise", description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", default="paper")
    ap.add_argument("--hog-cores", type=at_least(0), default=default_hog_cores(),
                    help="busy processes, one pinned per usable core (default: every usable core, %(default)s)")
    ap.add_argument("--hog-duty", type=float, default=1.0,
                    help="share of each 0.1 s the hog spins (default 1: all the time)")
    ap.add_argument("--keep", type=Path, help="keep the two stores in this folder (quiet/, loaded/) instead of "
                                              "a temporary one")
    ap.add_argument("--seeds", help="a slice of the sweep's seeds, e.g. 0,1 (hydra.sweeper.params.seed)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for both runs")
    args = ap.parse_args(argv)
    return command(lambda: measure_noise(args))


def measure_noise(args) -> None:
    check_sweep(args.sweep)
    if args.seeds is not None:
        if not re.fullmatch(r"\d+(,\d+)*", args.seeds):
            refuse(f"--seeds takes seeds separated by commas, e.g. 0,1; got {args.seeds!r}")
        # quoted for Hydra, so that the list reaches the sweeper instead of sweeping Hydra's own config
        args.overrides.append(f"hydra.sweeper.params.seed='{args.seeds}'")
    hog = CpuHog(cores=args.hog_cores, duty=args.hog_duty)
    if args.keep is not None and any((args.keep / c).exists() for c in ("quiet", "loaded")):
        # a sweep into a store that holds it already would resume it: nothing would be measured
        raise SpecsweepError(f"{args.keep} holds quiet/ or loaded/ already: name a new folder")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    exit_on_sigterm()  # SIGTERM unwinds like Ctrl-C: the hog's `with` block stops its children on the way out
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        quiet = run_condition("quiet", args.sweep, root / "quiet", args.overrides, None)
        loaded = run_condition("loaded", args.sweep, root / "loaded", args.overrides, hog)
    print_header(quiet, loaded, args.sweep, args.overrides)
    report(quiet, loaded)


if __name__ == "__main__":
    sys.exit(main())
