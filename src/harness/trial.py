"""One (draft, k, seed) cell: counters, cost, paired timing, prediction, optional exactness.

`run_trial(cfg)` is a plain function of a composed config; the Hydra entry point and the
tests both call it. It returns a `TrialResult`; tracking is done by the caller.
"""
from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..engine.corpus import load_corpus
from ..engine.decode import generate_baseline, generate_speculative
from ..engine.measure import exactness_check, measure_cost
from ..engine.drafts.base import Draft
from ..engine.errors import SpecsweepError
from ..engine.timing import PairedTiming, paired_timing, timing_options
from ..engine.train import TrainConfig, TrainedTarget, get_target
from .paths import REPO

log = logging.getLogger(__name__)


@dataclass
class TrialResult:
    metrics: dict                 # flat name -> number, everything a sweep compares
    timing: PairedTiming          # raw per-pair times
    text: str                     # the speculative run's generated chars
    info: dict = field(default_factory=dict)  # target key, draft facts, ...


def validate(cfg: DictConfig) -> None:
    """Refuse bad values with one clear sentence each, before any work is done."""
    def integer(name, value, lo):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise SpecsweepError(f"{name} must be an integer >= {lo}, got {value!r}")
    integer("k", cfg.k, 1)
    integer("n_chars", cfg.n_chars, 1)
    integer("seed", cfg.seed, 0)
    integer("timing.pairs", cfg.timing.pairs, 1)
    timing_options_of(cfg)
    integer("exactness.samples", cfg.exactness.samples, 1)
    integer("threads", cfg.threads, 1)
    t = cfg.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise SpecsweepError(f"temperature must be a number >= 0, got {t!r}")
    if not cfg.prompt:
        raise SpecsweepError("prompt must not be empty")
    need = len(cfg.prompt) + cfg.n_chars + cfg.k
    if need > cfg.model.block_size:
        raise SpecsweepError(f"prompt ({len(cfg.prompt)}) + n_chars ({cfg.n_chars}) + k ({cfg.k}) = {need} chars "
                             f"exceeds the model's context window of {cfg.model.block_size}")


def timing_options_of(cfg: DictConfig) -> dict:
    """paired_timing's adaptive settings from cfg.timing (a config without them: fixed pairs)."""
    t = cfg.timing
    return timing_options(t.get("target_width"), t.get("confidence", 0.95), t.get("max_pairs"), t.get("max_seconds"))


def repo_path(p: str | Path) -> Path:
    """Relative paths in the config are relative to the repository root, wherever the job runs."""
    p = Path(p)
    return p if p.is_absolute() else REPO / p


def load_corpus_of(cfg: DictConfig):
    return load_corpus(cfg.data.path and str(repo_path(cfg.data.path)), repo_path(cfg.data.cache_dir),
                       cfg.data.source, cfg.data.get("synthetic_chars", 60_000))


def train_config_of(cfg: DictConfig) -> TrainConfig:
    return TrainConfig(**OmegaConf.to_container(cfg.train, resolve=True))


def load_target(cfg: DictConfig, progress: bool = True):
    """(corpus, TrainedTarget) for the config: the cached target, trained on first use (all cores)."""
    corpus = load_corpus_of(cfg)
    model_kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    target = get_target(corpus, model_kwargs, train_config_of(cfg), cfg.train_seed, repo_path(cfg.data.cache_dir),
                        progress)
    return corpus, target


def build_draft(cfg: DictConfig, target: TrainedTarget, corpus, draft_cfg: DictConfig | None = None) -> Draft:
    """The draft of `draft_cfg` (default: cfg.draft), fitted to `target` and the training split."""
    draft_cfg = cfg.draft if draft_cfg is None else draft_cfg
    train_text, _ = corpus.split(cfg.train.val_fraction)
    try:
        return instantiate(draft_cfg, target=target.model, train_ids=target.tokenizer.encode(train_text))
    except SpecsweepError:
        raise
    except Exception as e:  # a draft config whose class or arguments do not fit
        cause = e.__cause__ or e
        raise SpecsweepError(f"cannot build draft {draft_cfg.get('name', '?')!r}: {cause}") from None


def run_trial(cfg: DictConfig, progress: bool = True, loaded=None, timing_lock=None) -> TrialResult:
    """loaded: (corpus, TrainedTarget) if the caller has them already.
    timing_lock: a context manager held around the timed phase (cost and paired timing), so
    parallel workers time one at a time while their deterministic work runs in parallel."""
    validate(cfg)
    torch.set_num_threads(cfg.threads)  # every job: loky reuses worker processes
    device = cfg.device
    corpus, target = loaded if loaded is not None else load_target(cfg, progress)
    model = target.model.to(device)
    draft = build_draft(cfg, target, corpus)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    k, n, T = cfg.k, cfg.n_chars, cfg.temperature

    def new_gen():
        return torch.Generator(device=device).manual_seed(cfg.seed)

    # deterministic counters: exact given the seed
    g = generate_speculative(model, draft, prompt, n, k, T, new_gen())
    metrics = {
        "acceptance": g.accepted / g.proposed,
        "position_acceptance": g.accepted / g.tested,
        "analytic_acceptance": g.overlap_sum / g.tested,
        "chars_per_pass": g.chars_emitted / g.target_passes,
        "target_passes": g.target_passes,
        "baseline_passes": n,
        "draft_calls": g.draft_calls,
        "proposed": g.proposed,
        "accepted": g.accepted,
    }
    for i, a in enumerate(g.accepted_at, start=1):
        metrics[f"acceptance_pos_{i}"] = a / g.target_passes

    with timing_lock or nullcontext():
        metrics.update(measure_cost(model, draft, prompt, k, T, cfg.timing.cost_reps, device))
        timing = paired_timing(lambda: generate_baseline(model, prompt, n, T, new_gen()),
                               lambda: generate_speculative(model, draft, prompt, n, k, T, new_gen(),
                                                            track_overlap=False),
                               cfg.timing.pairs, device, **timing_options_of(cfg))
    metrics.update(timing.summary())
    metrics["predicted_speedup"] = metrics["chars_per_pass"] / (1 + k * metrics["c"])
    # loop overhead left after the measured components, per pass (used by the cost models)
    spec_s = metrics["speculative_s_median"]
    metrics["overhead_us_per_pass"] = (spec_s * 1e6 - g.target_passes * metrics["verify_pass_us"]
                                       - g.proposed * metrics["draft_char_us"]) / g.target_passes
    if cfg.exactness.enabled:
        metrics.update(exactness_check(model, draft, prompt, T, cfg.exactness.samples, cfg.seed))
    info = {"target_key": target.key, "target_val_loss": target.val_loss,
            "target_params": model.n_params(), "draft": draft.name, **{f"draft_{a}": b for a, b in draft.describe().items()}}
    return TrialResult(metrics, timing, target.tokenizer.decode(g.tokens), info)
