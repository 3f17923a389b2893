"""The tool's loop against transformers' loop on the same weights, and the cost model's account of
the difference.

Every trial measures, inside its own loop (src/engine/measuring/measure.py, src/engine/huggingface/library_loop.py): the loop's
plain decoding step per char (`base_pass_us`, the baseline loop timed with the components), the
verify pass of the pass's width (`verify_pass_us`), the draft's time per drafted char
(`draft_char_us`) and the speculative loop's own work per pass beyond those two
(`overhead_us_per_pass`, what is left of the median speculative run). In units of the loop's own
plain step F_B, a speculative pass costs

    verify / F_B  +  drafted per pass * draft / F_B  +  overhead / F_B

plain steps, and the account's speedup is chars per pass over that sum. Side by side per draft and
k, the term that grows most from one loop to the other is what makes that loop slower (or faster)."""
from __future__ import annotations

import pandas as pd

from .sweep_data import cell_labels
from .tables import Table

NEED = ("base_pass_us", "verify_pass_us", "draft_char_us", "overhead_us_per_pass", "chars_per_pass", "proposed",
        "target_passes")


def loops_table(finished: pd.DataFrame, measured: pd.DataFrame) -> Table | None:
    """Each draft and k measured in transformers' loop and in a tool's loop (eager, compiled, onnx).
    measured: per cell label (draft as the report writes it) and k, the pooled measured speedup and
    its interval (columns draft, k, measured, lo, hi). None when no draft ran in both."""
    need = set(NEED) | {"engine", "k", "draft"}
    if finished.empty or not need <= set(finished.columns):
        return None
    t = finished[finished["batch"].fillna(1) == 1] if "batch" in finished.columns else finished
    t = t.dropna(subset=list(NEED))
    if t.empty or "transformers" not in set(t["engine"]):
        return None
    base = t["base_pass_us"]
    rows = pd.DataFrame({"cell": t["draft"], "draft": cell_labels(t, leave_out=("engine",)), "loop": t["engine"],
                         "k": t["k"].astype(int), "chars/pass": t["chars_per_pass"], "plain step us": base,
                         "verify": t["verify_pass_us"] / base,
                         "draft cost": t["proposed"] / t["target_passes"] * t["draft_char_us"] / base,
                         "overhead": t["overhead_us_per_pass"] / base})
    cells = rows.groupby(["cell", "draft", "loop", "k"], as_index=False).median(numeric_only=True)
    cells["pass"] = cells["verify"] + cells["draft cost"] + cells["overhead"]
    cells["account"] = cells["chars/pass"] / cells["pass"]
    cells = cells.merge(measured.rename(columns={"draft": "cell"})[["cell", "k", "measured", "lo", "hi"]],
                        on=["cell", "k"], how="left")
    both = cells.groupby(["draft", "k"])["loop"].transform(lambda s: "transformers" in set(s) and s.nunique() > 1)
    cells = cells[both.astype(bool)].copy()
    if cells.empty:
        return None
    cells["differs most"] = ""
    for _, g in cells.groupby(["draft", "k"]):
        lib = g[g["loop"] == "transformers"].iloc[0]
        for i, r in g[g["loop"] != "transformers"].iterrows():
            diff = {term: lib[col] - r[col] for term, col in (("verify", "verify"), ("draft", "draft cost"),
                                                              ("overhead", "overhead"))}
            term = max(diff, key=lambda x: abs(diff[x]))
            cells.loc[i, "differs most"] = f"{term} {diff[term]:+.2f} in transformers"
    cells = cells.sort_values(["draft", "k", "loop"]).drop(columns=["cell"])
    df = cells[["draft", "k", "loop", "chars/pass", "plain step us", "verify", "draft cost", "overhead", "pass",
                "account", "measured", "lo", "hi", "differs most"]]
    return Table("loops", "The tool's loop against transformers' loop: each speculative pass in the loop's own plain "
                 "steps", df, {"chars/pass": ".2f", "plain step us": ".0f", "verify": ".2f", "draft cost": ".2f",
                               "overhead": ".2f", "pass": ".2f", "account": ".2f", "measured": ".2f", "lo": ".2f",
                               "hi": ".2f"},
                 "Per draft and k, one row per loop (the tool's engines, transformers' generate), medians over the "
                 "cell's seeds. plain step: the loop's own baseline step per char (base_pass_us). verify, draft cost "
                 "(drafted chars per pass x the draft's time per char) and overhead (the loop's own work per pass "
                 "beyond them) in plain steps; pass: their sum; account: chars per pass / pass, the speedup they "
                 "add up to; measured [lo-hi]: the pooled paired speedup. differs most: the term whose plain steps "
                 "change most from the tool's loop to transformers' (a tool's row).")
