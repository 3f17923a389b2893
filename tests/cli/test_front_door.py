"""The front door (src/door.py): every command says the same mistake in the same words.

For each mistake, every command that can be given it is run on it (the argparse tools in this
process with their work behind a tripwire, the Hydra entry points as commands) and must answer
with exit status 2 and one line `error: ...` whose words after the command's own name are the same
for all of them. Mutations caught: a command composing with Hydra by itself (Hydra's "Could not
find 'draft/nosuch'"), a bench's own words for an unknown sweep, predict's own check of its
integers (each tried: the lines differ).
"""
from __future__ import annotations

import sys

import pytest

from src.door import group_options, sweep_names
from src.paths import REPO
from tests.cli.test_tool_arguments import call, wired  # noqa: F401  (the tools behind their tripwires)
from tests.commands import run_command


def in_process(monkeypatch, capsys, wired, tool, args):  # noqa: F811
    status = call(monkeypatch, wired, tool, args)
    return status, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def as_command(module, args, tmp_path=None):
    """(exit status, stderr lines) of `python -m module *args` (a Hydra entry point's folder in tmp_path)."""
    folder = [f"hydra.run.dir={tmp_path}/run"] if tmp_path is not None else []
    proc = run_command([sys.executable, "-m", module, *args, *folder], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def words(answer) -> str:
    """The one refusal line, less `error: ` and the command's name (argparse tools say theirs first)."""
    status, lines = answer
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), answer
    line = lines[0].removeprefix("error: ")
    return line.split(": ", 1)[1] if line.startswith("python -m ") else line


def test_an_unknown_draft_is_said_alike_by_every_command(monkeypatch, capsys, wired, tmp_path):  # noqa: F811
    said = {
        "run": words(as_command("src.run", ["draft=nosuch"], tmp_path)),
        "sweep": words(as_command("src.run", ["-m", "draft=bigram,nosuch", "k=1,2"], tmp_path)),
        "bench": words(as_command("src.bench.bench", ["draft=nosuch"], tmp_path)),
        "predict": words(as_command("src.predict", ["draft=nosuch"])),   # (its compose is the wire in-process)
        "export": words(in_process(monkeypatch, capsys, wired, "export", [f"{tmp_path}/new", "draft=nosuch"])),
        "retrain": words(in_process(monkeypatch, capsys, wired, "retrain", ["draft=nosuch"])),
        "ceiling": words(in_process(monkeypatch, capsys, wired, "ceiling", ["--drafts", "nosuch"])),
    }
    expected = f"unknown draft 'nosuch' (available: {', '.join(group_options('draft'))})"
    assert said == dict.fromkeys(said, expected)


def test_an_unknown_sweep_is_said_alike_by_every_command(monkeypatch, capsys, wired, tmp_path):  # noqa: F811
    said = {
        "make sweep": words(as_command("src.run", ["--config-dir", "sweeps", "--config-name", "nosuch"], tmp_path)),
        "bench-sweep": words(in_process(monkeypatch, capsys, wired, "sweep", ["--sweep", "nosuch"])),
        "bench-noise": words(in_process(monkeypatch, capsys, wired, "noise", ["--sweep", "nosuch"])),
        "bench-predict": words(in_process(monkeypatch, capsys, wired, "bench-predict", ["--sweep", "nosuch"])),
    }
    expected = f"unknown sweep 'nosuch' (available: {', '.join(sweep_names())})"
    assert said == dict.fromkeys(said, expected)
    assert "smoke" in sweep_names() and "paper" in sweep_names()


def test_an_override_hydra_cannot_parse_is_said_alike_by_every_command(monkeypatch, capsys, wired, tmp_path):  # noqa: F811
    bad = "temperature=[1,2"
    said = {
        "run": words(as_command("src.run", [bad], tmp_path)),
        "bench": words(as_command("src.bench.bench", [bad], tmp_path)),
        "predict": words(as_command("src.predict", [bad])),
        "export": words(in_process(monkeypatch, capsys, wired, "export", [f"{tmp_path}/new", bad])),
        "retrain": words(in_process(monkeypatch, capsys, wired, "retrain", [bad])),
    }
    assert said["run"].startswith(f"bad override '{bad}': "), said
    assert said == dict.fromkeys(said, said["run"])


def test_a_bad_integer_argument_is_said_alike_by_every_tool(monkeypatch, capsys, wired):  # noqa: F811
    said = {tool: words(in_process(monkeypatch, capsys, wired, tool, ["--seqs", "0"]))
            for tool in ("predict", "ceiling")}
    said["drafts"] = words(in_process(monkeypatch, capsys, wired, "drafts", ["--seqs", "0"]))
    assert said == dict.fromkeys(said, "--seqs: an integer >= 1, got 0 (see --help)")


@pytest.mark.parametrize("argv, refused", [
    (["--config-dir", "sweeps", "--config-name", "nosuch"], True),
    (["--config-dir=sweeps", "--config-name=nosuch"], True),
    (["-cd", "sweeps", "-cn", "nosuch"], True),
    (["--config-dir", "sweeps", "--config-name", "smoke"], False),
    (["--config-name", "nosuch"], False),          # conf/'s own configs: Hydra's to find
])
def test_the_sweep_name_is_checked_however_it_is_written(argv, refused):
    from src.door import check_config_name
    from src.engine.errors import SpecsweepError
    if refused:
        with pytest.raises(SpecsweepError, match="unknown sweep 'nosuch'"):
            check_config_name(argv)
    else:
        check_config_name(argv)
