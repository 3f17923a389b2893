"""The report's figures (matplotlib, Agg backend: no display needed).

speedup vs k: per draft the pooled median with its interval as a band, the extended model dashed and
the seed formula dotted, a line at 1.0; acceptance vs k; predicted vs measured with y = x.
"""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import pandas as pd  # noqa: E402

from .cost_models import MODELS  # noqa: E402

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
