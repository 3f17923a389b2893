"""`make readme-example`: run the README's one-trial example and write its output into README.md.

The README shows one trial's real output. This tool runs the README's command itself
(`python -m src.run` with EXAMPLE, on the default model, trained on first use, tracked into the
store in force like any run of that command), keeps what it prints on stdout (Hydra's log lines,
with their prefix; the progress bars go to stderr), and replaces the block between the README's
EXAMPLE markers with it, and the date, commit and machine it ran on. tests/cli/test_readme.py
runs the same command on the tiny model and checks that the block has the lines it prints now
(numbers aside), so the example cannot go stale. A tool: nothing in the package imports it.

    python -m src.readme_example            # run, then rewrite README.md
    python -m src.readme_example --print    # run, print the block only
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys

from .engine.atomic import write_text
from .door import ArgParser, command
from .engine.errors import SpecsweepError
from .paths import REPO

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


def run_example(*extra: str) -> str:
    """What `python -m src.run <EXAMPLE> <extra>` prints on stdout; SpecsweepError if it fails."""
    proc = subprocess.run([sys.executable, "-m", "src.run", *EXAMPLE, *extra], cwd=REPO, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecsweepError(f"the example command failed (exit {proc.returncode}): {last}")
    return proc.stdout.rstrip("\n")


def example_block() -> str:
    """The example command's stdout, fenced, with where it ran."""
    out = run_example()
    when = datetime.date.today().isoformat()
    return (f"`python -m src.run {' '.join(EXAMPLE)}` on {when}, commit {commit()}, {machine()} (its stdout; "
            f"the progress bars go to stderr):\n\n```\n{out}\n```")


def replace_block(text: str, block: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SpecsweepError(f"README.md has no {BEGIN} ... {END} block")
    return pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text)


def main(argv: list[str] | None = None) -> int:
    p = ArgParser(prog="python -m src.readme_example", description=__doc__.splitlines()[0])
    p.add_argument("--print", action="store_true", help="print the block, leave README.md as it is")
    args = p.parse_args(argv)
    return command(lambda: rewrite(args.print))


def rewrite(print_only: bool) -> None:
    block = example_block()
    if print_only:
        print(block)
        return
    write_text(README, replace_block(README.read_text(), block))  # atomically: no half-written README
    print(f"README.md: example block rewritten\n{block}")


if __name__ == "__main__":
    sys.exit(main())
