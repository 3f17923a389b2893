"""The README's one-trial example is what the code prints: its command is the one
`make readme-example` runs, and its block has the lines the renderer prints now (numbers,
names and the generated text aside), for a real trial of the same draft and k on the tiny model."""
from __future__ import annotations

import re

from src.paths import REPO
from src.readme_example import BEGIN, END, EXAMPLE
from src.trial.render import trial_block
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg

OPTIONAL = ("warning:", "note:")   # printed only when a trial's timing calls for them


def shape(line: str) -> str:
    """A line with its values blanked: numbers, the generated text, hex keys, why a timing
    stopped (the width, or a cap: that depends on the machine)."""
    if line.startswith("text "):
        return "text ..."
    line = re.sub(r"\b(width|cap|pairs cap|time cap|rounds cap) reached", "STOP reached", line)
    line = re.sub(r"\b[0-9a-f]{16}\b", "KEY", line)
    line = re.sub(r"\d+(\.\d+)?", "N", line)
    return re.sub(r"\s+", " ", line).strip()


def shapes(block: str) -> list[str]:
    return [shape(line) for line in block.splitlines() if line.strip() and not line.startswith(OPTIONAL)]


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


def test_the_readme_output_has_the_lines_the_code_prints(tiny):
    cfg, corpus, target = tiny
    # the example's adaptive pairs and cost rounds (the defaults), with small caps: seconds here
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, *EXAMPLE, "timing.pairs=2",
                                  "timing.target_width=0.1", "timing.max_pairs=4", "timing.cost_width=0.05",
                                  "timing.cost_max_rounds=8", "timing.lock=false"))
    now = trial_block(spec, run_trial(spec, progress=False, loaded=(corpus, target)))
    _, shown = readme_block()
    assert shapes(shown) == shapes(now)


def test_the_comparison_catches_a_stale_line():
    """The negative control: an output with one line renamed, or one missing, does not match."""
    _, shown = readme_block()
    lines = shown.strip().splitlines()
    renamed = "\n".join([lines[0].replace("draft", "drafts", 1)] + lines[1:])
    assert shapes(renamed) != shapes(shown)
    assert shapes("\n".join(lines[:-1])) != shapes(shown)


def test_the_readme_layout_names_every_module():
    """Each module of src/engine, src/trial, src/sweep and analysis/ is named in its row of the
    README's layout table (a new module without a line there fails)."""
    import re

    from src.paths import REPO
    text = (REPO / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n\n", 2)[1]
    for folder in ("src/engine", "src/trial", "src/sweep", "analysis"):
        row = next(line for line in layout.splitlines() if line.startswith(f"| `{folder}/`"))
        named = set(re.findall(r"`([\w/]+)`", row))
        modules = {p.stem for p in (REPO / folder).glob("*.py") if p.stem != "__init__"}
        modules |= {p.name + "/" for p in (REPO / folder).iterdir() if p.is_dir() and (p / "__init__.py").exists()}
        assert modules <= named, f"{folder}: the README's layout lacks {sorted(modules - named)}"
