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
KEY = ["draft", "k", "seed"]   # one trial ("draft": its cell's label, built from CELL_PARTS)
CELL = ["draft", "k"]          # one table row: a trial aggregated across seeds
# what a cell is, as columns of the trials frame: the draft, the options a sweep varied ("" if none),
# the draft-length policy ("fixed"), the tree's widths ("" for a chain), the engine, the batch size,
# the workload ("single")
CELL_PARTS = ["draft_name", "draft_options", "policy", "tree", "engine", "batch", "workload"]
INT_PARAMS = ["k", "seed", "n_chars", "pairs_min"]
FLOAT_PARAMS = ["temperature", "confidence"]
STR_PARAMS = ["draft", "target_key", "workload"]
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
    command_overrides: str = ""   # the overrides its command was given (its parent run's tag), as the shell split them


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
    name, overrides = row.get("tags.sweep_name"), row.get("tags.command_overrides")
    return Sweep(sweep_id=row["tags.sweep_id"], name=name if isinstance(name, str) else "",
                 parent_run_id=row["run_id"], experiment_id=exp.experiment_id, start_time=row["start_time"],
                 command_overrides=overrides if isinstance(overrides, str) else "")


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
    # a cell is its columns (CELL_PARTS): the draft, its swept options, the draft-length policy, the
    # tree shape, the engine and the batch size; "draft" becomes the label built from them
    out["draft_name"] = out["draft"]
    out["draft_options"] = swept_options(raw, out["draft_name"])
    policy = raw.get("params.policy.name")
    out["policy"] = "fixed" if policy is None else policy.fillna("fixed")
    verify, widths = raw.get("params.verify"), raw.get("params.tree_widths")
    tree = (verify == "tree") & widths.notna() if verify is not None and widths is not None else None
    out["tree"] = "" if tree is None else widths.where(tree, "").astype(object)
    engine = raw.get("params.engine.name")
    out["engine"] = engine.fillna("eager") if engine is not None else "eager"
    batch = raw.get("params.batch")
    out["batch"] = 1 if batch is None else pd.to_numeric(batch, errors="coerce").fillna(1).astype(int)
    out["workload"] = out["workload"].fillna("single").astype(object)   # runs before workloads: the one prompt
    out["draft"] = cell_labels(out)
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


def swept_options(raw: pd.DataFrame, draft: pd.Series) -> pd.Series:
    """Per run, the draft's own options a sweep varied ("order=4", "distill_chars=1000000"; "" when
    none): each option that takes more than one value among that draft's runs, in the order the
    runs logged them. A draft whose options all agree has none, and a run that lacks an option
    others logged (another code version) does not split its cell."""
    options = {c: m.group(1) for c in raw.columns if (m := DRAFT_OPTION.fullmatch(c)) and m.group(1) not in NOT_OPTIONS}
    out = pd.Series("", index=draft.index, dtype=object)
    for name in draft.dropna().unique():
        rows = draft == name
        swept = [c for c in options if raw.loc[rows, c].nunique(dropna=True) > 1]
        if swept:
            values = raw.loc[rows, swept].astype(str)
            out[rows] = values.apply(lambda r: ",".join(f"{options[c]}={v}" for c, v in r.items()), axis=1)
    return out


def cell_labels(cells: pd.DataFrame, leave_out: tuple[str, ...] = ()) -> pd.Series:
    """The display label of each row's cell, from its CELL_PARTS columns (those in `leave_out`
    left out): "<draft>[<options>]~<policy>+tree<widths>@<engine>@B<batch>#<workload>", every part
    after the draft only where it is not the default (ngram, distilled[distill_chars=None],
    ngram~heuristic, bigram+tree4-2-2-1, ngram@compiled@B16, ngram#validation). Labels are for
    tables and figures; the analysis reads the columns, never parses a label."""
    def part(name: str, show, text) -> pd.Series:
        if name in leave_out or name not in cells:
            return pd.Series("", index=cells.index, dtype=object)
        col = cells[name]
        return col.map(lambda v: text(v) if show(v) else "").astype(object)
    label = cells["draft_name"].astype(object)
    placed = label.notna()     # a run that died before logging its draft has no cell
    if not placed.any():
        return label
    cells = cells[placed]
    label[placed] = (label[placed] + part("draft_options", bool, lambda v: f"[{v}]")
                     + part("policy", lambda v: v != "fixed", lambda v: f"~{v}")
                     + part("tree", bool, lambda v: f"+tree{v}")
                     + part("engine", lambda v: v != "eager", lambda v: f"@{v}")
                     + part("batch", lambda v: int(v) > 1, lambda v: f"@B{int(v)}")
                     + part("workload", lambda v: v != "single", lambda v: f"#{v}"))
    return label


def with_cell_parts(cells: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """`cells` (rows keyed by the label "draft", e.g. an aggregate) with the CELL_PARTS columns of
    their trials, for analyses that read a cell's policy, tree, engine or batch."""
    parts = trials.drop_duplicates("draft")[["draft", *(c for c in CELL_PARTS if c in trials)]]
    return cells.drop(columns=[c for c in CELL_PARTS if c in cells]).merge(parts, on="draft", how="left")


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


def load_sweeps(client: MlflowClient, experiment: str, sweep_ids: list[str]) -> SweepData:
    """Several sweeps read as one (the seed rounds of one sweep, each run as a sweep of its own by
    src.bench.predict_rounds): their trials and unplaced runs concatenated, `sweep` the first's. A trial
    (draft, k, seed) finished in two of them counts once, its newest run (`finished_trials`), and
    the pairs are that run's only. A sweep id given twice is refused."""
    if len(set(sweep_ids)) != len(sweep_ids):
        raise SpecsweepError(f"a sweep id is given twice: {', '.join(sweep_ids)}")
    return combine_sweeps([load_sweep(client, experiment, i) for i in sweep_ids])


def combine_sweeps(parts: list[SweepData]) -> SweepData:
    """`load_sweeps` of sweeps already loaded (distinct ones): one, itself."""
    if len(parts) == 1:
        return parts[0]
    trials, unplaced, pairs = (pd.concat([getattr(p, f) for p in parts], ignore_index=True)
                               for f in ("trials", "unplaced", "pairs"))
    kept = set(finished_trials(trials)["run_id"])
    return SweepData(parts[0].sweep, trials, unplaced, pairs[pairs["run_id"].isin(kept)].reset_index(drop=True))


PROMPTS_ARTIFACT = "prompts.csv"
PROMPT_COLUMNS = ["run_id", "prompt", "category", "n_chars", "target_passes", "chars", "baseline_s", "speculative_s",
                  "baseline_rounds", "speculative_rounds"]


def prompt_rows(client: MlflowClient, finished: pd.DataFrame) -> pd.DataFrame:
    """Long frame of every finished trial's prompts (its prompts.csv artifact: the workload's prompts,
    their counters and, at batch 1, their times per round), with the trial's cell columns. A trial
    from before workloads (no such artifact) is left out with a warning; an empty frame when none has one."""
    import os
    import tempfile
    frames, missing = [], 0
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")   # one bar per trial otherwise
    with tempfile.TemporaryDirectory() as tmp:
        for t in finished.itertuples():
            try:
                path = client.download_artifacts(t.run_id, PROMPTS_ARTIFACT, tmp)
            except Exception:   # noqa: BLE001 - an older run without it, or a store without its artifacts
                missing += 1
                continue
            df = pd.read_csv(path, keep_default_na=False, dtype={"category": str, "text": str})
            df.insert(0, "run_id", t.run_id)
            frames.append(df)
    if missing:
        log.warning("%d finished trials have no %s (run before workloads): left out of the tables per category",
                    missing, PROMPTS_ARTIFACT)
    if not frames:
        return pd.DataFrame(columns=PROMPT_COLUMNS)
    rows = pd.concat(frames, ignore_index=True)
    cells = finished[["run_id", "draft", "k", "seed", *(c for c in CELL_PARTS if c in finished)]]
    return rows.merge(cells, on="run_id", how="inner")
