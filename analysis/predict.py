"""`python -m analysis.predict`: a draft's speedup predicted for every k before any sweep runs.

    python -m analysis.predict draft=ngram                          # k = 1, 2, 4, 8, 16
    python -m analysis.predict draft=int8 k=2,4 temperature=0.7 model=tiny data=synthetic
    python -m analysis.predict draft=distilled verify=tree          # the drafts_tree sweep's shapes
    python -m analysis.predict draft=ngram --fit-sweep ID           # with a sweep's fitted loop overheads
    python -m analysis.predict draft=ngram engine=compiled batch=16 # another engine, a batch of 16 sequences
    python -m analysis.predict draft=ngram engine=eager,compiled batch=1,4,16   # per regime; break-even batch
    python -m analysis.predict --validate --sweep-id ID [--fit-sweep ID --fit-drafts bigram,int8,int4]
    python -m analysis.predict --validate --sweep-id ID --fit-sweep ID --hold-out   # per cell: other drafts, regimes

Any `KEY=VALUE` is a Hydra override of conf/ (as for `python -m src.run`); `k=` takes a comma list.
It measures only what is cheap (a minute or two on 2 cores, against a sweep's minutes per cell); the
target and the draft come from the cache as a trial's do (trained and cached first if missing):
- acceptance: for a chain, at each k, `--seqs` speculative generations of the config's n_chars
  (seeds seed, seed+1, ...; the loop's counters only, nothing timed), each pass adding the
  probability that drafts 1..i of its drawn chain are all accepted, r_1 ... r_{i-1} beta_i
  (src/engine/measuring/acceptance.py: loop_survival): S_i, averaged over the loop's own passes, so at the
  prefixes where the loop starts them (after a residual or a bonus char; uniform prefixes of target
  text overstated the chars per pass by 2-7% on the medium target). Position matters (draft i is
  kept only if 1..i-1 were; a draft's i-th guess is worse than its first): S_i is measured per
  position, not assumed to be a^i. The mean overlap a = sum_x min(p, q) at uniform positions of
  `--seqs` sequences sampled from the target is printed beside it. For a tree: the mean accepted
  path length over trees drawn at every `--every`-th prefix of those sequences, exact given each tree.
- costs: `measure_cost` at each k (each tree shape), as a trial measures them: t1 (a 1-char
  target pass), tv(k) (a (k+1)-char verify pass; a tree's verify pass) and td (draft time per
  drafted char or node), in `--rounds` interleaved rounds, under the host's timing lock. measure_cost times
  one proposal over and over, so a draft that memoizes rows (the table drafts) is timed warm; for
  such a draft td is instead the cold cost the loop pays (`replay_draft_costs`: one pass's
  drafting every cpp(k) chars along the sampled text, memos dropped per sequence; in a chain each
  right after an untimed (k+1)-char verify pass, as in the loop, at a batch of B an untimed
  (B, k+1) one before every B proposals), and the warm c is printed beside it. A draft running a
  model of its own (int8, int4, a small model: a `ModelDraft`), in a chain of fixed k, is timed as
  the loop runs it as well: right after a verify pass, catching up one char (after a rejection)
  or two (after a full accept) in the shares of the loop's passes (S_k, measure_cost's
  `in_loop`; at a batch every row catches up two, measure_batch_cost's); td is that, less the
  verify pass, and the c of its proposal timed alone is printed beside it ("c alone"). Timed alone, the
  proposal runs with its own weights warm in the caches; in the loop the target's pass has just
  displaced them (docs/method.md has the two measured side by side).
Prediction per k (pure functions below, no loop is run):
    chars per pass   cpp(k) = 1 + S_1 + ... + S_k                       (tree: 1 + E[path length])
    speedup          cpp(k) (t1 + o_base) / (tv(k) + o_pass + n(k) td (1 + gamma))
with n(k) = k drafted chars (tree: mean drafted nodes per pass) and o_base, o_pass (us), gamma the
loop overheads. For a chain of fixed k in the tool's own loop they are measured per setting, as
a trial at batch 1 measures them (`loop_probes`; at B > 1 the batch's loops, `batch_loop_probes`;
engine=transformers measures its loop's own way, below; a draft whose replay diverges from its
recorded run gets none, said in a warning): the baseline loop of n_chars and the speculative loop
replaying one recorded run's proposals at no drafting cost (src/engine/measuring/replay.py) are timed in the
same interleaved rounds as t1, tv and td, o_base = the baseline loop's step beyond t1 and o_pass =
the free loop's pass beyond tv (the table's o_base and o_pass columns); gamma, a draft's in-loop
excess over its td, is 0 (a model draft's td is its in-loop time, above). Elsewhere
(trees, policies), or with `--fit-sweep` (then td is the lone proposal's throughout), they are the
extended cost model's (analysis/cost_models.py, its (o_pass, gamma) form) fitted on a finished sweep's trials (its drafts in `--fit-drafts`; fitted on that
sweep's machine, so the overheads in microseconds carry over only to a machine of that speed);
without it all three are 0 there and the output says so. With them 0 and tv = t1 the formula is
the seed's cpp / (1 + k c).
The recommended setting is the one with the highest predicted speedup; where none is above 1x, the
advice is not to speculate; where its interval reaches 1x, the advice says the probes cannot tell it
from no gain.

Interval (lo-hi): how far the probes' own sampling and timing spread move the prediction
(`replicates`): 2,000 bootstrap replicates, each resampling the sampled sequences (a batch probe: its
runs) for the chars per pass and the drafted chars per pass, the timing rounds (one draw of round
indices for t1, tv and td: they were timed interleaved, a round at one machine speed) for the
component times (with a chain's measured loops, timed in those rounds), and a table draft's
cold-cost replays for its td; the central 95%. Fitted loop overheads are held at their values, and
the cost model's own error is not in it (--validate measures that). On planted probes of 16 sequences and 15 rounds it covers the true speedup 93.8% of
the time (tests/analysis/test_predict_interval.py): a little short of 95%, as a bootstrap of 16
sequences and of a median over 15 rounds is. What changes from one run of the probes to the next
(the machine's state, compiled graphs, memory layout) is not in one run's interval: on the 2-core
machine two runs of the same probes moved a prediction by up to 8%, and a compiled batch draft's c
by 20% (docs/results.md). `--runs R` runs the probes R times, one run after another over every
regime (or every validated cell), so each regime's runs are spread over the whole command; run r
samples its sequences from seed + r seqs (`probe_seed`). Every value printed is then the median
over the runs (`combine_runs`: one run caught in a slow or fast spell does not move the
prediction), and the interval is that of the runs' replicates pooled, so the spread between runs
is in it too. `make bench-predict` runs one probe run after each round of the sweep's seeds.

Regimes: `engine=` and `batch=` take comma lists; each (engine, batch) regime is predicted in turn
(a regime none of whose settings can run, such as transformers at B > 1, is left out with its reason before
any is measured), then the best predicted setting per regime, its interval one that holds for all
the regime's settings at once (`best_over_settings`), and per engine with two batch sizes or more the predicted
break-even batch (`break_even_table`: where the best predicted speedup, and its interval's lower and
upper ends, fall below 1x, linear in log2 B between the sizes given, the rule of the report's
measured batch table).

--validate predicts every cell of a finished sweep (same target, temperature, n_chars and batch
prompts as its trials, drafts built as the trials built them) and prints, per cell, predicted and measured (the
pooled median over every pair of the cell's seeds, as the report) with APE = |pred - meas| / meas
(and the predicted chars per pass beside the trials' median, both intervals beside their medians),
then median and max APE for the seed's drafts (bigram, int8, int4) and the new drafts apart, and
per regime (engine x batch; `regime_errors`) the median and max APE beside the measured cells'
interval widths, the max APE over the cells measured to within 10%, and how often the measured
median falls inside the prediction's interval. Nothing of the validated sweep enters its
predictions unless `--fit-sweep` names that sweep itself (its overheads would then be fitted on the
cells they are judged on; `--fit-drafts` other drafts than those judged keeps them held out).
`--hold-out` fits each cell's overheads on the `--fit-sweep` sweep's trials of the other drafts in
the other regimes only (`held_out_overheads`): with `--fit-sweep` the validated sweep itself, no
cell's prediction has seen its draft or its regime. It also prints when the sweep's trials ran
and how long after them the probes began (`probes_after`): the machine's drift in between is part
of each error. `--sweep-id A,B,C` validates several sweeps read as one (`sweep_data.load_sweeps`: the
seed rounds of one sweep). `make bench-predict` (src.bench.predict) runs the sweep one seed round
at a time with a probe run of every cell after each (`validate_sweep`'s `between`), so the probes
and the trials they are judged against sample the machine in the same stretch of time
(`rounds_timing` prints when each round ran).

Under an adaptive draft-length policy (`policy=`, k its cap; `measure_policy`) the chars per pass
and the drafted-length distribution come from the loop's own counters under the policy, tv is the
expected verify pass under that distribution and the drafted chars per pass are its mean.
On another engine (`engine=`) the target and a model draft run on it, as in a trial; on
transformers' loop (`engine=transformers`; `measure_library`) the chars per pass come from the
library's own counters over `--seqs` runs, the costs are the library's (its pass, its verify
pass per width drafted, its assistant's generate or prompt lookup per drafted char), and its loop
overheads are measured with them instead of fitted (o_base = its plain step beyond its one-char
pass, o_pass taken equal, unless --fit-sweep gives them). At `batch=B`
(B > 1; `measure_batch`) the chars per pass come from the batch loop's own counters (a sequence's
chars over the batch's passes: the batch waits for its slowest sequence) and the costs are taken
at (B, width), the batch's baseline loop and its loop replaying a recorded batch run timed with
them (o_base, o_pass at B): the same formula then predicts the throughput speedup. --validate reads each cell's
engine and batch from its trials; other settings of the sweep (the model, the data, ...) are overrides.

A k the draft or the context window cannot take is left out with a line saying why. Bad input
(unknown draft, no setting or regime left, a bad k, engine or batch list, engine= or batch= with
--validate, no such store or sweep, another target than the sweep's) ends with one line on stderr
and exit status 2; the command writes no file of its own.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import yaml

from src.engine.measuring.formula import Overheads, chars_per_pass, iid_chars_per_pass, seed_speedup, speedup

DEFAULT_KS = (1, 2, 4, 8, 16)
TREE_SWEEP = "drafts_tree"      # verify=tree without verify.widths: this sweep's shapes
INTERVAL_LEVEL = 0.95           # the predicted speedup's interval: central share of the replicates
INTERVAL_REPS = 2000            # bootstrap replicates of the probes
INTERVAL_SEED = 0               # seeded: a prediction's interval is reproducible from its probes


# ---- the math: src/engine/measuring/formula.py --------------------------------------------------
@dataclass(frozen=True)
class Spread:
    """What one setting's probes drew, kept for its interval (`replicates`).

    units: one row per sampled sequence (a batch probe: per run), (chars, passes, drafted): the
    setting's chars per pass is sum(chars) / sum(passes), its drafted chars (nodes) per pass
    sum(drafted) / sum(passes). rounds: "target", "verify", "draft" -> one time per timing round in
    us (the draft per drafted char), as measure.component_times keeps them. replays: a table draft's
    cold cost per drafted char, one per replay (`replay_draft_costs`), times draft_scale (B at a
    batch of B), which then stands for the draft time instead of the rounds'."""
    units: np.ndarray
    rounds: dict
    replays: tuple = ()
    draft_scale: float = 1.0


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
    sp: Spread | None = m.get("spread")
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


def probe_seed(seed: int, seqs: int, run: int) -> int:
    """The first seed of probe run `run` (0-based): run r samples its sequences from seeds seed + r
    seqs on, so the runs' sequences are disjoint."""
    return seed + run * seqs


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


# ---- measuring: the target, the draft, the clock --------------------------------------------------
def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(flags for argparse, Hydra overrides KEY=VALUE)."""
    flags, overrides, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            flags.append(arg)
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("-") and arg not in NO_VALUE:
                flags.append(argv[i + 1])
                i += 1
        else:
            overrides.append(arg)
        i += 1
    return flags, overrides


NO_VALUE = {"--validate", "--hold-out", "-h", "--help"}


def positive_ints(key: str, value: str) -> list[int]:
    """The sorted distinct integers of a `key=` comma list, each >= 1, else one line of bad input."""
    from src.engine.errors import SpecsweepError
    try:
        values = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise SpecsweepError(f"{key} must be a comma list of integers >= 1, got {value!r}")
    return values


def parse_ks(overrides: list[str]) -> tuple[list[int] | None, list[str]]:
    """(the ks of a `k=` override, None if absent; the other overrides)."""
    ks, rest = None, []
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "k":
            ks = positive_ints(key, value)
        else:
            rest.append(o)
    return ks, rest


def parse_regimes(overrides: list[str]) -> tuple[list[str] | None, list[int] | None, list[str]]:
    """(the engines of an `engine=` comma list, the sizes of a `batch=` comma list, each None if
    absent; the other overrides). Several of either: one prediction per (engine, batch) regime."""
    from src.engine.errors import SpecsweepError
    engines, batches, rest = None, None, []
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "engine":
            engines = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
            if not engines:
                raise SpecsweepError(f"engine must be a comma list of engines, got {value!r}")
        elif key == "batch":
            batches = positive_ints(key, value)
        else:
            rest.append(o)
    return engines, batches, rest


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    import src.sweep  # noqa: F401  (its warning filter, before Hydra composes the launcher configs)
    from src.engine.errors import SpecsweepError
    from src.paths import CONF_DIR
    from src.trial.conf import check_group_choices
    check_group_choices(overrides)
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose("config", overrides=overrides)
    except HydraException as e:
        raise SpecsweepError(str(e).strip().splitlines()[0]) from None


def tree_shapes(cfg, overrides: list[str]) -> list[tuple[int, ...]] | None:
    """None for a chain; for verify=tree the shape of a `verify.widths=` override, else the
    shapes the drafts_tree sweep runs."""
    from omegaconf import OmegaConf
    from src.paths import SWEEPS_DIR
    if cfg.verify.name != "tree":
        return None
    if any(o.startswith("verify.widths=") for o in overrides):
        return [tuple(OmegaConf.to_container(cfg.verify.widths))]
    sweep = OmegaConf.load(SWEEPS_DIR / f"{TREE_SWEEP}.yaml")
    return [tuple(w) for w in yaml.safe_load("[" + str(sweep.hydra.sweeper.params["verify.widths"]) + "]")]


def settings(cfg, ks: list[int], shapes) -> dict:
    """label -> TrialSpec of each setting the draft and the context can take; the others are
    reported and dropped. A chain's label is its k, a tree's its widths."""
    from omegaconf import open_dict
    from src.engine.errors import SpecsweepError
    from src.trial.spec import tree_label, trial_spec
    out, refused = {}, []
    for k, widths in ([(len(w), w) for w in shapes] if shapes else [(k, None) for k in ks]):
        c = cfg.copy()
        with open_dict(c):
            c.k = k
            if widths is not None:
                c.verify.widths = list(widths)
        try:
            spec = trial_spec(c)
        except SpecsweepError as e:
            refused.append((f"{'tree ' + tree_label(widths) if widths else f'k={k}'}", str(e)))
            continue
        out[tree_label(widths) if widths else k] = spec
    said = "; ".join(f"{label} ({why})" for label, why in refused)
    if refused and out:
        print("left out: " + said)
    if not out:   # one reason for every setting (the regime itself is refused): said once
        raise SpecsweepError("no setting left to predict: "
                             + (refused[0][1] if len({why for _, why in refused}) == 1 else said))
    return out


@dataclass
class Measured:
    target_key: str
    a: float                  # mean overlap at the first drafted position
    survival: np.ndarray      # S_1..S_kmax at the largest k's pass starts (chains; empty for trees)
    costs: dict               # label -> component times (us), cpp and drafted chars (nodes) per pass
    seconds: float
    overheads: Overheads | None = None   # measured with the costs (engine=transformers), else None


def measure(cfg, ks: list[int], shapes, seqs: int, every: int, seed: int, loaded=None, rounds: int = 15) -> Measured:
    """Acceptance and component costs of cfg's draft for each setting (module docstring)."""
    import time

    import torch
    from src.engine.measuring.acceptance import loop_survival, mean_overlap, sample_text, tree_chars_rows
    from src.engine.drafts.model_draft import ModelDraft
    from src.engine.measuring.measure import measure_cost, replay_draft_costs, verify_pass
    from src.engine.decoding.tree import build_tree
    from src.engine.runtimes.engines import Engine
    from src.trial.load import build_draft, load_target
    from src.trial.timing_lock import timing_lock
    t0 = time.perf_counter()
    chosen = settings(cfg, ks, shapes)
    first = next(iter(chosen.values()))   # every setting shares the target, the draft and the text
    torch.set_num_threads(first.threads)
    corpus, target = loaded if loaded is not None else load_target(first.target, progress=False)
    target.model.to(first.device)
    draft = build_draft(first.draft, first.target, target, corpus)
    engine = Engine(first.engine.name, first.engine.mode, first.engine.options,
                    first.target.data.cache_dir / "compiled")     # predicted on the engine the trials run on
    model = engine.wrap(target.model)
    engine.wrap_draft(draft)
    prompt = target.tokenizer.encode(first.prompt).tolist()
    T, n = first.temperature, first.n_chars
    seq, p = sample_text(target.model, prompt, seqs, n, seed, T)   # untimed: eager, not a batch-of-seqs graph
    a = float("nan") if draft.library_only else mean_overlap(draft, seq, p, T)   # prompt lookup: no q of its own
    survival, trees, chains, units = np.zeros(0), {}, {}, {}
    if first.engine.name == "transformers":
        return measure_library(chosen, target, draft, prompt, a, seqs, seed, rounds, t0)
    if first.batch > 1:
        return measure_batch(chosen, model, draft, corpus, target, seq, a, seqs, seed, rounds, t0)
    if first.policy.name != "fixed":
        return measure_policy(chosen, model, draft, target, prompt, seq, a, seqs, seed, rounds, t0)
    if shapes:
        for label, c in chosen.items():
            rows = tree_chars_rows(model, draft, seq, n, c.tree, T, seed, every)
            units[label] = np.array([(chars, trees_, nodes) for chars, nodes, trees_ in rows], dtype=float)
            count = units[label][:, 1].sum()
            trees[label] = (units[label][:, 0].sum() / count, units[label][:, 2].sum() / count)
    else:  # each k at the loop's own pass starts: seqs generations of n_chars, one seed each
        for label, c in chosen.items():
            runs = [loop_survival(model, draft, prompt, n, c.k, T, [s]) for s in range(seed, seed + seqs)]
            totals = [surv.numpy() * passes for surv, passes, _ in runs]       # survival summed over passes
            passes = sum(p for _, p, _ in runs)
            chains[label] = sum(totals) / passes
            units[label] = np.array([(p + t.sum(), p, p * c.k) for t, (_, p, _) in zip(totals, runs)], dtype=float)
        survival = chains[max(chosen, key=lambda label: chosen[label].k)]
    costs, gen = {}, torch.Generator().manual_seed(seed)
    # a chain's loops, timed with its components as a trial times them: the baseline loop and the loop
    # replaying one recorded run's proposals (its seed's; the recording and its check run untimed)
    loops = {label: None if shapes else loop_probes(model, draft, prompt, n, c.k, T, c.device, seed)
             for label, c in chosen.items()}
    own_model = isinstance(draft, ModelDraft)   # a draft running a model of its own: timed in the loop's order too
    with timing_lock(first.timing):
        for label, c in chosen.items():
            full = float(chains[label][c.k - 1]) if own_model and not shapes else None   # share of full accepts
            m = measure_cost(model, draft, prompt, c.k, T, c.timing.cost_reps, c.device, rounds, c.tree,
                             loops=loops[label], keep_rounds=True, in_loop=full)
            if full is not None:
                in_loop_td(m)
            if loops[label]:
                m["overheads"] = loop_overheads(m)
            m = {"k": c.k, **m, "nodes": trees[label][1] if shapes else c.k}
            m["cpp"] = trees[label][0] if shapes else chars_per_pass(chains[label], c.k)
            replays = ()
            if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
                def one_pass(prefix, k=c.k, widths=c.tree):
                    if widths is None:
                        return len(draft.propose(prefix, k, T, gen)[0])
                    return build_tree(draft, prefix, widths, T, gen).n_nodes
                after_verify = None if shapes else verify_pass(model, prompt, c.k, c.device)   # as in the loop
                replays = tuple(replay_draft_costs(draft, seq, n, m["cpp"], one_pass, before=after_verify))
                m["draft_char_us_warm"] = m["draft_char_us"]
                m["draft_char_us"] = float(np.median(replays))
            m["spread"] = Spread(units[label], m.pop("rounds_us"), replays)
            costs[label] = m
    return Measured(target.key, a, survival, costs, time.perf_counter() - t0)


MEASURED_LOOPS = ("measured per setting with its components (o_base: the baseline loop's step beyond its one-char "
                  "pass; o_pass: the loop replaying a recorded run's proposals, at no drafting cost, per pass beyond "
                  "its verify pass; gamma 0: a model draft's td is its proposal timed after a verify pass)")


def in_loop_td(m: dict) -> None:
    """td of a draft running a model of its own: its proposal as the loop runs it (after a verify
    pass: measure_cost's or measure_batch_cost's `in_loop`), the lone proposal kept beside it
    ("draft_char_us_alone", rounds "draft alone"; `without_loops` puts it back)."""
    m["draft_char_us_alone"] = m["draft_char_us"]
    m["draft_char_us"] = m.pop("draft_char_us_in_loop")
    r = m["rounds_us"]
    r["draft alone"], r["draft"] = r["draft"], r.pop("draft in loop")


def loop_overheads(m: dict) -> Overheads:
    """A setting's loop overheads from its loops timed with its components (measure_cost's
    base_pass_us and free_pass_us): o_base = base - t1, o_pass = free - tv, gamma 0."""
    return Overheads(m["base_pass_us"] - m["target_pass_us"], m["free_pass_us"] - m["verify_pass_us"], 0.0,
                     MEASURED_LOOPS)


def loop_probes(model, draft, prompt: list[int], n: int, k: int, temperature: float, device: str, seed: int):
    """measure_cost's `loops` for a chain at k, as a trial builds them (src/trial/trial.py): "free",
    the speculative loop replaying the proposals recorded in one run from `seed`
    (src/engine/measuring/replay.py: the verify pass as it runs in the loop plus the loop's own work, no
    drafting), and "base", the baseline loop of n chars. None (and a warning) where the replay
    diverges from the recorded run."""
    import torch
    from src.engine.decoding.decode import generate_baseline, generate_speculative
    from src.trial.trial import recorded_loops

    def new_gen():
        return torch.Generator(device=device).manual_seed(seed)

    def speculate(track_overlap=True, with_draft=draft):
        return generate_speculative(model, with_draft, prompt, n, k, temperature, new_gen(), track_overlap=track_overlap)
    return recorded_loops(speculate, lambda: generate_baseline(model, prompt, n, temperature, new_gen()), n, draft)[1]


def batch_loop_probes(model, draft, prompts: list[list[int]], n: int, k: int, temperature: float, device: str,
                      seed: int):
    """measure_batch_cost's `loops` at B = len(prompts): "free", the batch loop replaying the
    proposals recorded in one batch run from `seed` (src/engine/measuring/replay.py), and "base", the batch's
    baseline loop of n chars. None (and a warning) where the replay diverges."""
    from src.engine.decoding.batch import generate_baseline_batch, generate_speculative_batch, stream_generators
    from src.trial.trial import recorded_loops
    B = len(prompts)

    def speculate(track_overlap=True, with_draft=draft):
        return generate_speculative_batch(model, with_draft, prompts, n, k, temperature,
                                          stream_generators(seed, B, device), track_overlap=track_overlap)

    def baseline():
        return generate_baseline_batch(model, prompts, n, temperature, stream_generators(seed, B, device))
    return recorded_loops(speculate, baseline, n, draft)[1]


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


def measure_policy(chosen: dict, model, draft, target, prompt: list[int], seq, a: float, seqs: int, seed: int,
                   rounds: int, t0: float) -> Measured:
    """`measure` under an adaptive draft-length policy (k its cap). Chars per pass and the
    drafted-length distribution: the loop's counters under the policy (seqs generations, seeds
    seed.., nothing timed). Costs: `measure_cost` with that distribution, so tv is the expected
    verify pass of the loop's passes; the drafted chars per pass (`nodes`) are their mean. A
    table draft's per-char time is its cold cost along the sampled text, as for a fixed k."""
    import time
    from collections import Counter

    import torch
    from src.engine.decoding.decode import generate_baseline, generate_speculative
    from src.engine.measuring.measure import measure_cost, replay_draft_costs
    from src.trial.timing_lock import timing_lock
    from src.trial.policies import build_policy
    first = next(iter(chosen.values()))
    T, n = first.temperature, first.n_chars
    costs, gen = {}, torch.Generator().manual_seed(seed)
    for label, c in chosen.items():
        def baseline(c=c):
            return generate_baseline(model, prompt, n, T, torch.Generator(device=c.device).manual_seed(seed))
        policy = build_policy(c, model, draft, prompt, target.key, (baseline, n), lambda c=c: timing_lock(c.timing))
        runs = [generate_speculative(model, draft, prompt, n, c.k, T, torch.Generator(device=c.device).manual_seed(s),
                                     track_overlap=False, policy=policy) for s in range(seed, seed + seqs)]
        passes = sum(g.draft_calls for g in runs)
        lengths = Counter(j for g in runs for j, _ in g.passes_log)
        shares = {j: m / passes for j, m in sorted(lengths.items())}
        with timing_lock(c.timing):
            m = measure_cost(model, draft, prompt, c.k, T, c.timing.cost_reps, c.device, rounds, drafted=shares,
                             keep_rounds=True)
        m |= {"k": c.k, "nodes": sum(j * share for j, share in shares.items()),
              "cpp": sum(g.chars_emitted for g in runs) / passes}
        replays = ()
        if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
            replays = tuple(replay_draft_costs(draft, seq, n, m["cpp"],
                                               lambda prefix, k=c.k: len(draft.propose(prefix, k, T, gen)[0])))
            m["draft_char_us_warm"] = m["draft_char_us"]
            m["draft_char_us"] = float(np.median(replays))
        units = [(g.chars_emitted, g.draft_calls, sum(j for j, _ in g.passes_log)) for g in runs]
        m["spread"] = Spread(np.array(units, dtype=float), m.pop("rounds_us"), replays)
        costs[label] = m
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0)


def measure_batch(chosen: dict, model, draft, corpus, target, seq, a: float, seqs: int, seed: int, rounds: int,
                  t0: float) -> Measured:
    """`measure` at batch B > 1. Chars per pass: the batch loop's counters (seqs batch runs, seeds
    seed.., nothing timed), each run's mean chars of a sequence over the batch's passes (the batch
    waits for its slowest sequence, which per-position survival at B = 1 would not show). Costs:
    `measure_batch_cost` at (B, width); a table draft's per-char time is its cold cost along the
    sampled text (as at B = 1, a (B, k+1) verify pass before every B proposals) times B (one
    proposal per sequence); a model draft's is its batch proposal timed after a verify pass
    (`in_loop`). The batch's loops are timed with them (`batch_loop_probes`): o_base, o_pass per
    setting as at B = 1."""
    import time

    import torch
    from src.engine.decoding.batch import generate_speculative_batch, stream_generators
    from src.engine.drafts.model_draft import ModelDraft
    from src.engine.measuring.measure import batch_verify_pass, measure_batch_cost, replay_draft_costs
    from src.trial.batched import batch_prompts
    from src.trial.timing_lock import timing_lock
    first = next(iter(chosen.values()))
    T, n, B = first.temperature, first.n_chars, first.batch
    prompts = batch_prompts(first, corpus, target.tokenizer)
    cpp = {}
    for label, c in chosen.items():
        runs = [generate_speculative_batch(model, draft, prompts, n, c.k, T, stream_generators(s, B, c.device),
                                           track_overlap=False) for s in range(seed, seed + seqs)]
        cpp[label] = [float(np.mean(g.chars) / g.target_passes) for g in runs]   # one per run
    costs, gen = {}, torch.Generator().manual_seed(seed)
    loops = {label: batch_loop_probes(model, draft, prompts, n, c.k, T, c.device, seed) for label, c in chosen.items()}
    own_model = isinstance(draft, ModelDraft)   # a draft running a model of its own: timed in the loop's order too
    with timing_lock(first.timing):
        for label, c in chosen.items():
            m = measure_batch_cost(model, draft, prompts, c.k, T, c.timing.cost_reps, c.device, rounds,
                                   keep_rounds=True, loops=loops[label], in_loop=own_model)
            if own_model:
                in_loop_td(m)
            if loops[label]:
                m["overheads"] = loop_overheads(m)
            m |= {"k": c.k, "nodes": c.k, "cpp": float(np.mean(cpp[label]))}
            replays = ()
            if hasattr(draft, "clear_memos"):  # rows built on first use: the loop pays the cold cost
                after_verify = batch_verify_pass(model, prompts, c.k, c.device)   # B proposals follow each, as in the loop
                replays = tuple(replay_draft_costs(
                    draft, seq, n, m["cpp"], lambda prefix, k=c.k: len(draft.propose(prefix, k, T, gen)[0]),
                    before=after_verify, every=B))
                m["draft_char_us_warm"] = m["draft_char_us"]
                m["draft_char_us"] = B * float(np.median(replays))
            units = np.array([(x, 1.0, c.k) for x in cpp[label]])   # a run's mean over its sequences
            m["spread"] = Spread(units, m.pop("rounds_us"), replays, float(B))
            costs[label] = m
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0)


def measure_library(chosen: dict, target, draft, prompt: list[int], a: float, seqs: int, seed: int, rounds: int,
                    t0: float) -> Measured:
    """`measure` on transformers' loop (engine=transformers). Chars per pass and the drafted length
    per pass: the library loop's own counters (seqs runs of `generate`, seeds seed.., nothing timed).
    Costs: `library_cost` with the drafted-length shares and the library's plain `generate` as the
    base loop. Its loop overheads are measured, not fitted: o_base = the plain loop's step beyond its
    one-char pass, and o_pass is taken equal to it (each speculative pass pays the framework's step
    once; gamma 0: the assistant's own generate per proposal is inside td)."""
    import time
    from collections import Counter

    from src.engine.huggingface.library_loop import library_cost
    from src.trial.library_trial import library_loop
    from src.trial.timing_lock import timing_lock
    first = next(iter(chosen.values()))
    n = first.n_chars
    costs, o_base = {}, []
    for label, c in chosen.items():
        loop = library_loop(c, target.model, draft)
        runs = [loop.counted(loop.speculative, prompt, n, s) for s in range(seed, seed + seqs)]
        passes = sum(g.target_passes for g in runs)
        lengths = Counter(j for g in runs for j, _ in g.passes_log)
        shares = {j: m / passes for j, m in sorted(lengths.items())}

        def base(loop=loop):
            return loop.baseline(prompt, n, seed)
        with timing_lock(c.timing):
            m = library_cost(loop, prompt, c.k, c.timing.cost_reps, rounds, c.device, base_run=(base, n),
                             drafted=shares if len(shares) > 1 else None, keep_rounds=True)
        loop.close()
        m |= {"k": c.k, "nodes": sum(j * share for j, share in shares.items()),
              "cpp": sum(g.chars_emitted for g in runs) / passes}
        units = [(g.chars_emitted, g.target_passes, sum(j for j, _ in g.passes_log)) for g in runs]
        m["spread"] = Spread(np.array(units, dtype=float), m.pop("rounds_us"))
        o_base.append(m["base_pass_us"] - m["target_pass_us"])
        costs[label] = m
    o = float(np.median(o_base))
    overheads = Overheads(o, o, 0.0, "measured in transformers' loop (o_base: its plain step beyond the one-char "
                                     "pass; o_pass taken equal)")
    return Measured(target.key, a, np.zeros(0), costs, time.perf_counter() - t0, overheads)


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


# ---- the two commands -------------------------------------------------------------------------
def probe_run(args, cfg, ks: list[int], shapes, loaded, o: Overheads, run: int) -> tuple[Measured, Overheads]:
    """Probe run `run` of one regime or cell (`measure` from `probe_seed`; after the first its
    stdout, the settings left out, is not printed again) and the loop overheads its prediction
    uses: the settings' own measured loops, engine=transformers' measured ones, or with --fit-sweep
    the fitted `o` (the measured loops then dropped, `without_loops`)."""
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) if run else contextlib.nullcontext():
        m = measure(cfg, ks, shapes, args.seqs, args.every, probe_seed(args.seed, args.seqs, run), loaded,
                    args.rounds)
    used = m.overheads if m.overheads is not None and not args.fit_sweep else o
    if args.fit_sweep:   # the fitted overheads in place of the settings' measured loops
        m.costs = without_loops(m.costs)
    return m, used


def run_table(m: Measured, used: Overheads, a: float | None = None) -> tuple[pd.DataFrame, dict]:
    """One probe run's prediction table and its settings' replicates (drawn once: the table's
    intervals and the best's)."""
    reps = setting_replicates(m.costs, used)
    return prediction_table(m.survival, m.costs, used, a, reps=reps), reps


def runs_summary(runs: list[tuple[Measured, Overheads]]) -> tuple[Measured, Overheads]:
    """What print_prediction says of R probe runs: the mean overlap a and survival over the runs
    (each run as many sequences), the seconds summed, and the overheads' medians (measured per run
    on engine=transformers; fitted or none: the same in every run). One run: itself."""
    if len(runs) == 1:
        return runs[0]
    ms, os_ = [m for m, _ in runs], [o for _, o in runs]
    m = replace(ms[0], a=float(np.mean([x.a for x in ms])), seconds=float(sum(x.seconds for x in ms)),
                survival=np.mean([x.survival for x in ms], axis=0) if len(ms[0].survival) else ms[0].survival)
    o = replace(os_[0], o_base=float(np.median([x.o_base for x in os_])),
                o_pass=float(np.median([x.o_pass for x in os_])), gamma=float(np.median([x.gamma for x in os_])))
    return m, o


def print_prediction(name: str, m: Measured, table: pd.DataFrame, o: Overheads, temperature, engine="eager",
                     batch: int = 1, runs: int = 1) -> None:
    print(f"draft {name}  target {m.target_key}  temperature {temperature}  engine {engine}"
          + (f"  batch {batch} (chars per pass: a sequence's chars over the batch's passes)" if batch > 1 else "")
          + f"  (measured in {m.seconds:.1f} s" + (f", {runs} probe runs)" if runs > 1 else ")"))
    if runs > 1:
        print(f"{runs} independent probe runs (their own sequences and timing rounds, one after another over "
              "every regime): each value the median over the runs, a and P(...) their mean")
    if m.a == m.a:   # not NaN
        print(f"overlap at the first drafted position a = {m.a:.3f}")
    if len(m.survival):
        print("P(drafts 1..i kept) " + " ".join(f"{s:.2f}" for s in m.survival))
    if "o_pass" in table:   # the settings' measured loops (us, in the table)
        print(f"loop overheads: {MEASURED_LOOPS}"
              + (f"; the settings without them: {o.source}" if table["o_pass"].isna().any() else ""))
    else:
        print(f"loop overheads: {o.source}" + (f": o_base {o.o_base:.1f} us, o_pass {o.o_pass:.1f} us, "
                                               f"gamma {o.gamma:.3f}" if not o.source.startswith("none") else ""))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if "lo" in table:
        print(f"lo-hi: the central {INTERVAL_LEVEL:.0%} of {INTERVAL_REPS} bootstrap replicates of the probes "
              "(sequences, timing rounds with the loops timed in them, a table draft's replays)"
              + (f", {INTERVAL_REPS} per run pooled over the {runs} runs (the spread between runs in it too)"
                 if runs > 1 else "; the spread between runs is not in it (--runs)")
              + "; fitted loop overheads and the cost model's own error are not in it (--validate measures that)")
    print(recommendation(table))


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


def validate_sweep(args, overrides: list[str], o: Overheads, between=None) -> pd.DataFrame:
    """Per cell of the sweep (`--sweep-id`: one id, or a comma list read as one sweep, `load_sweeps`):
    predicted and measured speedup and APE; prints the summary. between: None, or a function of the
    probe run r (1 to runs - 1) called just before it, which runs the sweep's next round of trials
    and returns its sweep id (src.bench.predict: seed rounds and probe runs take turns); the
    measurements are then those of every round, each read once right after it ran."""
    from src.engine.errors import SpecsweepError
    from src.trial.load import load_target
    from src.trial.spec import trial_spec
    from .aggregate import configured_level, pooled_speedup
    from .cost_models import PAPER_DRAFTS
    from .sweep_data import cell_labels, combine_sweeps, connect, load_sweep, load_sweeps
    ids = [i for i in (args.sweep_id or "").split(",") if i]
    data = load_sweeps(connect(args.uri), args.experiment, ids) if ids else load_sweep(connect(args.uri),
                                                                                         args.experiment)
    ids = ids or [data.sweep.sweep_id]
    fin = data.finished
    if fin.empty:
        raise SpecsweepError(f"sweep {', '.join(ids)} has no finished trial")
    common = [f"temperature={fin['temperature'].iloc[0]}", f"n_chars={int(fin['n_chars'].iloc[0])}"]
    if "batch_prompts" in fin and fin["batch_prompts"].nunique() == 1:   # a batch's prompts as its trials had them
        common.append(f"batch_prompts={fin['batch_prompts'].iloc[0]}")
    loaded, rows, sources = None, [], set()   # where each cell's loop overheads came from
    best = []                                 # per cell label: the best predicted setting (the break-even)
    if args.hold_out:   # each cell's overheads from the fit sweep's other drafts in other regimes
        fit = load_sweep(connect(args.uri), args.experiment, args.fit_sweep)
        fit_trials, fit_id = fit.finished, fit.sweep.sweep_id
    plan = []   # per cell: its label, trials, draft, regime, config, k, tree shapes, held-out overheads
    for label in sorted(fin["draft"].unique()):
        g = fin[fin["draft"] == label]
        cell = g.iloc[0]                           # the cell's columns (sweep_data.CELL_PARTS)
        draft, shape = cell["draft_name"], cell["tree"]
        extra = ["verify=tree", f"verify.widths=[{shape.replace('-', ',')}]"] if shape else []
        extra += [f"engine={cell['engine']}", f"batch={int(cell['batch'])}", f"policy={cell['policy']}"]
        extra += [f"draft.{o.partition('=')[0]}={'null' if o.partition('=')[2] == 'None' else o.partition('=')[2]}"
                  for o in cell["draft_options"].split(",") if o]   # the options the sweep varied
        cfg = compose([f"draft={draft}", *common, *overrides, *extra])
        loaded = loaded or load_target(trial_spec(cfg).target, progress=False)
        if loaded[1].key != g["target_key"].iloc[0]:
            raise SpecsweepError(f"the sweep's target is {g['target_key'].iloc[0]}, the composed config's "
                                 f"{loaded[1].key}: pass the sweep's model/data/train overrides")
        ks = sorted(int(k) for k in g["k"].unique())
        held = (held_out_overheads(fit_trials, fit_id, draft, cell["engine"], int(cell["batch"])) if args.hold_out
                else None)   # fitted once per cell, used by each of its runs
        plan.append((label, g, cell, draft, cfg, ks, tree_shapes(cfg, extra) if shape else None, held))
    runs, began = args.runs, []   # began: when each probe run began
    done: list[list] = [[] for _ in plan]   # per cell: (Measured, overheads used) per probe run
    rounds = [(ids, data)]   # per round of the sweep: its ids and its trials, each loaded once
    for r in range(runs):   # run by run over every cell: a cell's runs spread over the whole validation
        if r and between is not None:   # the sweep's next round of trials, then this probe run
            new = between(r)
            rounds.append(([new], load_sweep(connect(args.uri), args.experiment, new)))
        began.append(pd.Timestamp.now(tz="UTC"))
        for i, (label, g, cell, draft, cfg, ks, shapes, held) in enumerate(plan):
            m, used = probe_run(args, cfg, ks, shapes, loaded, o, r)
            done[i].append((m, used if held is None else held))
            print(f"  {label}: measured in {m.seconds:.1f} s" + (f" (probe run {r + 1}/{runs})" if runs > 1 else ""),
                  flush=True)
    if len(rounds) > 1:   # every round's trials as one sweep
        ids = [i for round_ids, _ in rounds for i in round_ids]
        data = combine_sweeps([d for _, d in rounds])
        fin = data.finished
    measured = pooled_speedup(data.pairs, configured_level(fin)).set_index(["draft", "k"])
    for (label, _, cell, draft, cfg, ks, shapes, _), runs_ in zip(plan, done):
        g = fin[fin["draft"] == label]
        m, used = runs_summary(runs_)
        if any("overheads" in setting for setting in m.costs.values()):
            sources.add("the cells' own loops " + MEASURED_LOOPS)
        else:
            sources.add(o.source if used == o else f"{used.source} for {label}")
        table, reps = combine_runs([run_table(m_, used_) for m_, used_ in runs_])
        free = cell_labels(g.iloc[:1], leave_out=("engine", "batch")).iloc[0]   # the cell less its regime
        best.append({"draft": free, "engine": cell["engine"], "batch": int(cell["batch"]), **best_of_table(table, reps)})
        cpp = g.groupby("k")["chars_per_pass"].median()
        for r in table.itertuples():
            meas = measured.loc[(label, r.k)] if (label, r.k) in measured.index else None
            m_med, m_lo, m_hi = (meas["median"], meas["lo"], meas["hi"]) if meas is not None else (np.nan,) * 3
            rows.append({"draft": label, "draft_name": draft, "cell": free, "engine": cell["engine"],
                         "batch": int(cell["batch"]),
                         "k": r.k, "cpp": r.cpp, "cpp measured": cpp.get(r.k, np.nan), "c": r.c,
                         "predicted": r.predicted, "pred lo": r.lo, "pred hi": r.hi, "measured": m_med,
                         "meas lo": m_lo, "meas hi": m_hi, "ape %": abs(r.predicted - m_med) / m_med * 100})
    cells = pd.DataFrame(rows)
    print(f"\nsweep {', '.join(ids)} ({data.sweep.name}): predicted vs measured (pooled median), "
          f"loop overheads: {'; '.join(sorted(sources))}")
    if len(rounds) > 1:
        print(rounds_timing([d.finished["start_time"] for _, d in rounds], began))
    else:
        print(probes_after(fin["start_time"], began[0]) + (f" ({runs} probe runs, each value the median over them)"
                                                           if runs > 1 else ""))
    print(cells.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print()
    print(ape_summary(cells, PAPER_DRAFTS).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    print(f"\nper regime (narrow: cells whose measured interval is under {NARROW:.0%} of their median wide)")
    print(regime_errors(cells).to_string(index=False, float_format=lambda v: f"{v:.1f}"))
    if cells["batch"].nunique() > 1:
        table = break_even_beside(pd.DataFrame(best), cells, data.pairs, configured_level(fin))
        print("\nbreak-even batch per draft and engine, predicted (its interval's ends) beside measured (the "
              "report's range: each B's seed-bootstrap interval for the best of its k)")
        print(table[[c for c in table.columns if not c.startswith("_")]].to_string(index=False))
    return cells


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


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    from .sweep_data import DEFAULT_EXPERIMENT
    from src.engine.errors import ArgParser
    p = ArgParser(prog="python -m analysis.predict", description=__doc__.splitlines()[0],
                                epilog="Other arguments: Hydra overrides KEY=VALUE of conf/ (k= takes a comma list).")
    p.add_argument("--fit-sweep", help="take the loop overheads from this finished sweep's extended-model fit")
    p.add_argument("--fit-drafts", help="fit them on these drafts' trials only (comma list; default: all)")
    p.add_argument("--validate", action="store_true", help="predict every cell of --sweep-id and print the errors")
    p.add_argument("--hold-out", action="store_true",
                   help="with --validate --fit-sweep: each cell's overheads fitted on the fit sweep's other drafts "
                        "in other regimes only")
    p.add_argument("--sweep-id", help="with --validate: the measured sweep, or several read as one (comma list; "
                                      "default: the latest)")
    p.add_argument("--tracking-uri", dest="uri", help="default: $MLFLOW_TRACKING_URI, else the repository's mlruns/")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default: %(default)s)")
    p.add_argument("--seqs", type=int, default=16, help="sequences sampled from the target (default: %(default)s)")
    p.add_argument("--every", type=int, default=8,
                   help="a chain (tree) at every N-th prefix length (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the component times "
                   "(a trial's: 7; more rounds, a steadier median on a busy machine; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled text and drafts (default: %(default)s)")
    p.add_argument("--runs", type=int, default=1,
                   help="independent probe runs, one after another over every regime or cell (run r samples from "
                        "seed + r * seqs): each value the median over the runs, the interval their replicates pooled, "
                        "so the machine's drift between runs is in it (make bench-predict: one per round of seeds; "
                        "default: %(default)s)")
    flags, overrides = split_args(argv)
    args = p.parse_args(flags)
    from src.engine.errors import SpecsweepError
    if min(args.seqs, args.every, args.rounds, args.runs) < 1:
        raise SpecsweepError("--seqs, --every, --rounds and --runs must be >= 1")
    return args, overrides


def predict_regimes(args, overrides: list[str], ks: list[int], engines: list[str] | None,
                    batches: list[int] | None, o: Overheads, loaded=None) -> pd.DataFrame:
    """One prediction per (engine, batch) regime of the lists (None: the config's own), each printed
    as a single prediction is; then, with more than one regime, the best predicted setting per
    regime with an interval for the best over its settings (`best_over_settings`) and, with
    more than one batch size, the predicted break-even batch per engine (`break_even_table`).
    Every regime's settings are checked before any is measured: a regime with none left (onnx at
    B > 1, say) is left out with a line saying why; none left at all is bad input. Returns the
    per-regime best rows."""
    import contextlib
    import io
    from src.engine.errors import SpecsweepError
    from src.trial.load import load_target
    from src.trial.spec import trial_spec
    plan, refused = [], []
    for engine in engines or [None]:
        for b in batches or [None]:
            extra = ([f"engine={engine}"] if engine else []) + ([f"batch={b}"] if b else [])
            cfg = compose([*overrides, *extra])
            shapes = tree_shapes(cfg, overrides)
            try:
                with contextlib.redirect_stdout(io.StringIO()):   # measure prints the settings left out
                    spec = next(iter(settings(cfg, ks, shapes).values()))
            except SpecsweepError as e:
                refused.append(f"engine={cfg.engine.name} batch={cfg.batch} ({e})")
                continue
            plan.append((cfg, shapes, spec))
    if refused:
        print("regimes left out: " + "; ".join(refused))
    if not plan:
        raise SpecsweepError("no regime left to predict: " + "; ".join(refused))
    loaded = loaded or load_target(plan[0][2].target, progress=False)
    best, runs = [], args.runs
    done: list[list] = [[] for _ in plan]   # per regime: (Measured, overheads used) per probe run
    for r in range(runs):   # run by run over every regime: a regime's runs spread over the whole command
        for i, (cfg, shapes, _) in enumerate(plan):
            m, used = probe_run(args, cfg, ks, shapes, loaded, o, r)
            done[i].append((m, used))
            if r < runs - 1:
                print(f"probe run {r + 1}/{runs}: engine {cfg.engine.name} batch {cfg.batch} measured in "
                      f"{m.seconds:.1f} s", flush=True)
                continue
            if i:
                print()
            table, reps = combine_runs([run_table(m, used, None if shapes else m.a) for m, used in done[i]])
            m, used = runs_summary(done[i])
            print_prediction(cfg.draft.name, m, table, used, cfg.temperature, cfg.engine.name, cfg.batch, runs)
            best.append({"engine": cfg.engine.name, "batch": int(cfg.batch), **best_of_table(table, reps)})
    best = pd.DataFrame(best)
    if len(best) > 1:
        shown = best.assign(setting=best["setting"].map(setting_label)).drop(columns="k")
        print(f"\nbest predicted setting per regime (lo-hi: {INTERVAL_LEVEL:.0%} for the best of the regime's "
              "settings, bounds holding for all of them at once)")
        print(shown.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if best["batch"].nunique() > 1:
        table = break_even_table(best)
        print("\npredicted break-even batch per engine (where the best predicted speedup falls below 1x; "
              "in brackets where its interval's lower and upper ends do)")
        shown = table[[c for c in table.columns if not c.startswith("_")]].fillna("")
        print(shown.to_string(index=False))
        single = sorted(set(best["engine"]) - set(table["engine"]))
        if single:
            print(f"(not placed: {', '.join(single)}, predicted at one batch size only)")
    return best


def prepare(argv: list[str]):
    """The command line checked before any work: (args, Hydra overrides, ks, engines, batches, the
    loop overheads `o`: fitted on --fit-sweep, else none)."""
    args, overrides = parse_args(argv)
    from src.sweep.store import resolve_uri
    args.uri = resolve_uri(args.uri)
    ks, overrides = parse_ks(overrides)
    engines, batches, overrides = parse_regimes(overrides)
    drafts = [d for d in (args.fit_drafts or "").split(",") if d] or None
    from src.engine.errors import SpecsweepError
    if args.validate and (engines or batches):
        raise SpecsweepError("--validate takes each cell's engine and batch from the sweep: drop engine= and batch=")
    if args.hold_out and not (args.validate and args.fit_sweep):
        raise SpecsweepError("--hold-out needs --validate and --fit-sweep (the sweep whose other drafts and "
                             "regimes are fitted)")
    o = fitted_overheads(args.uri, args.experiment, args.fit_sweep, drafts) if args.fit_sweep else Overheads()
    return args, overrides, ks, engines, batches, o


def run(argv: list[str]) -> None:
    args, overrides, ks, engines, batches, o = prepare(argv)
    if args.validate:
        validate_sweep(args, overrides, o)
        return
    predict_regimes(args, overrides, ks or list(DEFAULT_KS), engines, batches, o)


def main(argv: list[str] | None = None) -> int:
    from .cli import one_line_errors
    return one_line_errors(lambda: run(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
