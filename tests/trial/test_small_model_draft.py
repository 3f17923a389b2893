"""The small-model draft (conf/draft/small_model.yaml): another trained target drafting for this one.

Its model is a target of its own (`draft.model`), trained on the same corpus and tokenizer through
the same code and cache; here the tiny target's config with one layer instead of two (train=quick,
seconds). Exactness and greedy equality are in tests/engine/decoding/test_exactness.py and test_decode.py,
which build it from its file like every draft (tests/conftest.py: DRAFT_TEST_OVERRIDES).
"""
from __future__ import annotations

import dataclasses

import pytest

from src.engine.errors import SpecsweepError
from src.engine.models.tokenizer import CharTokenizer
from src.engine.atomic import file_sha256
from src.sweep.context import PublishedTarget, SweepContext
from src.sweep.plan import PlannedJob, prepare_targets
from src.sweep.targets import PublishedTargets
from src.trial.load import LocalTargets, build_draft, load_draft_model, load_target
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.cli.test_errors import _assert_one_line_error, _cli
from tests.conftest import DRAFT_TEST_OVERRIDES, compose_cfg, draft_for

SMALL = ["draft=small_model", *DRAFT_TEST_OVERRIDES["small_model"]]


def draft_model(cfg, target, corpus, source=None):
    """The trained model the small-model draft of `cfg` runs, from `source` (default: the local cache)."""
    return load_draft_model(trial_spec(cfg).draft, target, corpus, source or LocalTargets(), progress=False)


def test_draft_model_is_a_target_of_the_same_corpus_and_training(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL)
    small = draft_model(dcfg, target, corpus)
    # the same cache as any target: the key of (corpus, draft.model, train, train_seed)
    _, again = load_target(trial_spec(dcfg).draft.model, progress=False)
    assert small.key == again.key != target.key and small.path.parent == target.path.parent
    assert small.model.cfg.n_layer == 1 and target.model.cfg.n_layer == 2
    assert small.tokenizer.chars == target.tokenizer.chars
    draft = draft_for(dcfg, target, corpus)
    assert draft.name == "small_model" and draft.describe() == {"params": small.model.n_params()}


def test_a_trial_records_which_draft_model_drafted(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, "k=4", "timing.target_width=null",
                       "timing.lock=false")
    small = draft_model(dcfg, target, corpus)
    result = run_trial(trial_spec(dcfg), progress=False, loaded=(corpus, target))
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
        trial_spec(own)
    # also where a spec skipped that check: the draft model loaded is the target itself
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL))
    itself = dataclasses.replace(spec.draft, model=spec.target)
    with pytest.raises(SpecsweepError, match="is the target .* itself"):
        build_draft(itself, spec.target, target, corpus)


def test_draft_model_context_window_is_checked(tiny):
    cfg, _, _ = tiny
    short = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, "draft.model.block_size=32")
    with pytest.raises(SpecsweepError, match="context window \\(32\\)"):
        trial_spec(short)


def test_another_vocabulary_is_refused(tiny):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL)
    # a target over one char fewer (as if trained on another corpus)
    other = dataclasses.replace(target, tokenizer=CharTokenizer(target.tokenizer.chars[:-1]), key="0" * 16)
    with pytest.raises(SpecsweepError, match="another vocabulary"):
        draft_model(dcfg, other, corpus)


def test_sweep_parent_trains_and_publishes_the_draft_model_once(tiny):
    cfg, corpus, target = tiny
    cfgs = [compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL, f"k={k}") for k in (1, 4)]
    cfgs.append(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"))
    jobs = [PlannedJob(i, [], c, trial_spec(c), str(i)) for i, c in enumerate(cfgs)]
    published = prepare_targets(jobs, lambda t, spec: t.key)
    small = draft_model(cfgs[0], target, corpus)
    assert published == [target.key, small.key]          # each once, the draft's model after its target
    assert [j.target_key for j in jobs] == [target.key] * 3


def _published(tmp_path, targets) -> PublishedTargets:
    """A worker's target source for a sweep whose parent published `targets` (no server call is made
    while the local copies hold the published bytes)."""
    ctx = SweepContext("s", "t", "inv", "parent", "0", f"sqlite:///{tmp_path}/mlflow.db", "v", 1, 1, 1, 0.0,
                       "elsewhere:1", tuple(targets))
    return PublishedTargets(ctx, client=None)


def test_sweep_worker_takes_the_published_draft_model_and_never_trains_it(tiny, tmp_path):
    cfg, corpus, target = tiny
    dcfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, *SMALL)
    small = draft_model(dcfg, target, corpus)
    mine = PublishedTarget(target.key, "r0", target.sha256)
    # the parent published only the trial's target: the worker refuses (one line) instead of training
    with pytest.raises(SpecsweepError, match="the sweep's parent published"):
        draft_model(dcfg, target, corpus, _published(tmp_path, [mine]))
    # published: the worker loads those bytes (its local copy has them, so nothing is fetched)
    sha = file_sha256(small.path)
    source = _published(tmp_path, [mine, PublishedTarget(small.key, "r1", sha)])
    got = draft_model(dcfg, target, corpus, source)
    assert got.key == small.key and got.sha256 == sha and not source.fetched


def test_cli_refuses_the_default_target_drafting_for_itself(tmp_path):
    proc = _cli("draft=small_model", "tracking.enabled=false", f"hydra.run.dir={tmp_path}")
    _assert_one_line_error(proc, "drafting for itself")
