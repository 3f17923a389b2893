"""Render tables as Markdown, CSV and LaTeX, and write files atomically.

CSV keeps full precision (it is for further analysis); Markdown and LaTeX use each table's
number formats (they are for reading). Every file is written to a temporary name and renamed,
so a crash never leaves a half-written table under the real name.
"""
from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from pandas.api.types import is_numeric_dtype

from src.engine.atomic import write_bytes, write_text

from .tables import Table


def format_value(value, spec: str) -> str:
    if isinstance(value, str):
        return value
    if pd.isna(value):
        return ""
    return format(value, spec)


def default_format(col: pd.Series) -> str:
    if pd.api.types.is_integer_dtype(col):
        return "d"
    return ".3f" if is_numeric_dtype(col) else ""


def formatted(table: Table) -> pd.DataFrame:
    """The table with every value a string in its column's format; blank for missing values."""
    out = {}
    for name in table.df.columns:
        col = table.df[name]
        spec = table.formats.get(name, default_format(col))
        out[name] = [format_value(v, spec) for v in col]
    return pd.DataFrame(out, columns=table.df.columns)


def markdown(table: Table) -> str:
    text = formatted(table)
    right = [is_numeric_dtype(table.df[c]) for c in table.df.columns]  # numbers right-aligned
    lines = [f"### {table.title}", ""]
    if table.note:
        lines += [table.note, ""]
    if text.empty:
        return "\n".join(lines + ["(no rows)", ""])
    lines.append("| " + " | ".join(map(str, text.columns)) + " |")
    lines.append("|" + "|".join("---:" if r else "---" for r in right) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in text.itertuples(index=False)]
    return "\n".join(lines + [""])


def latex(table: Table) -> str:
    align = "".join("r" if is_numeric_dtype(table.df[c]) else "l" for c in table.df.columns)
    return formatted(table).to_latex(index=False, escape=True, column_format=align)


def csv(table: Table) -> str:
    buf = io.StringIO()
    table.df.to_csv(buf, index=False)
    return buf.getvalue()


def write_table(table: Table, out_dir: Path) -> list[Path]:
    paths = []
    for suffix, render in ((".md", markdown), (".csv", csv), (".tex", latex)):
        path = out_dir / f"{table.name}{suffix}"
        write_text(path, render(table))
        paths.append(path)
    return paths


def write_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    """PNG and SVG of a matplotlib figure; no date in the SVG so reruns give the same file."""
    paths = []
    for fmt in ("png", "svg"):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=150, bbox_inches="tight", metadata={"Date": None} if fmt == "svg" else None)
        path = out_dir / f"{stem}.{fmt}"
        write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths
