"""`python -m src.predict`: a draft's speedup predicted for every k before any sweep runs.

    python -m src.predict draft=ngram                          # k = 1, 2, 4, 8, 16
    python -m src.predict draft=int8 k=2,4 temperature=0.7 model=tiny data=synthetic
    python -m src.predict draft=distilled verify=tree          # the drafts_tree sweep's shapes
    python -m src.predict draft=ngram --fit-sweep ID           # with a sweep's fitted loop overheads
    python -m src.predict draft=ngram engine=compiled batch=16 # another engine, a batch of 16 sequences
    python -m src.predict draft=ngram engine=eager,compiled batch=1,4,16   # per regime; break-even batch
    python -m src.predict --validate --sweep-id ID [--fit-sweep ID --fit-drafts bigram,int8,int4]
    python -m src.predict --validate --sweep-id ID --fit-sweep ID --hold-out   # per cell: other drafts, regimes

The probes run on the trial floor (src/trial/probes.py: a probe is a kind of trial); the prediction
from them is pure arithmetic (analysis/prediction.py).

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
Prediction per k (analysis/prediction.py: pure functions, no loop is run):
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
the time (tests/analysis/test_prediction_interval.py): a little short of 95%, as a bootstrap of 16
sequences and of a median over 15 rounds is. What changes from one run of the probes to the next
(the machine's state, compiled graphs, memory layout) is not in one run's interval: on the 2-core
machine two runs of the same probes moved a prediction by up to 8%, and a compiled batch draft's c
by 20% (docs/results-history.md, "Per regime, ten seeds" and "The batch's drafting in the loop's
order"). `--runs R` runs the probes R times, one run after another over every regime (or every
validated cell), so each regime's runs are spread over the whole command; run r
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
seed rounds of one sweep). `make bench-predict` (src.bench.predict_rounds) runs the sweep one seed round
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
from dataclasses import replace

import numpy as np
import pandas as pd
import yaml

from analysis.prediction import (INTERVAL_LEVEL, INTERVAL_REPS, NARROW, ape_summary, best_of_table, break_even_beside,
                                 break_even_table, category_costs, combine_runs, fitted_overheads, held_out_overheads,
                                 prediction_table, probes_after, recommendation, regime_errors, rounds_timing,
                                 setting_label, setting_replicates, without_loops)
from .engine.measuring.formula import Overheads
from .trial.probes import MEASURED_LOOPS, Measured, measure_probes, probe_seed

DEFAULT_KS = (1, 2, 4, 8, 16)
TREE_SWEEP = "drafts_tree"      # verify=tree without verify.widths: this sweep's shapes


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
    from .engine.errors import SpecsweepError
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
    from .engine.errors import SpecsweepError
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
    from .door import compose as door_compose
    return door_compose(overrides)


def tree_shapes(cfg, overrides: list[str]) -> list[tuple[int, ...]] | None:
    """None for a chain; for verify=tree the shape of a `verify.widths=` override, else the
    shapes the drafts_tree sweep runs."""
    from omegaconf import OmegaConf
    from .paths import SWEEPS_DIR
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
    from .engine.errors import SpecsweepError
    from .trial.spec import tree_label, trial_spec
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


def category_prediction(runs: list[tuple[Measured, Overheads]], category: str):
    """(table, replicates) of one workload category over R probe runs (`category_costs`), or None
    where the probes do not tell the categories apart."""
    tables = []
    for m, used in runs:
        costs = category_costs(m.costs, category)
        if costs is None:
            return None
        tables.append(run_table(replace(m, costs=costs), used))
    return combine_runs(tables)


def print_categories(runs: list[tuple[Measured, Overheads]]) -> None:
    """Per category of a workload of several: each setting's chars per pass and predicted speedup
    with its interval (the category's sequences resampled), and the best setting per category."""
    categories = runs[0][0].categories
    if len(categories) < 2:
        return
    rows, best = [], []
    for category in categories:
        got = category_prediction(runs, category)
        if got is None:
            print("per category: not predicted here (a chain of fixed k in the tool's loop at batch 1 only)")
            return
        table, reps = got
        rows += [{"category": category, "setting": str(r.setting), "cpp": r.cpp, "predicted": r.predicted, "lo": r.lo,
                  "hi": r.hi} for r in table.itertuples()]
        best.append({"category": category, **best_of_table(table, reps)})
        best[-1]["setting"] = str(best[-1]["setting"])
    print(f"\nper workload category (the chars per pass from that category's sequences, {len(runs[0][0].costs)} "
          "settings; the costs and loops the workload's):")
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("best predicted setting per category (lo-hi for the best of the settings):")
    print(pd.DataFrame(best).drop(columns="k").to_string(index=False, float_format=lambda v: f"{v:.3f}"))


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


def validate_sweep(args, overrides: list[str], o: Overheads, between=None) -> pd.DataFrame:
    """Per cell of the sweep (`--sweep-id`: one id, or a comma list read as one sweep, `load_sweeps`):
    predicted and measured speedup and APE; prints the summary. between: None, or a function of the
    probe run r (1 to runs - 1) called just before it, which runs the sweep's next round of trials
    and returns its sweep id (src.bench.predict_rounds: seed rounds and probe runs take turns); the
    measurements are then those of every round, each read once right after it ran."""
    from .engine.errors import SpecsweepError
    from .trial.load import load_target
    from .trial.spec import trial_spec
    from analysis.aggregate import configured_level, pooled_speedup
    from analysis.cost_models import PAPER_DRAFTS
    from analysis.sweep_data import cell_labels, combine_sweeps, connect, load_sweep, load_sweeps
    ids = [i for i in (args.sweep_id or "").split(",") if i]
    data = load_sweeps(connect(args.uri), args.experiment, ids) if ids else load_sweep(connect(args.uri),
                                                                                         args.experiment)
    ids = ids or [data.sweep.sweep_id]
    fin = data.finished
    if fin.empty:
        raise SpecsweepError(f"sweep {', '.join(ids)} has no finished trial")
    common = [f"temperature={fin['temperature'].iloc[0]}", f"n_chars={int(fin['n_chars'].iloc[0])}"]
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
        extra += [f"engine={cell['engine']}", f"batch={int(cell['batch'])}", f"policy={cell['policy']}",
                  f"workload={cell['workload']}"]   # the prompts as its trials had them (a file's path: an override)
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
    per_category = category_errors(plan, done, data, args)
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
    if not per_category.empty:
        print("\nper workload category: predicted (the category's sequences) vs measured (total baseline time over "
              "total speculative time of its prompts in every seed; the report's workload tables)")
        print(per_category.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        summary = per_category.groupby(["workload", "category"], sort=False)["ape %"].agg(["median", "max", "count"])
        print("\nAPE % per category (median, max over the cells and k)")
        print(summary.rename(columns={"count": "cells x k"}).reset_index().to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))
    if cells["batch"].nunique() > 1:
        table = break_even_beside(pd.DataFrame(best), cells, data.pairs, configured_level(fin))
        print("\nbreak-even batch per draft and engine, predicted (its interval's ends) beside measured (the "
              "report's range: each B's seed-bootstrap interval for the best of its k)")
        print(table[[c for c in table.columns if not c.startswith("_")]].to_string(index=False))
    return cells


def category_errors(plan, done, data, args) -> pd.DataFrame:
    """Per validated cell of a workload of several categories, per k and category: the category's
    prediction beside its measured speedup (analysis/workloads.py's category frame of the trials'
    prompts.csv) and the APE. Empty where no cell has several categories."""
    from analysis.aggregate import configured_level
    from analysis.sweep_data import connect, prompt_rows
    from analysis.workloads import category_frame
    wanted = [(label, cell, runs) for (label, _, cell, *_), runs in zip(plan, done) if len(runs[0][0].categories) > 1]
    if not wanted:
        return pd.DataFrame()
    fin = data.finished
    frame = category_frame(prompt_rows(connect(args.uri), fin[fin["draft"].isin([w[0] for w in wanted])]),
                           configured_level(fin))
    if frame.empty:
        return pd.DataFrame()
    rows = []
    for label, cell, runs in wanted:
        free = cell_labels_less_workload(fin[fin["draft"] == label])
        for category in runs[0][0].categories:
            got = category_prediction(runs, category)
            if got is None:
                continue
            table, _ = got
            for r in table.itertuples():
                meas = frame[(frame["cell"] == free) & (frame["k"] == r.k) & (frame["category"] == category)
                             & (frame["workload"] == cell["workload"])]
                m = meas.iloc[0] if len(meas) else None
                rows.append({"draft": label, "workload": cell["workload"], "category": category, "k": r.k,
                             "cpp": r.cpp, "cpp measured": np.nan if m is None else m["chars per pass"],
                             "predicted": r.predicted, "pred lo": r.lo, "pred hi": r.hi,
                             "measured": np.nan if m is None else m["speedup"],
                             "meas lo": np.nan if m is None else m["lo"], "meas hi": np.nan if m is None else m["hi"]})
    out = pd.DataFrame(rows)
    if not out.empty:
        out["ape %"] = (out["predicted"] - out["measured"]).abs() / out["measured"] * 100
    return out


def cell_labels_less_workload(g: pd.DataFrame) -> str:
    from analysis.sweep_data import cell_labels
    return cell_labels(g.iloc[:1], leave_out=("workload",)).iloc[0]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    from analysis.sweep_data import DEFAULT_EXPERIMENT
    from .door import ArgParser, at_least
    p = ArgParser(prog="python -m src.predict", description=__doc__.splitlines()[0],
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
    p.add_argument("--seqs", type=at_least(1), default=16, help="sequences sampled from the target (default: %(default)s)")
    p.add_argument("--every", type=at_least(1), default=8,
                   help="a chain (tree) at every N-th prefix length (default: %(default)s)")
    p.add_argument("--rounds", type=at_least(1), default=15, help="interleaved rounds of the component times "
                   "(a trial's: 7; more rounds, a steadier median on a busy machine; default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampled text and drafts (default: %(default)s)")
    p.add_argument("--runs", type=at_least(1), default=1,
                   help="independent probe runs, one after another over every regime or cell (run r samples from "
                        "seed + r * seqs): each value the median over the runs, the interval their replicates pooled, "
                        "so the machine's drift between runs is in it (make bench-predict: one per round of seeds; "
                        "default: %(default)s)")
    flags, overrides = split_args(argv)
    return p.parse_args(flags), overrides


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
    from .engine.errors import SpecsweepError
    from .trial.load import load_target
    from .trial.spec import trial_spec
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
            print_categories(done[i])
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
    from .sweep.store import resolve_uri
    args.uri = resolve_uri(args.uri)
    ks, overrides = parse_ks(overrides)
    engines, batches, overrides = parse_regimes(overrides)
    drafts = [d for d in (args.fit_drafts or "").split(",") if d] or None
    from .engine.errors import SpecsweepError
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
    from .door import command
    return command(lambda: run(sys.argv[1:] if argv is None else argv), reads_store=True, quiet=True)


def measure(cfg, ks: list[int], shapes, seqs: int, every: int, seed: int, loaded=None, rounds: int = 15) -> Measured:
    """Acceptance and component costs of cfg's draft for each setting (module docstring): the settings
    it can take (`settings`, the others said and left out), probed as trials (src/trial/probes.py)."""
    return measure_probes(settings(cfg, ks, shapes), shapes, seqs, every, seed, loaded, rounds)


if __name__ == "__main__":
    sys.exit(main())
