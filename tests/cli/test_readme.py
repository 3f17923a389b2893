"""The README's one-trial example is what the command prints: its command is the one
`make readme-example` runs, and its block has the lines that command prints now on stdout (numbers,
names and the generated text aside; Hydra's log prefix included), for the same draft and k on the
tiny model."""
from __future__ import annotations

import pytest
import re

from src.paths import REPO
from src.readme_example import BEGIN, END, EXAMPLE, run_example

# lines printed only when a trial's timing calls for them, or on a store's or a cache's first use
OPTIONAL = ("warning:", "note:", "published target", "training target", "trained target", "step ")
PREFIX = re.compile(r"^\[[^\]]*\]\[([^\]]*)\]\[([A-Z]+)\] - ")   # Hydra's: [time][logger][LEVEL] -


def split_prefix(line: str) -> tuple[str, str]:
    """(Hydra's log prefix without its time, the line's own text)."""
    m = PREFIX.match(line)
    return (f"[{m.group(1)}][{m.group(2)}] - ", line[m.end():]) if m else ("", line)


def shape(line: str) -> str:
    """A line with its values blanked: numbers, the generated text, hex keys, why a timing
    stopped (the width, or a cap: that depends on the machine); the log prefix keeps its logger."""
    prefix, line = split_prefix(line)
    if line.startswith("text "):
        return prefix + "text ..."
    line = re.sub(r"\b(width|cap|pairs cap|time cap|rounds cap) reached", "STOP reached", line)
    line = re.sub(r"\b[0-9a-f]{16}\b", "KEY", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return prefix + re.sub(r"\s+", " ", line).strip()


def shapes(block: str) -> list[str]:
    return [shape(line) for line in block.splitlines()
            if line.strip() and not split_prefix(line)[1].startswith(OPTIONAL)]


def readme_block() -> tuple[str, str]:
    text = (REPO / "README.md").read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    fenced = block.split("```")
    assert len(fenced) == 3, "the example block holds one fenced output (run `make readme-example`)"
    return fenced[0], fenced[1]


def test_the_readme_shows_the_command_the_example_runs():
    header, _ = readme_block()
    command = "python -m src.run " + " ".join(EXAMPLE)
    assert f"`{command}`" in header
    assert f"{command}" in (REPO / "README.md").read_text().split(BEGIN, 1)[0]


@pytest.mark.slow
def test_the_readme_output_has_the_lines_the_command_prints(tiny, tmp_path):
    """The README's block is the command's stdout: the same command on the tiny model, tracked into
    a store of its own, prints the same lines (numbers aside), each behind Hydra's log prefix."""
    cfg, _, _ = tiny
    # the example's adaptive pairs and cost rounds (the defaults), with small caps: seconds here
    now = run_example("model=tiny", "train=quick", f"data.path={cfg.data.path}", f"data.cache_dir={cfg.data.cache_dir}",
                      f"prompt='{cfg.prompt}'", "n_chars=64", "timing.pairs=2", "timing.target_width=0.1",
                      "timing.max_pairs=4", "timing.cost_width=0.05", "timing.cost_max_rounds=8", "timing.lock=false",
                      f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/run")
    _, shown = readme_block()
    assert all(PREFIX.match(line) for line in shown.strip().splitlines()), "the block is not the command's output"
    assert shapes(shown) == shapes(now)


def test_the_comparison_catches_a_stale_line():
    """The negative control: an output with one line renamed, or one missing, does not match."""
    _, shown = readme_block()
    lines = shown.strip().splitlines()
    renamed = "\n".join([lines[0].replace("draft", "drafts", 1)] + lines[1:])
    assert shapes(renamed) != shapes(shown)
    assert shapes("\n".join(lines[:-1])) != shapes(shown)


def layout_rows(text: str) -> dict[str, str]:
    """A layout table's rows: the first cell's first `path` -> the row."""
    import re
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `([\w/.]+)`", line)
        if m:
            rows.setdefault(m.group(1), line)
    return rows


def named_in(row: str) -> set[str]:
    import re
    return set(re.findall(r"`([\w/]+)`", row))


def modules_of(folder) -> set[str]:
    """A folder's modules (by name) and its packages (NAME/)."""
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    return names | {p.name + "/" for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def test_the_layout_names_every_module():
    """Each module of the engine (its root and every room), the trial, the sweep and the analysis is
    named in its row of docs/layout.md, and the README's layout section names every room of the engine
    (a new module or room without a line there fails)."""
    from src.paths import REPO
    rows = layout_rows((REPO / "docs" / "layout.md").read_text())
    engine = REPO / "src" / "engine"
    folders = [engine, REPO / "src" / "trial", REPO / "src" / "sweep", REPO / "analysis"]
    folders += sorted(p for p in engine.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    for folder in folders:
        key = str(folder.relative_to(REPO)) + "/"
        assert key in rows, f"docs/layout.md has no row for {key}"
        modules = modules_of(folder) - ({p for p in modules_of(folder) if p.endswith("/")} if folder == engine else set())
        assert modules <= named_in(rows[key]), f"{key}: docs/layout.md's row lacks {sorted(modules - named_in(rows[key]))}"
    readme = (REPO / "README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rooms = {p for p in modules_of(engine) if p.endswith("/")}
    assert rooms <= named_in(readme), f"the README's layout lacks {sorted(rooms - named_in(readme))}"


def test_the_readme_is_read_in_five_minutes():
    """At most 200 lines: what does not fit goes to docs/ with a link."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
