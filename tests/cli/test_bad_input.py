"""Every bad input is refused before any work: exit status 2, one line on stderr (`error: ...`),
no store file, no run, no trained target, and (python -m src.run) no Hydra output folder; for a
single run and a multirun alike.

Each case runs the real command line on the tiny model and a synthetic corpus, its store and
its cache in folders of its own. The negative control is a draft whose check runs only when it
is built, after the target has trained (a module of the test's own, on PYTHONPATH): the same
assertions must catch it.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from src.engine.models.corpus import synthetic_text
from src.paths import REPO
from tests.commands import run_command

pytestmark = pytest.mark.slow

LATE_DRAFT = '''
from src.engine.drafts import BigramDraft
from src.engine.errors import SpecsweepError

class LateDraft(BigramDraft):
    """A draft that checks its option only when built: after the target has trained."""
    def __init__(self, *args, **kwargs):
        raise SpecsweepError("late: this draft refuses itself when built")
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Corpora of every kind a case needs, and a module with the late-checking draft."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "good.txt").write_text(synthetic_text(20_000))
    (root / "one_char.txt").write_text("a" * 20_000)
    (root / "short.txt").write_text("the cat sat. " * 10)
    (root / "binary.bin").write_bytes(bytes(range(256)) * 100)
    (root / "not_a_db.db").write_text("hello")
    workloads = {"empty.jsonl": "\n\n", "bad.jsonl": '{"prompt": "the cat "}\n{"prompt": "the dog\n',
                 "noprompt.jsonl": '{"question_id": 1, "category": "a"}\n', "outside.jsonl": '{"prompt": "XYZ"}\n',
                 "long.jsonl": '{"prompt": "the cat "}\n{"prompt": "' + "the cat " * 20 + '", "category": "b"}\n',
                 "ragged.jsonl": '{"prompt": "the cat "}\n{"prompt": "the dog sat "}\n'}
    for name, text in workloads.items():
        (root / name).write_text(text)
    os.mkfifo(root / "fifo")
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "late_draft.py").write_text(LATE_DRAFT)
    return root


def run_cli(world: Path, case: Path, multirun: bool, *args: str, module: str = "src.run") -> subprocess.CompletedProcess:
    base = ["model=tiny", "train=quick", f"data.path={world / 'good.txt'}", f"data.cache_dir={case / 'cache'}",
            "prompt='the cat '", "n_chars=32", "timing.pairs=1", "timing.target_width=null",
            f"tracking.uri=sqlite:///{case / 'store' / 'mlflow.db'}", f"hydra.run.dir={case / 'run'}",
            f"hydra.sweep.dir={case / 'sweep'}"]
    if multirun and not any(a.startswith("hydra/launcher=") for a in args):
        base.append("hydra.launcher.n_jobs=1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(world / "plugins")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [sys.executable, "-m", module, *(["-m"] if multirun else []), *base, *args]
    return run_command(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def refused_before_work(proc, case: Path, message: str, store_before: bytes | None = None) -> list[str]:
    """What is wrong with the way `proc` refused its input ([] when it was refused properly)."""
    problems = []
    errors = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("training target")]
    if proc.returncode != 2:
        problems.append(f"exit status {proc.returncode}, not 2")
    if len(errors) != 1 or not errors[0].startswith("error: ") or message not in errors[0]:
        problems.append(f"stderr is not the one line 'error: ...{message}...': {errors[-5:]}")
    if "Traceback" in proc.stdout + proc.stderr:
        problems.append("a traceback")
    store = case / "store" / "mlflow.db"
    if store_before is None and store.exists():
        problems.append("a store file was written")
    if store_before is not None and store.read_bytes() != store_before:
        problems.append("the store file changed")
    trained = list((case / "cache").glob("models/*.pt"))
    if trained:
        problems.append(f"a target was trained: {trained[0].name}")
    made = [p.name for p in (case / "run", case / "sweep") if p.exists()]
    if made and " src.run " in f" {' '.join(proc.args)} ":
        problems.append(f"Hydra's output folder was made: {made}")   # a refused `python -m src.run` leaves none
    return problems


CASES = [  # (id, multirun, args, message)
    ("unknown draft", False, ["draft=nosuch"], "unknown draft 'nosuch'"),
    ("k=0", False, ["k=0"], "k must be an integer >= 1"),
    ("unknown key", False, ["nosuch=1"], "Could not override 'nosuch'"),
    ("malformed list", False, ["k=[1,2"], "bad override 'k=[1,2'"),
    ("bad draft option", False, ["draft=bigram", "draft.alpha=0"], "alpha must be > 0"),
    ("unknown draft option", False, ["draft=bigram", "+draft.beta=1"], "takes no option beta"),
    ("relative sqlite", False, ["tracking.uri=sqlite:///relative/mlflow.db"], "needs an absolute path"),
    ("sqlite in memory", False, ["tracking.uri=sqlite://"], "needs an absolute path"),
    ("unknown scheme", False, ["tracking.uri=ftp://host/store"], "unknown scheme 'ftp'"),
    ("file store", False, ["tracking.uri=file:///tmp/a-file-store"], "is a file store"),
    ("store where no file can be made", False, ["tracking.uri=sqlite:////proc/specsweep-test/mlflow.db"],
     "cannot create the tracking store"),
    ("store on a device", False, ["tracking.uri=sqlite:////dev/null"], "is not a regular file"),
    ("server nobody answers", False, ["tracking.uri=http://127.0.0.1:9"], "is not reachable"),
    ("missing corpus", False, ["data.path=/nonexistent/corpus.txt"], "corpus file not found"),
    ("corpus is a folder", False, ["data.path={world}"], "is a folder: give a text file"),
    ("corpus is a device", False, ["data.path=/dev/zero"], "is not a regular file"),
    ("corpus is a FIFO", False, ["data.path={world}/fifo"], "is not a regular file"),
    ("binary corpus", False, ["data.path={world}/binary.bin"], "not a text file"),
    ("one repeated char", False, ["data.path={world}/one_char.txt", "prompt=aaa"], "1 distinct char"),
    ("prompt outside the corpus", False, ["prompt=XYZ"], "the prompt has chars 'XYZ'"),
    ("too many distinct chars", False, ["data.max_vocab=10"], "more than data.max_vocab = 10"),
    ("corpus shorter than a window", False, ["data.path={world}/short.txt", "prompt=the"], "is too small"),
    ("lock folder is a file", False, ["timing.lock_dir={world}/good.txt"], "cannot create the timing lock"),
    ("transformers: a draft without a counterpart", False, ["engine=transformers", "draft=bigram"],
     "no counterpart in transformers' generate"),
    ("transformers: int8 kernels", False, ["engine=transformers", "draft=int8_kernels"],
     "no counterpart in transformers' generate"),
    ("transformers: a tree", False, ["engine=transformers", "draft=int8", "verify=tree", "verify.widths=[2,1]", "k=2"],
     "verifies chains only"),
    ("transformers: a batch", False, ["engine=transformers", "draft=int8", "batch=4"], "engine=transformers runs one sequence"),
    ("transformers: the cost policy", False, ["engine=transformers", "draft=int8", "policy=cost"],
     "policy=cost has no counterpart"),
    ("transformers: prompt lookup with a schedule", False, ["engine=transformers", "draft=prompt_lookup", "policy=heuristic"],
     "prompt lookup drafts up to k tokens"),
    ("prompt lookup on the tool's engine", False, ["draft=prompt_lookup"], "runs in transformers' loop only"),
    ("prompt lookup's n-gram size", False, ["engine=transformers", "draft=prompt_lookup",
                                            "draft.max_matching_ngram_size=0"], "max_matching_ngram_size must be"),
    ("max_pairs below pairs", False, ["timing.pairs=8", "timing.max_pairs=4"],
     "timing.max_pairs (4) is below timing.pairs (8)"),
    ("database server nobody answers", False, ["tracking.uri=postgresql+psycopg2://u@127.0.0.1:9/mlflow"],
     "database server 127.0.0.1:9 is not reachable"),
    ("a tree larger than the memory", False, ["verify=tree", "verify.widths=[1000,1000,1000]", "k=3"],
     "(1,001,001,000 nodes a pass) needs at least"),
    ("a batch larger than the memory", False, ["draft=bigram", "batch=100000000"], "batch=100000000 needs at least"),
    ("untracked run: a batch larger than the memory", False,
     ["tracking.enabled=false", "draft=bigram", "batch=100000000"], "batch=100000000 needs at least"),
    ("empty tracking uri", False, ["tracking.uri="], "tracking.uri is empty"),
    ("engine option of the wrong type", False, ["engine=compiled", "engine.options.cpp_wrapper=maybe"],
     "engine.options.cpp_wrapper must be a bool"),
    pytest.param("cuda without CUDA", False, ["device=cuda"], "sees no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    ("unknown workload", False, ["workload=nosuch"], "unknown workload 'nosuch'"),
    ("workload: no file named", False, ["workload=file"], "workload=file needs workload.path=FILE"),
    ("workload: missing file", False, ["workload=file", "workload.path=/nonexistent/p.jsonl"], "no such file"),
    ("workload: a folder", False, ["workload=file", "workload.path={world}"], "is not a regular file"),
    ("workload: empty file", False, ["workload=file", "workload.path={world}/empty.jsonl"], "holds no prompts"),
    ("workload: a line that is not JSON", False, ["workload=file", "workload.path={world}/bad.jsonl"],
     "line 2 of bad.jsonl is not JSON"),
    ("workload: a line without a prompt", False, ["workload=file", "workload.path={world}/noprompt.jsonl"],
     'line 1 of noprompt.jsonl has neither "prompt" nor "turns"'),
    ("workload: a prompt outside the corpus", False, ["workload=file", "workload.path={world}/outside.jsonl"],
     "line 1 of outside.jsonl: its prompt has chars 'XYZ'"),
    ("workload: a prompt longer than the context", False, ["workload=file", "workload.path={world}/long.jsonl"],
     "the longest prompt (line 2 of long.jsonl) (160 chars) + n_chars (32) + k (4) = 196 chars exceeds"),
    ("workload: built-in windows past the context", False, ["workload=validation"],
     "workload=validation: prompt_chars (96) + n_chars (80) + k (4) = 180 chars exceeds the model's context window"),
    ("workload: a batch of prompts of two lengths", False, ["workload=file", "workload.path={world}/ragged.jsonl",
                                                            "draft=bigram", "batch=2"], "have different lengths"),
    ("workload: a validation split without room for a window", False,
     ["workload=validation", "workload.prompt_chars=20", "workload.n_chars=20", "data.path={world}/short.txt",
      "prompt=the", "model.block_size=64"], "the validation split (13 chars) is shorter than one workload window"),
    ("sweep: a cell twice", True, ["k=1,1"], "are the same cell (k=1)"),
    ("sweep: n_jobs=0", True, ["k=1,2", "hydra.launcher.n_jobs=0"], "hydra.launcher.n_jobs must be"),
    ("sweep: one bad k", True, ["k=1,0"], "trial #1 (k=0): k must be an integer >= 1"),
    ("sweep: bad draft option", True, ["draft=int8_kernels", "draft.calibration_windows=0", "k=1,2"],
     "calibration_windows must be >= 1"),
    ("sweep: relative sqlite", True, ["k=1,2", "tracking.uri=sqlite:///relative/mlflow.db"], "needs an absolute path"),
    ("sweep: store where no file can be made", True, ["k=1,2", "tracking.uri=sqlite:////proc/specsweep-test/m.db"],
     "cannot create the tracking store"),
    ("sweep: prompt outside the corpus", True, ["k=1,2", "prompt=XYZ"], "the prompt has chars 'XYZ'"),
    ("sweep: missing corpus", True, ["k=1,2", "data.path=/nonexistent/corpus.txt"], "corpus file not found"),
    ("sweep: tracking off", True, ["k=1,2", "tracking.enabled=false"], "tracking.enabled must be true"),
    ("sweep: cluster launcher, host-local store", True, ["k=1,2", "hydra/launcher=submitit_slurm"],
     "cannot reach the host-local store"),
    ("sweep: malformed sweep", True, ["k=1,2", "seed=range("], "bad override 'seed=range('"),
    ("sweep: one workload's prompt outside the corpus", True,
     ["k=1,2", "workload=file", "workload.path={world}/outside.jsonl"], "its prompt has chars 'XYZ'"),
]


@pytest.mark.parametrize("name,multirun,args,message", CASES,
                         ids=[c.values[0] if hasattr(c, "marks") else c[0] for c in CASES])
def test_bad_input_is_refused_before_any_work(world, tmp_path, name, multirun, args, message):
    proc = run_cli(world, tmp_path, multirun, *(a.format(world=world) for a in args))
    assert refused_before_work(proc, tmp_path, message) == [], proc.stdout[-2000:] + proc.stderr[-2000:]


BENCH_CASES = [  # `make bench ARGS=...`: the same config, refused before the corpus, training or a cache
    ("unknown bench", ["+bench=nosuch"], "unknown bench 'nosuch'"),
    ("unknown key", ["nosuchkey=1"], "Could not override 'nosuchkey'"),
    ("library bench without an assistant", ["+bench=library", "draft=bigram"], "compares the loops on a model draft"),
    ("corpus is a device", ["+bench=overhead", "data.path=/dev/zero"], "is not a regular file"),
]


@pytest.mark.parametrize("name,args,message", BENCH_CASES, ids=[c[0] for c in BENCH_CASES])
def test_the_benchmarks_refuse_bad_input_before_any_work(world, tmp_path, name, args, message):
    proc = run_cli(world, tmp_path, False, *args, module="src.bench.bench")
    assert refused_before_work(proc, tmp_path, message) == [], proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_store_that_is_not_a_database_is_refused_and_left_as_it_was(world, tmp_path):
    (tmp_path / "store").mkdir()
    store = tmp_path / "store" / "mlflow.db"
    store.write_text("hello")
    for multirun, extra in ((False, []), (True, ["k=1,2"])):
        proc = run_cli(world, tmp_path, multirun, *extra)
        assert refused_before_work(proc, tmp_path, "is not an SQLite database", store_before=b"hello") == []


def test_another_applications_database_is_refused_and_left_as_it_was(world, tmp_path):
    import sqlite3
    (tmp_path / "store").mkdir()
    store = tmp_path / "store" / "mlflow.db"
    con = sqlite3.connect(store)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('Ada')")
    con.commit()
    con.close()
    before = store.read_bytes()
    for multirun, extra in ((False, []), (True, ["k=1,2"])):
        proc = run_cli(world, tmp_path, multirun, *extra)
        assert refused_before_work(proc, tmp_path, "another application's database", store_before=before) == []
        assert sorted(p.name for p in store.parent.iterdir()) == ["mlflow.db"]   # no artifacts folder beside it


def test_the_negative_control_a_check_after_training_is_caught(world, tmp_path):
    """A draft whose check runs only when it is built (after the target trains) fails the test."""
    proc = run_cli(world, tmp_path, False, "draft=bigram", "draft._target_=late_draft.LateDraft",
                   "train.steps=10", "train.eval_interval=10")   # any trained target will do: seconds
    problems = refused_before_work(proc, tmp_path, "late: this draft refuses itself")
    assert any(p.startswith("a target was trained") for p in problems), (problems, proc.stderr[-2000:])
