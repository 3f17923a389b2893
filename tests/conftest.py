"""Shared fixtures: a small synthetic corpus and a tiny target trained on it in seconds."""
from __future__ import annotations

from pathlib import Path

import json
import os
import shutil
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from src.engine.atomic import write_text
from src.engine.models.corpus import synthetic_text
from src.engine.drafts import BigramDraft
from src.trial.load import build_draft, load_target
from src.trial.spec import trial_spec
from tests.commands import run_command

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
# training in the tests (the tiny target, drafts; in this process and the commands it runs) on one
# thread: each pytest-xdist worker trains on a core of its own (src/engine/models/train.py: all_cores)
os.environ.setdefault("SPECSWEEP_TRAIN_THREADS", "1")
PROMPT = "the cat "


def compose_cfg(corpus_path, cache_dir, *overrides: str):
    # one pair and fixed cost rounds: the adaptive ones (pairs added until the interval is narrow,
    # up to 24 pairs or 30 s a trial) are tested in tests/engine/measuring/test_timing.py and
    # tests/trial/test_trial_timing.py, which ask for them
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("config", overrides=[
            "model=tiny", "train=quick", f"data.path={corpus_path}", f"data.cache_dir={cache_dir}",
            f"prompt='{PROMPT}'", "n_chars=64", "timing.pairs=1", "timing.target_width=null", "timing.cost_reps=2",
            "timing.cost_width=null", *overrides])


@pytest.fixture(scope="session", autouse=True)
def isolated_tracking_store(tmp_path_factory):
    """No test writes into the repository's own mlruns/: the default store becomes a temporary
    one (subprocesses inherit it). Tests that name tracking.uri still use their own."""
    store = tmp_path_factory.mktemp("default_store")
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{store}/mlflow.db"
    yield
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


def session_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this test session that every pytest-xdist worker shares (<session>/NAME; the
    session's own temp folder without workers): what one worker builds there, the others reuse."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base   # xdist: <session>/popen-gwN
    folder = shared / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def corpus_path(tmp_path_factory) -> Path:
    """The synthetic corpus, one file for all workers (written atomically: no worker reads it half-written;
    two that both write it write the same text)."""
    path = session_folder(tmp_path_factory, "corpus") / "tiny.txt"
    if not path.exists():
        write_text(path, synthetic_text(60_000))
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The session's model and draft cache, shared by the workers: the tiny target trains once (the
    trainer's file lock makes the others wait and load it), and so does each trained draft."""
    return session_folder(tmp_path_factory, "cache")


@pytest.fixture(scope="session")
def tiny(corpus_path, cache_dir):
    """(cfg, corpus, TrainedTarget): trained once per test session (a few seconds)."""
    cfg = compose_cfg(corpus_path, cache_dir)
    corpus, target = load_target(trial_spec(cfg).target, progress=False)
    return cfg, corpus, target


# drafts that train: seconds of training on the tiny model (their defaults size the default target).
# small_model: its draft model is the tiny model with one layer instead of two (the tiny model itself
# would be the target drafting for itself, which is refused), trained like the tiny target (train=quick)
DRAFT_TEST_OVERRIDES = {"heads": ["draft.steps=150", "draft.rows=256", "draft.pool_windows=64"],
                        "small_model": ["model@draft.model=tiny", "draft.model.n_layer=1"]}


@pytest.fixture(scope="session")
def folder_draft_model(tiny, tmp_path_factory) -> Path:
    """A draft model from a folder for the tiny target (draft=hf_model): a 1-layer GPT-2 with random
    weights, the tiny target's vocabulary and context window, and its char tokenizer."""
    from src.engine.huggingface.checkpoint import char_tokenizer, offline_transformers
    _, _, target = tiny
    t = offline_transformers()
    folder = tmp_path_factory.mktemp("folder_draft")
    torch.manual_seed(0)
    config = t.GPT2Config(vocab_size=target.tokenizer.vocab_size, n_positions=target.model.cfg.block_size, n_embd=32,
                          n_layer=1, n_head=2, initializer_range=0.2, bos_token_id=None, eos_token_id=None)
    t.GPT2LMHeadModel(config).save_pretrained(folder)
    char_tokenizer(target.tokenizer.chars).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def drafts(tiny, folder_draft_model):
    """name -> draft, for every draft config shipped in conf/draft/ that runs in the tool's loop (a draft of
    transformers' loop only, prompt_lookup, is tested in tests/engine/huggingface/test_library_loop.py); hf_model's
    model is `folder_draft_model`."""
    cfg, corpus, target = tiny
    out = {}
    overrides = {**DRAFT_TEST_OVERRIDES, "hf_model": [f"draft.model.path={folder_draft_model}"]}
    for name in sorted(p.stem for p in (Path(CONF_DIR) / "draft").glob("*.yaml") if not library_only(p.stem)):
        dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}", *overrides.get(name, []))
        out[name] = draft_for(dcfg, target, corpus)
    return out


def library_only(name: str) -> bool:
    """conf/draft/NAME.yaml is a draft of transformers' loop only (prompt_lookup)."""
    from omegaconf import OmegaConf
    from src.trial.capabilities import draft_class
    target = OmegaConf.load(Path(CONF_DIR) / "draft" / f"{name}.yaml")["_target_"]
    return getattr(draft_class(target), "library_only", False)


def draft_for(cfg, target, corpus, source=None):
    """The draft of a composed config, fitted to `target`: the trial's own `build_draft`."""
    spec = trial_spec(cfg)
    return build_draft(spec.draft, spec.target, target, corpus, source)


def draft_options(name: str, **overrides) -> dict:
    """conf/draft/NAME.yaml's options for the draft class (the one source of its defaults)."""
    from omegaconf import OmegaConf
    node = OmegaConf.load(Path(CONF_DIR) / "draft" / f"{name}.yaml")
    out = {k: v for k, v in OmegaConf.to_container(node).items() if k not in ("_target_", "name", "defaults", "model")}
    return {**out, **overrides}


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


REPO = Path(__file__).resolve().parent.parent

# `make test` runs the tests on several workers (pytest-xdist, --dist loadgroup). The files that
# start Ray clusters run on one worker, one test after another, so no two clusters run at once
# (`pytest_xdist_make_scheduler` below); `smoke_stores` runs its sweeps once for all workers.
ONE_WORKER_FILES = ("tools/test_cluster.py", "tools/test_servers.py")   # under tests/
ONE_FIXTURE_FILES = ("sweep/test_full_disk.py",)   # one module fixture does the work: run it once, on one worker


def work_unit(nodeid: str) -> str:
    """The unit of work a test is scheduled in: "one_worker" for the tests of ONE_WORKER_FILES, the
    file for those of ONE_FIXTURE_FILES (its module fixture then runs once), else the test itself."""
    path = nodeid.split("::")[0]
    if path.endswith(ONE_WORKER_FILES):
        return "one_worker"
    return path if path.endswith(ONE_FIXTURE_FILES) else nodeid


class OneWorkerScheduling:
    """The scheduler hook, registered only where pytest-xdist is loaded (pytest_configure below):
    a hook of a plugin that is not loaded is an unknown hook, which pytest refuses at start-up
    (`pytest -p no:xdist` would stop with an internal error)."""

    @staticmethod
    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """--dist loadgroup, with the groups given by file. xdist 3.8 groups marked tests by renaming
        their node ids, which pytest 9 no longer lets it do: every `xdist_group` test was scheduled
        alone, and two Ray clusters ran at once. Here the scheduler itself groups them; it sends the
        largest unit (the cluster tests) first, so the long group does not run last, alone."""
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class OneWorkerFiles(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return work_unit(nodeid)
        return OneWorkerFiles(config, log)


COUNTERS = ["acceptance", "position_acceptance", "analytic_acceptance", "chars_per_pass", "target_passes",
            "proposed", "accepted", "acceptance_pos_1"]


def smoke_cmd(store: Path, n_jobs: int, *extra: str) -> list[str]:
    """The smoke sweep into a store folder of its own (store, sweep folder, model cache)."""
    return [sys.executable, "-m", "src.run", "--config-dir", "sweeps", "--config-name", "smoke",
            f"tracking.uri=sqlite:///{store}/mlflow.db", f"hydra.sweep.dir={store}/sweep",
            f"hydra.launcher.n_jobs={n_jobs}", f"data.cache_dir={store.parent}/cache", *extra]


# Timing settings under which a model draft's trial (int8, int4) stays RUNNING about a second here (a
# bigram's half that): long enough for a test polling the store to catch it mid-run, so the kill tests
# pick a model draft's trial. A rerun of the cell uses them too (they are part of the cell).
LASTING_TRIAL = ("timing.pairs=15", "timing.max_pairs=15")
MODEL_DRAFTS = ("int8", "int4")

# The fault tests' sweep: two of the smoke sweep's six cells (a table and a model draft), enough for
# a kill, a race and a resume, at a third of the trials
FAULT_DRAFTS, FAULT_K = ("bigram", "int8"), "4"
FAULT_GRID = (f"draft={','.join(FAULT_DRAFTS)}", f"k={FAULT_K}")
FAULT_CELLS = {(d, FAULT_K) for d in FAULT_DRAFTS}


def runs_of(uri: str):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("specsweep")
    return client, (client.search_runs([exp.experiment_id], max_results=1000) if exp else [])


def trial_counters(uri: str, cells: set | None = None) -> dict:
    """(draft, k) -> the deterministic counters of its FINISHED trial (only `cells`, when given)."""
    _, runs = runs_of(uri)
    out = {(r.data.params["draft"], r.data.params["k"]): {c: r.data.metrics[c] for c in COUNTERS}
           for r in runs if r.data.tags.get("specsweep.kind") == "trial" and r.info.status == "FINISHED"}
    return out if cells is None else {cell: c for cell, c in out.items() if cell in cells}


@pytest.fixture(scope="session")
def smoke_stores(tmp_path_factory):
    """The smoke sweep run twice, with n_jobs=2 and n_jobs=1, each into a fresh store:
    n_jobs -> (tracking uri, output). Once per test session: under pytest-xdist the first worker
    to ask runs them, in the session's shared temp folder, and the others wait and read them."""
    from filelock import FileLock
    shared = session_folder(tmp_path_factory, "smoke")
    root, done = shared / "stores", shared / "stores.json"
    with FileLock(str(shared / "stores.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)   # a failed attempt's stores: start again
            out = {}
            for n_jobs in (2, 1):
                store = root / f"smoke{n_jobs}" / "store"
                store.mkdir(parents=True)
                proc = run_command(smoke_cmd(store, n_jobs), cwd=REPO, capture_output=True, text=True, timeout=600)
                assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
                out[n_jobs] = (f"sqlite:///{store}/mlflow.db", proc.stdout + proc.stderr)
            done.write_text(json.dumps(out))
    return {int(n): tuple(v) for n, v in json.loads(done.read_text()).items()}


CLUSTER_MODULES = ("ray", "psycopg2", "psycopg", "hydra_plugins.hydra_ray_launcher", "hydra_plugins.hydra_submitit_launcher")


def cluster_extra_missing() -> list[str]:
    import importlib.util
    missing = []
    for name in CLUSTER_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


def pytest_terminal_summary(terminalreporter):
    """One line when the cluster tests (tests/tools/test_cluster.py, tests/tools/test_servers.py) did not run."""
    missing = cluster_extra_missing()
    if missing:
        terminalreporter.write_line(f"cluster tests skipped: the cluster extra is not installed "
                                    f"(no {', '.join(missing)}); install it with `make setup-cluster`")


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(OneWorkerScheduling(), "one_worker_scheduling")
    config.addinivalue_line("markers", "slow: a test of more than a few seconds (real sweeps and commands, servers, "
                                       "long sampling, the law tests' negative controls); `make test-fast` skips "
                                       "them, `make test` runs them")
    # One torch thread for the tests' own tensor work (tiny models gain nothing from two): with
    # two, every small op waits on a second thread, and on a busy 2-core machine those waits made
    # single tests 20-40x slower. Training and trials set their own thread counts.
    torch.set_num_threads(1)
    # the launcher configs merge onto the plugins' schemas on purpose (see src/sweep/__init__.py)
    config.addinivalue_line("filterwarnings",
                            "ignore:(?s).*is validated against ConfigStore schema with the same name:UserWarning")


class ZeroedBigram(BigramDraft):
    """A draft with q = 0 on several chars the target gives mass to."""
    def __init__(self, target, train_ids, zero_ids):
        super().__init__(target, train_ids, name="zeroed", **draft_options("bigram"))
        self.log_q[:, zero_ids] = float("-inf")
        self.log_q = torch.log_softmax(self.log_q, -1)


@pytest.fixture(scope="session")
def two_category_prompts(tiny, tmp_path_factory) -> list[torch.Tensor]:
    """The prompts of a two-category workload (workload=file, read and drawn as a trial reads them),
    encoded: the config's prompt (category `short`) and a 40-char window of the validation split
    (category `window`). The exactness tests run over it."""
    import json
    from src.trial.trial import trial_prompts
    cfg, corpus, target = tiny
    window = corpus.split(0.1)[1][100:140]
    path = tmp_path_factory.mktemp("workload") / "two.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in (
        {"prompt": cfg.prompt, "category": "short"}, {"prompt": window, "category": "window"})))
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "workload=file", f"workload.path={path}"))
    prompts = trial_prompts(spec, corpus)
    assert [p.category for p in prompts] == ["short", "window"]
    return [target.tokenizer.encode(p.text) for p in prompts]


@pytest.fixture
def zeroed(tiny):
    """(draft, zero_ids, prompt): a bigram with q = 0 on "aeot", all chars the target gives mass to."""
    cfg, corpus, target = tiny
    tok = target.tokenizer
    zero_ids = tok.encode("aeot").tolist()
    return ZeroedBigram(target.model, tok.encode(corpus.split(0.1)[0]), zero_ids), zero_ids, tok.encode(cfg.prompt)
