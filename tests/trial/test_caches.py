"""What a process keeps between jobs (src/trial/load.py): the corpus, the target and the
drafts' training ids are loaded once, and a file that changes is read and checked again."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from src.engine.errors import SpecsweepError
from src.sweep.context import PublishedTarget, SweepContext
from src.sweep.targets import PublishedTargets
from src.trial.load import load_corpus_of, load_target, train_ids_of
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg, draft_for


@pytest.fixture
def own_cache(tiny, tmp_path):
    """A copy of the tiny target's cache folder, so that the test may change its files."""
    cfg, _, target = tiny
    cache = tmp_path / "cache"
    shutil.copytree(Path(cfg.data.cache_dir), cache, ignore=shutil.ignore_patterns("*.lock"))
    return compose_cfg(cfg.data.path, cache), cache / "models" / target.path.name


def test_a_process_loads_the_corpus_and_the_target_once(own_cache):
    cfg, _ = own_cache
    corpus, target = load_target(trial_spec(cfg).target, progress=False)
    again_corpus, again = load_target(trial_spec(cfg).target, progress=False)
    assert again_corpus is corpus and again is target
    assert train_ids_of(trial_spec(cfg).target, target, corpus) is train_ids_of(trial_spec(cfg).target, target, corpus)
    assert target.sha256 and len(target.sha256) == 64


def test_a_changed_checkpoint_is_checked_again(own_cache):
    cfg, ckpt = own_cache
    _, target = load_target(trial_spec(cfg).target, progress=False)
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])   # one bit flipped, in place
    os.utime(ckpt, ns=(0, 0))                                           # even with another mtime only
    with pytest.raises(SpecsweepError, match="fails its checksum"):
        load_target(trial_spec(cfg).target, progress=False)
    with pytest.raises(SpecsweepError, match="fails its checksum"):
        run_trial(trial_spec(cfg), progress=False)
    ckpt.write_bytes(data)                                              # the good bytes again: a new load
    _, again = load_target(trial_spec(cfg).target, progress=False)
    assert again is not target and again.sha256 == target.sha256


def test_a_changed_corpus_is_read_again(tiny, tmp_path):
    cfg, corpus, _ = tiny
    path = tmp_path / "corpus.txt"
    shutil.copy(cfg.data.path, path)
    mine = compose_cfg(path, cfg.data.cache_dir)
    first = load_corpus_of(trial_spec(mine).target.data)
    assert load_corpus_of(trial_spec(mine).target.data) is first and first.sha256 == corpus.sha256
    path.write_text(path.read_text() + "more text\n")
    assert load_corpus_of(trial_spec(mine).target.data).sha256 != corpus.sha256


def test_a_worker_reuses_only_the_published_bytes(own_cache, monkeypatch):
    """A sweep's job serves its target from the process's cache only when it holds the bytes the
    parent published; otherwise it goes to the server (here: a fetch that is refused)."""
    cfg, ckpt = own_cache
    _, target = load_target(trial_spec(cfg).target, progress=False)
    ctx = SweepContext("s", "n", "i", "parent", "0", "sqlite:///unused.db", "v", 1, 1, 1, 0.0, "elsewhere:1",
                       (PublishedTarget(target.key, "run", target.sha256),))
    source = PublishedTargets(ctx, client=None)
    _, same = load_target(trial_spec(cfg).target, source)   # no server call: the cache serves it
    assert same is target and not source.fetched

    def no_server(*args):
        raise SpecsweepError("fetched from the server")
    monkeypatch.setattr("src.sweep.targets.fetch_checkpoint", no_server)
    other = SweepContext("s", "n", "i", "parent", "0", "sqlite:///unused.db", "v", 1, 1, 1, 0.0, "elsewhere:1",
                         (PublishedTarget(target.key, "run", "0" * 64),))
    with pytest.raises(SpecsweepError, match="fetched from the server"):
        load_target(trial_spec(cfg).target, PublishedTargets(other, client=None))


@pytest.mark.slow
def test_drafts_built_from_the_cache_count_the_same(tiny, own_cache):
    """A draft fitted to the cached training ids is the draft fitted to freshly encoded ones."""
    cfg, corpus, target = tiny
    for name in ("bigram", "int8"):
        dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}", "timing.pairs=1")
        first = run_trial(trial_spec(dcfg), progress=False, loaded=(corpus, target))
        again = run_trial(trial_spec(dcfg), progress=False)
        for key in ("acceptance", "target_passes", "accepted", "proposed", "analytic_acceptance"):
            assert first.metrics[key] == again.metrics[key], (name, key)
        assert first.text == again.text
    train_text, _ = corpus.split(cfg.train.val_fraction)
    assert train_ids_of(trial_spec(cfg).target, target, corpus).equal(target.tokenizer.encode(train_text))
    assert draft_for(cfg, target, corpus).describe() == draft_for(cfg, target, corpus).describe()
