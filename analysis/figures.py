"""The report's figures (matplotlib, Agg backend: no display needed).

speedup vs k: per draft the pooled median with its interval as a band, the extended model dashed and
the seed formula dotted, a line at 1.0; acceptance vs k; predicted vs measured with y = x; the pays
map (predicted chain speedup over per-position acceptance and draft cost, one per target); speedup vs
the batch size, one panel per engine.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .cost_models import MODELS  # noqa: E402
from .pays import pays_grid  # noqa: E402

plt.rcParams["svg.hashsalt"] = "specsweep"  # stable SVG ids: reruns give identical files


def speedup_vs_k(cells: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (draft, g) in enumerate(cells.dropna(subset=["measured"]).groupby("draft", sort=True)):
        color = f"C{i}"
        ax.plot(g["k"], g["measured"], "o-", color=color, label=f"{draft} (median)")
        ax.fill_between(g["k"], g["lo"], g["hi"], color=color, alpha=0.2, linewidth=0)
        if g["pred_extended"].notna().any():
            ax.plot(g["k"], g["pred_extended"], "--", color=color, label=f"{draft} extended model")
        ax.plot(g["k"], g["pred_seed"], ":", color=color, label=f"{draft} seed formula")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="k (drafted chars per target pass)", ylabel="speedup (baseline / speculative)",
           title="Speedup vs k (band: interval for the pooled median)")
    ax.set_xticks(sorted(cells["k"].unique()))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: the lines cross everywhere
    return fig


def speedup_vs_batch(rows: pd.DataFrame):
    """`rows`: the regimes table's rows (draft, engine, batch, best k, speedup, lo, hi) of drafts
    measured at several batch sizes. One panel per engine: each draft's best cell against B (log2
    axis), its interval as error bars, a line at 1.0."""
    engines = sorted(rows["engine"].unique())
    fig, axes = plt.subplots(1, len(engines), figsize=(5 * len(engines), 4), sharey=True, squeeze=False)
    drafts = sorted(rows["draft"].unique())
    for ax, engine in zip(axes[0], engines):
        for draft, g in rows[rows["engine"] == engine].groupby("draft", sort=True):
            g = g.sort_values("batch")
            err = np.vstack([g["speedup"] - g["lo"], g["hi"] - g["speedup"]])
            ax.errorbar(g["batch"], g["speedup"], yerr=err, fmt="o-", capsize=3, color=f"C{drafts.index(draft)}",
                        label=draft)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(rows["batch"].unique()), [str(b) for b in sorted(rows["batch"].unique())])
        ax.set(xlabel="batch size B (sequences decoded together)", title=f"engine {engine}")
    axes[0][0].set_ylabel("throughput speedup at the best k")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def speedup_by_category(frame: pd.DataFrame, workload: str):
    """`frame`: analysis/workloads.py's category_frame. One panel per category of `workload` (and
    overall): each cell's speedup against k, its interval as error bars, a line at 1.0."""
    f = frame[(frame["workload"] == workload) & frame["speedup"].notna()]
    categories = list(dict.fromkeys(f["category"]))
    cells = sorted(f["cell"].unique())
    fig, axes = plt.subplots(1, len(categories), figsize=(3.6 * len(categories), 3.8), sharey=True, squeeze=False)
    for ax, category in zip(axes[0], categories):
        for cell, g in f[f["category"] == category].groupby("cell", sort=True):
            g = g.sort_values("k")
            err = np.vstack([g["speedup"] - g["lo"], g["hi"] - g["speedup"]])
            ax.errorbar(g["k"], g["speedup"], yerr=err, fmt="o-", capsize=3, color=f"C{cells.index(cell)}", label=cell)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ks = sorted(f["k"].unique())
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set(xlabel="k", title=category)
    axes[0][0].set_ylabel(f"speedup (total time), workload {workload}")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def acceptance_vs_k(acceptance: pd.DataFrame):
    """`acceptance`: the acceptance table's frame (draft, k, acceptance, per-position acceptance)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (draft, g) in enumerate(acceptance.groupby("draft", sort=True)):
        ax.plot(g["k"], g["acceptance"], "o-", color=f"C{i}", label=f"{draft} accepted / proposed")
        if "per-position acceptance" in g:
            ax.plot(g["k"], g["per-position acceptance"], "s--", color=f"C{i}", label=f"{draft} per position")
    ax.set(xlabel="k (drafted chars per target pass)", ylabel="acceptance", ylim=(0, 1.05),
           title="Acceptance vs k (median over seeds)")
    ax.set_xticks(sorted(acceptance["k"].unique()))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def predicted_vs_measured(cells: pd.DataFrame):
    fig, ax = plt.subplots(figsize=(5, 5))
    markers = {"seed": "o", "closed": "^", "extended": "s", "held_out": "x", "paper": "D"}
    values = [cells["measured"]]
    for m, label in MODELS.items():
        pred = cells[f"pred_{m}"]
        if pred.notna().any():
            ax.scatter(cells["measured"], pred, marker=markers[m], label=label)
            values.append(pred)
    lo = min(v.min() for v in values) * 0.95
    hi = max(v.max() for v in values) * 1.05
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="y = x")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured speedup (pooled median)", ylabel="predicted speedup",
           title="Predicted vs measured, one point per cell")
    ax.legend(fontsize=7)
    return fig


PAYS_LEVELS = (1.0, 2.0, 3.0)


def pays_map(inputs, ks, grid: int = 241):
    """Predicted chain speedup at the best k in `ks` over per-position acceptance a in [0, 0.999]
    and draft cost c = td / t1 in [0, 1.2], for one target (`pays.PaysInputs`: its verify-cost
    line and loop overheads), contours at PAYS_LEVELS, and the sweep's chain cells as points, one
    colour per draft, labelled with the draft, its k and their measured speedups."""
    from matplotlib.colors import TwoSlopeNorm

    a = np.linspace(0.0, 0.999, grid)
    c = np.linspace(0.0, 1.2, grid)
    A, C = np.meshgrid(a, c)                                                   # (grid, grid): rows c, columns a
    s, _ = pays_grid(A, C, ks, inputs.verify_ratio, inputs.overheads, inputs.t1)
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    norm = TwoSlopeNorm(vmin=0.0, vcenter=1.0, vmax=4.0)                       # white at 1x; 4x and above: darkest
    mesh = ax.pcolormesh(A, C, s, shading="auto", cmap="RdYlGn", norm=norm)
    fig.colorbar(mesh, ax=ax, label=f"predicted speedup, best k in {ks[0]}..{ks[-1]} (colour capped at 4x)")
    levels = [v for v in PAYS_LEVELS if s.min() < v < s.max()]
    if levels:
        cs = ax.contour(A, C, s, levels=levels, colors="black", linewidths=1.0)
        ax.clabel(cs, fmt=lambda v: f"{v:g}x", fontsize=8)
    for i, (draft, g) in enumerate(inputs.points.groupby("draft", sort=True)):
        color = f"C{i}"
        ax.scatter(g["a"], g["c"], s=18, color=color, edgecolors="black", linewidths=0.5, zorder=3, label=draft)
        g = g.sort_values("k")
        measured = ", ".join(f"{m:.2f}" if pd.notna(m) else "-" for m in g["measured"])
        label = f"{draft} k={','.join(map(str, g['k']))}" + (f": {measured}x" if g["measured"].notna().any() else "")
        at = (g["a"].median(), g["c"].median())
        dy = (-12 if at[1] > 0.6 else 12) * (i + 1)                               # one row per draft, off the edge
        ax.annotate(label, at, textcoords="offset points", xytext=(-150 if at[0] > 0.6 else 10, dy), fontsize=7,
                    arrowprops={"arrowstyle": "-", "color": color, "lw": 0.6})
    drafts = sorted(inputs.points["draft"].unique()) if len(inputs.points) else []
    for draft, g in inputs.categories.groupby("draft", sort=True):   # a workload's categories: where each falls
        color = f"C{drafts.index(draft)}" if draft in drafts else "black"
        ax.scatter(g["a"], g["c"], s=30, facecolors="none", edgecolors=color, linewidths=0.9, zorder=3)
        for r in g.itertuples():
            ax.annotate(r.category, (r.a, r.c), textcoords="offset points", xytext=(3, 3), fontsize=6, color=color)
    if len(inputs.points):
        ax.legend(fontsize=7, loc="upper left", title="measured cells (hollow: a workload's categories)",
                  title_fontsize=7)
    o = inputs.overheads
    ax.set(xlim=(0, 1.0), ylim=(0, 1.2), xlabel="per-position acceptance a",
           ylabel="draft cost c = draft time per char / target pass")
    ax.set_title(f"Where speculation pays (chain, i.i.d. acceptance): target {inputs.target_key}\n"
                 f"tv(k)/t1 = 1 + {inputs.b:.3f} k, o_pass {o.o_pass / inputs.t1:.2f} t1, o_base "
                 f"{o.o_base / inputs.t1:.2f} t1, gamma {o.gamma:.2f} (t1 = {inputs.t1:.0f} us)", fontsize=9)
    return fig
