"""`make readme-example`: run the README's one-trial example and write its output into README.md.

The README shows one trial's real output. This tool runs that trial (EXAMPLE, on the default
model, trained on first use; tracking off, so nothing is written to the store), renders it as
the CLI prints it (src/trial/render.py: trial_block), and replaces the block between the
README's EXAMPLE markers, with the date, commit and machine it ran on. tests/cli/test_readme.py
checks that the block has the lines the renderer prints now (numbers aside), so the example
cannot go stale. A tool: nothing in the package imports it.

    python -m src.readme_example            # run, then rewrite README.md
    python -m src.readme_example --print    # run, print the block only
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys

from hydra import compose, initialize_config_dir

from . import sweep  # noqa: F401  (its warning filter, before Hydra composes the launcher configs)
from .engine.atomic import write_text
from .engine.errors import SpecsweepError
from .paths import CONF_DIR, REPO
from .trial.render import trial_block
from .trial.spec import trial_spec
from .trial.trial import run_trial

EXAMPLE = ["draft=ngram", "k=8"]          # python -m src.run draft=ngram k=8
BEGIN, END = "<!-- example output: begin -->", "<!-- example output: end -->"
README = REPO / "README.md"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), {platform.system()}"


def commit() -> str:
    """The short commit, and whether the tree had uncommitted changes."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return (out.stdout.strip() or "unknown") + (" with uncommitted changes" if dirty else "")


def example_block() -> str:
    """The example trial's output, as the CLI prints it, fenced, with where it ran."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=EXAMPLE)
    spec = trial_spec(cfg)
    result = run_trial(spec, progress=True)
    when = datetime.date.today().isoformat()
    return (f"`python -m src.run {' '.join(EXAMPLE)}` on {when}, commit {commit()}, {machine()}:\n\n"
            f"```\n{trial_block(spec, result)}\n```")


def replace_block(text: str, block: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SpecsweepError(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m src.readme_example", description=__doc__.splitlines()[0])
    p.add_argument("--print", action="store_true", help="print the block, leave README.md as it is")
    args = p.parse_args(argv)
    try:
        block = example_block()
        if args.print:
            print(block)
            return 0
        write_text(README, replace_block(README.read_text(), block))  # atomically: no half-written README
    except SpecsweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"README.md: example block rewritten\n{block}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
