"""Render tables as Markdown, CSV and LaTeX, and write files and folders atomically.

CSV keeps full precision (it is for further analysis); Markdown and LaTeX use each table's
number formats (they are for reading). Every file is written to a temporary name and renamed,
so a crash never leaves a half-written table under the real name; a whole report folder is
written into a temporary sibling folder and swapped in with renames (atomic_folder), so no
stale file of an older report survives and a crash mid-report leaves the old folder whole.
"""
from __future__ import annotations

import io
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from pandas.api.types import is_numeric_dtype

from src.engine.atomic import write_bytes, write_text
from src.engine.errors import SpecsweepError
from src.engine.locks import check_creatable

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


MARKER = ".specsweep-report"   # written into every folder atomic_folder makes: only such a folder is replaced
REPORT_SUFFIXES = {".md", ".csv", ".tex", ".png", ".svg"}   # what a report writes


def is_report_folder(path: Path, marker: str = MARKER) -> bool:
    """A folder atomic_folder made: it holds the marker. A report written before the marker existed
    counts when it holds report.md and nothing but what a report writes (tables, figures, a
    regime's subfolder of them): a user's folder with a report.md beside notes or code does not."""
    if (path / marker).is_file():
        return True
    files = [p for p in path.rglob("*") if p.is_file()]
    return (path / "report.md").is_file() and all(p.suffix in REPORT_SUFFIXES for p in files)


def check_report_folder(path: str | Path, marker: str = MARKER) -> Path:
    """`path`, normalised, once it may take a report: a new folder where one can be made, an empty
    one, or a report folder this tool wrote (`is_report_folder`); a user's folder or file, or a
    place where no folder can be made (under a file, /proc), is refused in one sentence. Cheap:
    the report runs it before it reads the store or computes anything, atomic_folder again."""
    path = Path(os.path.abspath(path))  # normalised: the name of "out/.." is that of out's parent, not ".."
    if path.exists() and (not path.is_dir() or (any(path.iterdir()) and not is_report_folder(path, marker))):
        raise SpecsweepError(f"{path} exists and is not a report folder this tool wrote (no {marker}): "
                             "refusing to replace it; give --out an empty or new folder")
    check_creatable(path.parent, "the report folder")
    return path


def _sibling(path: Path, what: str) -> Path:
    """A fresh hidden name next to `path` (`*.tmp`: ignored by git)."""
    return path.with_name(f".{path.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


@contextmanager
def atomic_folder(path: str | Path, marker: str = MARKER):
    """Yield an empty temporary folder next to `path`; when the block succeeds, it replaces `path`.

    The swap is two renames: the old folder to a hidden sibling name, the new one onto `path`; then
    the old one is deleted. If the block raises, `path` is untouched and the temporary folder is
    removed. Between the two renames (microseconds) `path` is absent; a crash just there leaves the
    old report whole under the hidden `.<name>.old-*.tmp` name. An existing non-empty folder that
    `is_report_folder` does not recognise is refused rather than replaced (say, --out pointing at
    $HOME, or at a folder of the user's own that happens to hold a report.md). The new folder gets
    the marker, so the next report may replace it.
    """
    path = check_report_folder(path, marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, "new")
    tmp.mkdir()
    try:
        (tmp / marker).write_text("a report folder written by python -m analysis.report: the next report replaces it\n")
        yield tmp
        if path.exists():
            old = _sibling(path, "old")
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(old, path)  # put the old report back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
