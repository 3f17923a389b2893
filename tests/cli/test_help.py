"""`python -m src.run --help` explains the tool: its commands, every named sweep, the config
groups and the main keys with the values in force (the composed config's, overrides included)."""
from __future__ import annotations

import pytest
import re
import sys

from src.paths import CONF_DIR, REPO, SWEEPS_DIR
from tests.commands import run_command


def help_text(*overrides: str) -> str:
    proc = run_command([sys.executable, "-m", "src.run", *overrides, "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_help_lists_every_sweep_and_no_other():
    text = help_text()
    section = text.split("== Named sweeps", 1)[1].split("\n", 1)[1].split("==", 1)[0]
    listed = set(re.findall(r"^  (\w+) ", section, flags=re.M))
    assert listed == {p.stem for p in SWEEPS_DIR.glob("*.yaml")}


def test_help_says_how_to_sweep_and_lists_the_groups():
    text = help_text()
    assert "python -m src.run -m " in text and "--config-dir sweeps --config-name" in text
    for group in ("draft", "model", "data", "verify"):
        options = ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
        assert f"{group}: {options}" in text
    assert "Config ==" not in text.split("== Main keys", 1)[1]   # no dump of the whole config


def test_help_shows_the_values_in_force():
    assert "draft=int8  k=4  seed=0" in help_text()
    assert "draft=ngram  k=8  seed=3" in help_text("draft=ngram", "k=8", "seed=3")


def hand_count(path) -> int:
    """A sweep file's trials counted by hand: the product of its swept values (comma lists outside
    brackets, range(n)), independently of Hydra and the planner."""
    import math

    import yaml
    params = (yaml.safe_load(path.read_text()).get("hydra", {}).get("sweeper", {}) or {}).get("params") or {}
    sizes = []
    for value in map(str, params.values()):
        ranged = re.fullmatch(r"range\((\d+)\)", value)
        sizes.append(int(ranged.group(1)) if ranged else len(re.findall(r"\[[^\]]*\]|[^,\[\]]+", value)))
    return math.prod(sizes)


@pytest.mark.slow
def test_the_sweep_lists_are_generated_and_every_trial_count_is_the_planners():
    """The help's sweep list and the README's table are what `python -m src.sweep.catalog --write`
    makes of sweeps/*.yaml (run it after editing a sweep), and each count equals the product of the
    file's swept values, counted by hand."""
    from src.sweep.catalog import catalog, generated
    sweeps = catalog()
    assert {s.name for s in sweeps} == {p.stem for p in SWEEPS_DIR.glob("*.yaml")}
    for s in sweeps:
        assert s.trials == hand_count(SWEEPS_DIR / f"{s.name}.yaml"), s
    for path, (start, end, wanted) in generated(sweeps).items():
        assert path.read_text()[start:end] == wanted, f"{path.name} is stale: run python -m src.sweep.catalog --write"
    assert "(480 trials)" in help_text()   # the policies sweep, as the help prints it
