"""The small-model draft (conf/draft/small_model.yaml): another trained target drafting for this one.

Its model is a target of its own (`draft.model`), trained on the same corpus and tokenizer through
the same code and cache; here the tiny target's config with one layer instead of two (train=quick,
seconds). Exactness and greedy equality are in tests/test_exactness.py and tests/test_decode.py,
which build it from its file like every draft (tests/conftest.py: DRAFT_TEST_OVERRIDES).
"""
from __future__ import annotations

import dataclasses

import pytest

from src.engine.errors import SpecsweepError
from src.engine.tokenizer import CharTokenizer
from src.engine.train import file_sha256
from src.harness.context import PublishedTarget, SweepContext
from src.harness.plan import PlannedJob, prepare_targets
from src.harness.trial import build_draft, draft_target_cfg, load_draft_target, load_target, validate
from tests.conftest import DRAFT_TEST_OVERRIDES, compose_cfg
from tests.test_errors import _assert_one_line_error, _cli

SMALL = ["draft=small_model", *DRAFT_TEST_OVERRIDES["small_model"]]


def test_draft_model_is_a_target_of_the_same_corpus_and_training(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL)
    small = load_draft_target(dcfg, target, corpus, progress=False)
    # the same cache as any target: the key of (corpus, draft.model, train, train_seed)
    _, again = load_target(draft_target_cfg(dcfg), progress=False)
    assert small.key == again.key != target.key and small.path.parent == target.path.parent
    assert small.model.cfg.n_layer == 1 and target.model.cfg.n_layer == 2
    assert small.tokenizer.chars == target.tokenizer.chars
    draft = build_draft(dcfg, target, corpus)
    assert draft.name == "small_model" and draft.describe() == {"params": small.model.n_params()}


def test_a_trial_records_which_draft_model_drafted(tiny):
    from src.harness.trial import run_trial
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, "k=4", "timing.target_width=null",
                       "timing.lock=false")
    small = load_draft_target(dcfg, target, corpus, progress=False)
    result = run_trial(dcfg, progress=False, loaded=(corpus, target))
    assert result.info["draft_model_key"] == small.key and result.info["target_key"] == target.key
    m = result.metrics
    assert m["proposed"] == 4 * m["target_passes"] and 0 < m["accepted"] <= m["proposed"]
    # another model than the target: the exact per-position acceptance sum_x min(p, q) is < 1
    # (the realized count may still be all accepts: ~3% of seeds at this acceptance)
    assert 0.5 < m["analytic_acceptance"] < 0.999


def test_the_target_drafting_for_itself_is_refused(tiny):
    cfg, corpus, target = tiny
    own = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=small_model", "model@draft.model=tiny")
    with pytest.raises(SpecsweepError, match="drafting for itself"):
        validate(own)
    with pytest.raises(SpecsweepError, match="is the target .* itself"):   # also without validate
        build_draft(own, target, corpus)


def test_draft_model_context_window_is_checked(tiny):
    cfg, _, _ = tiny
    short = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, "draft.model.block_size=32")
    with pytest.raises(SpecsweepError, match="context window \\(32\\)"):
        validate(short)


def test_another_vocabulary_is_refused(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL)
    # a target over one char fewer (as if trained on another corpus)
    other = dataclasses.replace(target, tokenizer=CharTokenizer(target.tokenizer.chars[:-1]), key="0" * 16)
    with pytest.raises(SpecsweepError, match="another vocabulary"):
        load_draft_target(dcfg, other, corpus, progress=False)


def test_sweep_parent_trains_and_publishes_the_draft_model_once(tiny):
    cfg, corpus, target = tiny
    cfgs = [compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, f"k={k}") for k in (1, 4)]
    cfgs.append(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"))
    jobs = [PlannedJob(i, [], c, str(i)) for i, c in enumerate(cfgs)]
    published = prepare_targets(jobs, lambda t, c: t.key)
    small = load_draft_target(cfgs[0], target, corpus, progress=False)
    assert published == [target.key, small.key]          # each once, the draft's model after its target
    assert [j.target_key for j in jobs] == [target.key] * 3


def _with_context(cfg, tmp_path, targets):
    ctx = SweepContext("s", "t", "inv", "parent", "0", f"sqlite:///{tmp_path}/mlflow.db", "v", 1, 1, 1, 0.0,
                       tuple(targets))
    return compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, ctx.override())


def test_sweep_worker_takes_the_published_draft_model_and_never_trains_it(tiny, tmp_path):
    cfg, corpus, target = tiny
    small = load_draft_target(compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL), target, corpus, progress=False)
    mine = PublishedTarget(target.key, "r0", target.sha256)
    # the parent published only the trial's target: the worker refuses (one line) instead of training
    with pytest.raises(SpecsweepError, match="the sweep's parent published"):
        load_draft_target(_with_context(cfg, tmp_path, [mine]), target, corpus)
    # published: the worker loads those bytes (its local copy has them, so nothing is fetched)
    sha = file_sha256(small.path)
    got = load_draft_target(_with_context(cfg, tmp_path, [mine, PublishedTarget(small.key, "r1", sha)]), target,
                            corpus)
    assert got.key == small.key and got.sha256 == sha


def test_cli_refuses_the_default_target_drafting_for_itself(tmp_path):
    proc = _cli("draft=small_model", "tracking.enabled=false", f"hydra.run.dir={tmp_path}")
    _assert_one_line_error(proc, "drafting for itself")
