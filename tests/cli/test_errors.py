"""Bad input: a clear one-line error (SpecsweepError in code; exit status 2 on the CLI)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from src.engine.models.corpus import load_corpus
from src.engine.errors import SpecsweepError
from tests.conftest import compose_cfg

from src.paths import REPO  # noqa: E402
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.commands import run_command


@pytest.mark.parametrize("override,message", [
    ("k=0", "k must be an integer >= 1"),
    ("k=-3", "k must be an integer >= 1"),
    ("k=abc", "k must be an integer >= 1"),
    ("k=2.5", "k must be an integer >= 1"),
    ("k=100", "exceeds the model's context window"),
    ("n_chars=1000", "exceeds the model's context window"),
    ("n_chars=0", "n_chars must be an integer >= 1"),
    ("temperature=-0.5", "temperature must be a number >= 0"),
    ("temperature=hot", "temperature must be a number >= 0"),
    ("timing.pairs=0", "timing.pairs must be an integer >= 1"),
    ("exactness.samples=0", "exactness.samples must be an integer >= 1"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, override, message):
    cfg = compose_cfg(tmp_path / "missing.txt", tmp_path, override)
    with pytest.raises(SpecsweepError, match=message):
        trial_spec(cfg)


def test_bad_corpora(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 10)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 100)
    for name, message in [("empty.txt", "is empty"), ("binary.bin", "not a text file"),
                          ("latin1.txt", "not UTF-8"), ("nosuch.txt", "not found")]:
        with pytest.raises(SpecsweepError, match=message):
            load_corpus(str(tmp_path / name), tmp_path, "shakespeare")


def test_corpus_too_small_for_the_window(tmp_path):
    (tmp_path / "short.txt").write_text("to be or not to be " * 10)
    cfg = compose_cfg(tmp_path / "short.txt", tmp_path, "prompt='to be '")
    with pytest.raises(SpecsweepError, match="is too small"):
        run_trial(trial_spec(cfg), progress=False)


def _cli(*args, cwd=REPO):
    return run_command([sys.executable, "-m", "src.run", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _assert_one_line_error(proc, message):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], out


def test_cli_unknown_draft(tmp_path):
    proc = _cli("draft=nosuch", f"hydra.run.dir={tmp_path}")
    shipped = ", ".join(sorted(p.stem for p in (REPO / "conf" / "draft").glob("*.yaml")))
    _assert_one_line_error(proc, f"unknown draft 'nosuch' (available: {shipped})")
    assert proc.stdout == ""


@pytest.mark.slow
def test_cli_bad_value_and_bad_corpus(tmp_path):
    _assert_one_line_error(_cli("k=0", f"hydra.run.dir={tmp_path}"), "k must be an integer >= 1")
    _assert_one_line_error(_cli("draft=heads", "k=9", f"hydra.run.dir={tmp_path}"), "k = 9 exceeds the 8 heads")
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\x00\x01" * 1000)
    _assert_one_line_error(_cli(f"data.path={binary}", f"hydra.run.dir={tmp_path}"), "not a text file")


@pytest.mark.slow
def test_corrupt_checkpoint_is_refused(tiny, tmp_path):
    cfg, _, target = tiny
    cache = tmp_path / "cache"
    shutil.copytree(Path(cfg.data.cache_dir), cache, ignore=shutil.ignore_patterns("*.lock"))
    ckpt = cache / "models" / target.path.name
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])                      # truncated
    with pytest.raises(SpecsweepError, match="fails its checksum"):
        run_trial(trial_spec(compose_cfg(cfg.data.path, cache)), progress=False)
    ckpt.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])  # one bit flipped
    store = tmp_path / "store" / "mlflow.db"
    common = ("model=tiny", "train=quick", f"data.path={cfg.data.path}", f"data.cache_dir={cache}",
              f"prompt='{cfg.prompt}'", "n_chars=64", f"tracking.uri=sqlite:///{store}")
    _assert_one_line_error(_cli(*common, f"hydra.run.dir={tmp_path}/run"), "fails its checksum")
    # a sweep refuses it in its checks, before its store is written (not when it loads the target)
    proc = _cli("-m", *common, "k=1,2", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path}/sweep")
    _assert_one_line_error(proc, "fails its checksum")
    assert not store.parent.exists(), sorted(p.name for p in store.parent.iterdir())


def test_an_error_line_after_a_progress_bar_starts_a_line_of_its_own(capsys):
    """A stop or refusal while a progress bar is drawn (training the target, say): the bar ends no
    line, so the error line starts with a line break and stays a line that starts with `error: `;
    with no bar, no blank line. Mutation caught: the line break left out."""
    import sys
    from tqdm import tqdm
    from src.engine.errors import error_line
    bar = tqdm(total=10, desc="training target", file=sys.stderr)
    bar.update(3)
    error_line("stopped: interrupted (SIGINT)")
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert "error: stopped: interrupted (SIGINT)" in lines, lines
    error_line("plain")
    assert capsys.readouterr().err == "error: plain\n"
