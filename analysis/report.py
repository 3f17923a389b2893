"""`python -m analysis.report`: one sweep's MLflow runs -> the seed's tables, cost models, figures.

    python -m analysis.report                          # the latest sweep
    python -m analysis.report --sweep-id ID --out DIR --no-log-artifacts
    python -m analysis.report --tracking-uri sqlite:///path/mlflow.db --experiment specsweep

Prints the tables as Markdown; writes each as Markdown, CSV and LaTeX, the figures as PNG and
SVG, and report.md into --out (default results/<sweep_id>/), then logs that folder as the
artifacts "analysis/" of the sweep's parent run. The folder is replaced as a whole: everything
is written into a temporary sibling folder that is then renamed into place, so no file of an
older report of the sweep survives, and a crash mid-report leaves the old report whole. An
existing --out folder that this tool did not write (no `.specsweep-report` marker; analysis/outputs.py)
is refused, not replaced, and left as it was: before the store is read or anything computed. Bad input (no store, no
such sweep, no finished trial) ends with one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from mlflow.exceptions import MlflowException

from src.engine.atomic import write_text
from src.engine.errors import SpecsweepError
from src.sweep.store import resolve_uri

from . import figures
from .aggregate import configured_level, pooled_speedup, trial_status
from src.door import ArgParser, at_least, command
from .consistency import (TARGET_TOL, VERIFY_TOL, contradictions, flagged_cells, mark_regimes, mark_tables,
                          one_seed_note, rerun_commands)
from .cost_models import BOOTSTRAP, ModelResults, cell_predictions, predict_trials
from .outputs import atomic_folder, check_report_folder, markdown, write_figure, write_table
from .sweep_data import DEFAULT_EXPERIMENT, REPO, SweepData, connect, load_sweep, prompt_rows, with_cell_parts
from .loops import loops_table
from .pays import MAP_KS, pays_inputs
from .policy_tables import drafted_table, policies_table
from .regimes import batch_table, only_regime, regimes_of, regimes_table, speedup_by_batch, verify_cost_table
from .tables import (Table, acceptance_table, best_k_table, cost_by_k_table, cost_table, cpu_models,
                     cpu_models_per_cell, exactness_table, fit_table, memory_table, model_errors_table,
                     outliers_table, position_table, predictions_table, speedup_table, status_table)
from .workloads import category_frame, workload_tables

log = logging.getLogger(__name__)


@dataclass
class Report:
    data: SweepData
    status: pd.DataFrame
    cells: pd.DataFrame       # per cell: measured pooled speedup and each model's prediction
    models: ModelResults
    tables: list[Table]
    flags: pd.DataFrame       # cells whose measurements contradict the sweep (analysis/consistency.py)


def optional(build, *args) -> Table | None:
    """A table whose metrics the sweep did not log is left out with a warning, not a crash."""
    try:
        return build(*args)
    except KeyError as e:
        log.warning("table %s left out: the trials lack %s", build.__name__.removesuffix("_table"), e)
        return None


def build_report(data: SweepData, boots: int = BOOTSTRAP) -> Report:
    """The report's tables of one sweep; `boots` refits per held-out fold for its bootstrap interval
    (0: none, the interval columns stay blank)."""
    finished = data.finished
    if finished.empty:
        counts = data.trials["status"].value_counts().to_dict()
        raise SpecsweepError(f"sweep {data.sweep.sweep_id!r} has no finished trial (runs by status: {counts})")
    status = trial_status(data.trials)
    speedup = pooled_speedup(data.pairs, configured_level(finished))
    models = predict_trials(finished, boots)
    cells = cell_predictions(models.trials, speedup, models.intervals)
    cells = cells.merge(cpu_models_per_cell(finished).rename("cpu_models").reset_index(), on=["draft", "k"], how="left")
    cells = with_cell_parts(cells, finished)
    tables = [status_table(status),
              optional(acceptance_table, finished),
              optional(position_table, finished),
              optional(speedup_table, finished, speedup),
              optional(cost_table, finished),
              optional(cost_by_k_table, finished),
              optional(memory_table, finished),
              optional(predictions_table, cells),
              optional(model_errors_table, cells),
              optional(fit_table, models),
              optional(outliers_table, models),
              optional(best_k_table, cells, data.pairs, configured_level(finished)),
              optional(policies_table, cells, data.pairs, configured_level(finished)),
              optional(drafted_table, finished),
              optional(exactness_table, finished)]
    flags = contradictions(finished)
    if not flags.empty:
        tables.append(Table("flagged", "Flagged cells", flags, note=(
            "Cells whose measurements contradict the sweep's other cells: a verify pass of more chars costing "
            f"more than {VERIFY_TOL:.0%} less, a one-char target pass more than {TARGET_TOL:.0%} off the sweep's "
            "median for the same target and engine, counters that differ among a cell's seeds where they cannot. "
            "Their numbers are not answers: rerun them (the summary gives the command).")))
    return Report(data, status, cells, models, mark_tables([t for t in tables if t is not None], flags), flags)


def summary(report: Report, uri: str, experiment: str) -> str:
    s, status = report.data.sweep, report.status
    lines = [f"# Sweep {s.name or s.sweep_id} ({s.sweep_id})", "",
             f"Parent run {s.parent_run_id} in experiment {experiment!r} ({uri}), "
             f"started {s.start_time:%Y-%m-%d %H:%M}.",
             "",
             f"Trials: {status['seeds'].sum()} in the grid ({status['draft'].nunique()} drafts x "
             f"{status['k'].nunique()} k x {status['seeds'].max()} seeds): {status['finished'].sum()} finished, "
             f"{status['failed'].sum()} failed, {status['missing'].sum()} missing (no FINISHED run, failed included)."]
    if len(report.data.unplaced):
        lines.append(f"Runs without draft/k/seed params (in no cell): {len(report.data.unplaced)} "
                     f"({', '.join(report.data.unplaced['status'])}).")
    short = status[status["missing"] > 0]
    if len(short):
        lines.append("Cells short of trials: " + ", ".join(
            f"{r.draft} k={r.k} ({r.finished}/{r.seeds} finished)" for r in short.itertuples()) + ".")
    lines += cpu_lines(report.data.finished)
    per_trial: dict[tuple, list[str]] = {}
    for _, f in report.models.flagged.iterrows():
        per_trial.setdefault((f["draft"], f["k"], f["seed"]), []).append(
            f"{f['component']} {f['value']:.1f} vs cell median {f['cell median']:.1f}")
    if per_trial:
        lines += ["", f"Flagged trials ({len(per_trial)}; component times far from their cell's other seeds: see the "
                  "outliers table, and the fit table for the parameters without them): " + "; ".join(
                      f"{d} k={k} seed={seed} ({', '.join(what)})" for (d, k, seed), what in per_trial.items()) + "."]
    if not report.flags.empty:
        cells = sorted(flagged_cells(report.flags))
        lines += ["", f"Flagged cells ({len(cells)}: {', '.join(f'{d} k={k}' for d, k in cells)}): their measurements "
                  "contradict the sweep's other cells (the flagged table says how), so they are not answers. "
                  "Rerun just them:"]
        lines += [f"    {c}" for c in rerun_commands(report.flags, report.data.finished, report.data.sweep)]
    seeds = one_seed_note(report.data.finished)
    if seeds:
        lines += ["", seeds]
    best = next((t.df for t in report.tables if t.name == "best_k"), None)
    if best is not None and not best.empty:
        lines += ["", "Recommendations (speculate only where a measured interval lies above 1):"]
        lines += [f"- {r['draft']}: {r['recommendation']}"
                  f"{'; the seed bootstrap does not tell the best measured k from the next best' if r['clear'] == 'no' else ''}"
                  "."
                  for _, r in best.iterrows()]
    return "\n".join(lines) + "\n"


def cpu_lines(finished: pd.DataFrame) -> list[str]:
    """Which CPU models (and hosts) the finished trials ran on; a warning when there is more than one."""
    if finished.empty:
        return []
    models = cpu_models(finished)
    hosts = finished["host"] if "host" in finished.columns else pd.Series(pd.NA, index=finished.index)
    parts = []
    for model, g in finished.groupby(models, sort=True):
        names = sorted(hosts[g.index].dropna().astype(str).unique())
        parts.append(f"{model} ({len(g)} trials; host{'s' if len(names) != 1 else ''} "
                     f"{', '.join(names) if names else 'unknown'})")
    if len(parts) == 1:
        return ["", f"CPU model: {parts[0]}."]
    per_cell = cpu_models_per_cell(finished)
    mixed = per_cell[per_cell > 1]
    cells = ", ".join(f"{d} k={k}" for d, k in mixed.index) or "none (each cell ran on one CPU model)"
    return ["", f"WARNING: mixed CPU models. The finished trials ran on {len(parts)} CPU models: "
            + "; ".join(parts) + f". Cells whose pooled pair timings mix CPU models (flagged in the speedup "
            f"table): {cells}. The cost model's parameters are fitted across all of them."]


def render(report: Report, uri: str, experiment: str) -> str:
    return "\n".join([summary(report, uri, experiment)] + [markdown(t) for t in report.tables])


def write_outputs(report: Report, text: str, out_dir: Path, frame: pd.DataFrame | None = None) -> None:
    """Every table, report.md and the figures into `out_dir`, replaced as a whole (outputs.atomic_folder);
    frame: the per-category frame, whose figures go with them."""
    with atomic_folder(out_dir) as tmp:
        write_files(report, text, tmp)
        if frame is not None:
            write_category_figures(frame, tmp)


def write_files(report: Report, text: str, out_dir: Path) -> None:
    for table in report.tables:
        write_table(table, out_dir)
    write_text(out_dir / "report.md", text)
    acceptance = next((t.df for t in report.tables if t.name == "acceptance"), None)
    plots = {}
    if report.cells["measured"].notna().any():
        plots["speedup_vs_k"] = lambda: figures.speedup_vs_k(report.cells)
        plots["predicted_vs_measured"] = lambda: figures.predicted_vs_measured(report.cells)
    else:
        log.warning("no pair timings in this sweep: the speedup figures are left out")
    if acceptance is not None:
        plots["acceptance_vs_k"] = lambda: figures.acceptance_vs_k(acceptance)
    finished = report.data.finished
    for inputs in pays_inputs(finished, report.data.pairs, configured_level(finished)):  # one map per target
        stem = "pays_map_" + re.sub(r"[^\w.-]", "_", inputs.target_key)  # a target key is not trusted as a path
        plots[stem] = lambda i=inputs: figures.pays_map(i, MAP_KS)
    for stem, make in plots.items():
        fig = make()
        write_figure(fig, out_dir, stem)
        figures.plt.close(fig)


def default_out(sweep_id: str) -> Path:
    return REPO / "results" / re.sub(r"[^\w.-]", "_", sweep_id)  # a sweep id is not trusted as a path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgParser(prog="python -m analysis.report",
                                description="Turn one sweep's MLflow runs into tables, cost models and figures.")
    p.add_argument("--sweep-id", help="the sweep to report (default: the latest)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment (default: %(default)s)")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI, else sqlite:///<repo>/mlruns/mlflow.db")
    p.add_argument("--out", type=Path, help="output folder (default: results/<sweep_id>/)")
    p.add_argument("--no-log-artifacts", action="store_true", help="do not log the output folder to the parent run")
    p.add_argument("--bootstrap", type=at_least(0), default=BOOTSTRAP, metavar="N",
                   help="refits per held-out fold for its bootstrap interval; 0: none (default: %(default)s)")
    return p.parse_args(argv)


def workloads_of(client, data: SweepData) -> pd.DataFrame:
    """The per-category frame of a sweep with a workload of several prompts or several workloads,
    else an empty one (the per-category tables would repeat the overall ones)."""
    fin = data.finished
    several = ("prompts" in fin and (fin["prompts"] > 1).any()) or ("workload" in fin and fin["workload"].nunique() > 1)
    if not several:
        return pd.DataFrame()
    return category_frame(prompt_rows(client, fin), configured_level(fin))


def write_category_figures(frame: pd.DataFrame, out_dir: Path) -> None:
    """One speedup-by-category figure per timed workload of the per-category frame."""
    for workload in sorted(frame["workload"].unique()) if not frame.empty else []:
        if frame.loc[frame["workload"] == workload, "speedup"].notna().any():
            fig = figures.speedup_by_category(frame, workload)
            write_figure(fig, out_dir, "speedup_by_category_" + re.sub(r"[^\w.-]", "_", workload))
            figures.plt.close(fig)


def run(args: argparse.Namespace) -> Path:
    if args.out is not None:
        check_report_folder(args.out)   # a folder that will be refused, before the store is read
    uri = resolve_uri(args.tracking_uri)
    client = connect(uri)
    data = load_sweep(client, args.experiment, args.sweep_id)
    out_dir = check_report_folder(args.out or default_out(data.sweep.sweep_id))   # before the report is computed
    regimes = regimes_of(data)
    frame = workloads_of(client, data)
    per_category = workload_tables(frame)
    if len(regimes) == 1:
        report = build_report(data, args.bootstrap)
        report.tables += per_category
        text = render(report, uri, args.experiment)
        print(text)
        write_outputs(report, text, out_dir, frame)
    else:  # one report per regime (its own fits), in its own folder, and the answer per regime on top
        reports = {r: build_report(only_regime(data, r), args.bootstrap) for r in regimes}
        texts = {r: render(rep, uri, args.experiment) for r, rep in reports.items()}
        answer = mark_regimes(regimes_table({r: rep.cells for r, rep in reports.items()},
                                            {r: only_regime(data, r).pairs for r in regimes},
                                            configured_level(data.finished)), reports)
        measured = pd.concat([rep.cells for rep in reports.values()], ignore_index=True)
        tables = [t for t in (answer, batch_table(answer.df), verify_cost_table(data.finished),
                              loops_table(data.finished, measured)) if t is not None] + per_category
        top = (f"# Sweep {data.sweep.name or data.sweep.sweep_id} ({data.sweep.sweep_id}): {len(regimes)} regimes "
               f"(engine, batch)\n\n" + "\n".join(markdown(t) for t in tables)
               + "\n\nEach regime's own report: " + ", ".join(f"{r.name}/report.md" for r in regimes) + "\n")
        print(top + "".join(f"\n## Regime {r.name}\n\n{texts[r]}" for r in regimes))
        with atomic_folder(out_dir) as tmp:
            for t in tables:
                write_table(t, tmp)
            write_text(tmp / "report.md", top)
            write_category_figures(frame, tmp)
            by_batch = speedup_by_batch(answer.df)
            if not by_batch.empty:
                fig = figures.speedup_vs_batch(by_batch)
                write_figure(fig, tmp, "speedup_vs_batch")
                figures.plt.close(fig)
            for r, rep in reports.items():
                (tmp / r.name).mkdir()
                write_files(rep, texts[r], tmp / r.name)
    log.info("wrote %s", out_dir)
    if not args.no_log_artifacts:
        try:
            client.log_artifacts(data.sweep.parent_run_id, str(out_dir), "analysis")
        except (MlflowException, OSError) as e:
            raise SpecsweepError(f"wrote {out_dir} but could not log it to run "
                                 f"{data.sweep.parent_run_id}: {e}") from None
    return out_dir


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return command(lambda: run(args), reads_store=True, quiet=True)


if __name__ == "__main__":
    sys.exit(main())
