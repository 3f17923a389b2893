"""Pull one sweep's trial runs out of MLflow into pandas.

A sweep is a parent run tagged `specsweep.kind = sweep` with a `sweep_id` tag; its trials are
runs tagged `specsweep.kind = trial` with the same `sweep_id` (matching on the id rather than
on the parent run id keeps a resumed sweep's trials together); a cell the sweep skipped because
another sweep's run had finished it comes from the parent's `reused.*` params. Params arrive as strings and
are cast here, once. Per-pair speedup ratios come from the `speedup_pair` metric history
(step = pair index). The trials' `cpu_model` and `host` tags (where each ran) come along as columns:
pair timings from different CPU models must not be pooled without saying so.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass

import mlflow
import pandas as pd
from mlflow.tracking import MlflowClient

from src.engine.errors import SpecsweepError
from src.paths import REPO
from src.sweep.store import DEFAULT_EXPERIMENT, KIND_TAG, REUSED_PREFIX, SWEEP, TRIAL, check_readable, resolve_uri

log = logging.getLogger(__name__)

FINISHED = "FINISHED"
KEY = ["draft", "k", "seed"]   # one trial
CELL = ["draft", "k"]          # one table row: a trial aggregated across seeds
INT_PARAMS = ["k", "seed", "n_chars", "pairs_min"]
FLOAT_PARAMS = ["temperature", "confidence"]
STR_PARAMS = ["draft", "target_key"]
# column -> the params it is read from, per run the first one set: the configured minimum of pairs
# was logged as `pairs` by older code; the interval's level is the flattened config's own param
PARAM_SOURCES = {"pairs_min": ["pairs_min", "pairs"], "confidence": ["timing.confidence"]}
TAGS = ["cpu_model", "host"]   # where a trial ran: tags.<name> -> column <name>, missing -> NA
PAIR_METRIC = "speedup_pair"


@dataclass
class Sweep:
    sweep_id: str
    name: str
    parent_run_id: str
    experiment_id: str
    start_time: pd.Timestamp


@dataclass
class SweepData:
    sweep: Sweep
    trials: pd.DataFrame    # one row per trial run with draft, k and seed: run_id, status, params, metrics
    unplaced: pd.DataFrame  # runs without draft/k/seed params (died before logging them): run_id, status
    pairs: pd.DataFrame     # one row per timed pair of a finished trial: draft, k, seed, run_id, pair, ratio

    @property
    def finished(self) -> pd.DataFrame:
        return finished_trials(self.trials)


def connect(uri: str) -> MlflowClient:
    """Point mlflow at `uri` once the store passed store.check_readable (nothing is created or changed:
    MLflow would make an empty database at a missing path)."""
    check_readable(uri)
    mlflow.set_tracking_uri(uri)
    return MlflowClient(uri)


def find_sweep(experiment: str, sweep_id: str | None = None) -> Sweep:
    """The sweep's parent run: the one with `sweep_id`, else the newest one."""
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        raise SpecsweepError(f"no experiment {experiment!r} in {mlflow.get_tracking_uri()}")
    parents = mlflow.search_runs([exp.experiment_id], f"tags.`{KIND_TAG}` = '{SWEEP}'",
                                 order_by=["attributes.start_time DESC"])
    if parents.empty:
        raise SpecsweepError(f"no sweep in experiment {experiment!r}")
    ids = parents.get("tags.sweep_id", pd.Series(pd.NA, index=parents.index, dtype=object))
    chosen = parents[ids.notna()] if sweep_id is None else parents[ids == sweep_id]
    if chosen.empty:
        known = ", ".join(ids.dropna().unique()[:5])
        raise SpecsweepError(f"no sweep with id {sweep_id!r} in experiment {experiment!r} (latest: {known})")
    row = chosen.iloc[0]
    name = row.get("tags.sweep_name")
    return Sweep(sweep_id=row["tags.sweep_id"], name=name if isinstance(name, str) else "",
                 parent_run_id=row["run_id"], experiment_id=exp.experiment_id, start_time=row["start_time"])


def search_trials(sweep: Sweep) -> pd.DataFrame:
    """Raw search_runs frame of the sweep's trial runs, every status, and of the other sweeps'
    FINISHED runs that stand for cells it skipped as done (its parent's `reused.*` params)."""
    kind = f"tags.`{KIND_TAG}` = '{TRIAL}'"
    if re.fullmatch(r"[\w.:-]+", sweep.sweep_id):
        runs = mlflow.search_runs([sweep.experiment_id], f"{kind} and tags.sweep_id = '{sweep.sweep_id}'")
    else:   # an id with quotes or spaces cannot go into a filter string safely: filter here instead
        runs = mlflow.search_runs([sweep.experiment_id], kind)
        runs = runs[runs["tags.sweep_id"] == sweep.sweep_id] if "tags.sweep_id" in runs else runs.iloc[0:0]
    params = MlflowClient().get_run(sweep.parent_run_id).data.params
    reused = sorted(v for key, v in params.items() if key.startswith(REUSED_PREFIX) and re.fullmatch(r"\w+", v))
    if not reused:
        return runs
    others = mlflow.search_runs([sweep.experiment_id], "attributes.run_id IN ({})".format(
        ", ".join(f"'{r}'" for r in reused)))
    return pd.concat([runs, others[~others["run_id"].isin(runs["run_id"])]], ignore_index=True)


def tidy_runs(raw: pd.DataFrame) -> pd.DataFrame:
    """run_id, status, start_time, typed params, the TAGS and every metric under its bare name."""
    out = pd.DataFrame({"run_id": raw.get("run_id", pd.Series(dtype=str)),
                        "status": raw.get("status", pd.Series(dtype=str)),
                        "start_time": raw.get("start_time", pd.Series(dtype="datetime64[ns, UTC]"))})
    for name in STR_PARAMS + INT_PARAMS + FLOAT_PARAMS:
        sources = [raw[f"params.{p}"] for p in PARAM_SOURCES.get(name, [name]) if f"params.{p}" in raw]
        col = functools.reduce(pd.Series.combine_first, sources) if sources else None  # per run, the first set
        if col is None:
            out[name] = pd.NA
        elif name in STR_PARAMS:
            out[name] = col
        else:
            out[name] = pd.to_numeric(col, errors="coerce")
    out["draft"] = with_swept_options(raw, out["draft"])
    # an adaptive draft-length policy's trials are cells of their own: draft "<draft>~<policy>"
    # (e.g. ngram~heuristic), k its cap
    policy = raw.get("params.policy.name")
    if policy is not None:
        adaptive = policy.notna() & (policy != "fixed")
        out.loc[adaptive, "draft"] = out.loc[adaptive, "draft"] + "~" + policy[adaptive]
    # a tree's trials are cells of their own: draft "<draft>+tree<widths>" (e.g. bigram+tree4-2-2-1),
    # never pooled with the chain's trials of the same draft and k (k is the tree's depth)
    verify, widths = raw.get("params.verify"), raw.get("params.tree_widths")
    if verify is not None and widths is not None:
        tree = (verify == "tree") & widths.notna()
        out.loc[tree, "draft"] = out.loc[tree, "draft"] + "+tree" + widths[tree]
    # another engine than eager, or a batch of several sequences, is another regime: draft
    # "<draft>@<engine>" (ngram@compiled), "<draft>@B<batch>" (ngram@B16), or both (ngram@compiled@B16)
    engine = raw.get("params.engine.name")
    out["engine"] = engine.fillna("eager") if engine is not None else "eager"
    other = out["engine"] != "eager"
    out.loc[other, "draft"] = out.loc[other, "draft"] + "@" + out.loc[other, "engine"]
    batch = raw.get("params.batch")
    out["batch"] = 1 if batch is None else pd.to_numeric(batch, errors="coerce").fillna(1).astype(int)
    many = out["batch"] > 1
    out.loc[many, "draft"] = out.loc[many, "draft"] + "@B" + out.loc[many, "batch"].astype(str)
    for name in TAGS:
        col = raw.get(f"tags.{name}")
        out[name] = pd.Series(pd.NA, index=out.index, dtype=object) if col is None else col.astype(object)
    # a metric named like a param (a batched trial logs "batch" as both) keeps the param's column:
    # two columns of one name would make out["batch"] a frame
    metrics = {c.removeprefix("metrics."): pd.to_numeric(raw[c], errors="coerce")
               for c in raw.columns if c.startswith("metrics.") and c.removeprefix("metrics.") not in out.columns}
    return pd.concat([out, pd.DataFrame(metrics, index=out.index)], axis=1)


DRAFT_OPTION = re.compile(r"params\.draft\.(.+)")
NOT_OPTIONS = ("name", "_target_")


def with_swept_options(raw: pd.DataFrame, draft: pd.Series) -> pd.Series:
    """A sweep over a draft's own options (draft.order=4,6; draft.distill_chars=1000000,null) makes
    cells of their own: draft "<draft>[<option>=<value>,...]" for each option that takes more than
    one value among that draft's runs (in the order the runs logged them); a draft whose options
    all agree keeps its bare name. A run that lacks an option others logged (another code
    version) does not split its cell."""
    options = {c: m.group(1) for c in raw.columns if (m := DRAFT_OPTION.fullmatch(c)) and m.group(1) not in NOT_OPTIONS}
    out = draft.copy()
    for name in draft.dropna().unique():
        rows = draft == name
        swept = [c for c in options if raw.loc[rows, c].nunique(dropna=True) > 1]
        if swept:
            values = raw.loc[rows, swept].astype(str)
            out[rows] = name + "[" + values.apply(lambda r: ",".join(f"{options[c]}={v}" for c, v in r.items()),
                                                  axis=1) + "]"
    return out


@dataclass(frozen=True)
class Label:
    """A cell's draft label taken apart: "<draft>~<policy>+tree<widths>@<engine>@B<batch>", every
    part after the draft optional; the draft carries its swept options where a sweep varied them
    ("distilled[distill_chars=None]")."""
    draft: str
    tree: str        # the widths, "4-2-2-1", or "" for a chain
    engine: str
    batch: int
    policy: str = "fixed"


def parse_label(label: str) -> Label:
    base, *regime = label.split("@")
    base, _, tree = base.partition("+tree")
    draft, _, policy = base.partition("~")
    engine, batch = "eager", 1
    for part in regime:
        if re.fullmatch(r"B\d+", part):
            batch = int(part[1:])
        else:
            engine = part
    return Label(draft, tree, engine, batch, policy or "fixed")


def split_unplaced(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs with draft, k and seed; runs without, which cannot be put in any cell)."""
    placed = runs[KEY].notna().all(axis=1)
    trials = runs[placed].copy()
    for name in ("k", "seed"):
        trials[name] = trials[name].astype(int)
    return trials.reset_index(drop=True), runs.loc[~placed, ["run_id", "status"]].reset_index(drop=True)


def finished_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """FINISHED trials, one per (draft, k, seed): the newest if a trial was run twice."""
    done = trials[trials["status"] == FINISHED].sort_values("start_time")
    dup = done.duplicated(KEY, keep="last")
    if dup.any():
        log.warning("%d trials were finished more than once; using the newest run of each", dup.sum())
    return done[~dup].sort_values(KEY).reset_index(drop=True)


def pair_ratios(client: MlflowClient, finished: pd.DataFrame) -> pd.DataFrame:
    """Long frame of the per-pair speedup ratios of every finished trial."""
    rows = []
    for t in finished.itertuples():
        history = client.get_metric_history(t.run_id, PAIR_METRIC)
        if not history:
            log.warning("run %s (%s k=%d seed=%d) has no %s history; its pairs are left out",
                        t.run_id, t.draft, t.k, t.seed, PAIR_METRIC)
        by_step = {}
        for m in sorted(history, key=lambda m: m.timestamp):
            by_step[m.step] = m.value  # a re-logged step: the latest value wins
        rows += [(t.draft, t.k, t.seed, t.run_id, step, value) for step, value in sorted(by_step.items())]
    return pd.DataFrame(rows, columns=KEY + ["run_id", "pair", "ratio"])


def load_sweep(client: MlflowClient, experiment: str, sweep_id: str | None = None) -> SweepData:
    sweep = find_sweep(experiment, sweep_id)
    runs = tidy_runs(search_trials(sweep))
    if runs.empty:
        raise SpecsweepError(f"sweep {sweep.sweep_id!r} has no trial runs")
    trials, unplaced = split_unplaced(runs)
    if len(unplaced):
        log.warning("%d runs of sweep %s have no draft/k/seed params", len(unplaced), sweep.sweep_id)
    for name in ("n_chars", "temperature", "target_key", "cpu_model"):
        values = trials[name].dropna().unique()
        if len(values) > 1:  # cells pool across seeds only; other differences would be mixed in silently
            log.warning("sweep %s mixes %s values %s; cells aggregate across them (flagged in the report)",
                        sweep.sweep_id, name, list(values))
    return SweepData(sweep, trials, unplaced, pair_ratios(client, finished_trials(trials)))
