"""One (draft, k, seed) cell: counters, cost, paired timing, prediction, optional exactness.

`run_trial(cfg)` is a plain function of a composed config; the Hydra entry point and the
tests both call it. It returns a `TrialResult`; tracking is done by the caller.

What a trial loads is kept per process, keyed by what determines it, so the jobs a process
runs one after another (joblib at n_jobs=1, a loky worker) load it once: the corpus (by its
settings and its file's size, mtime and inode), the target (by its checkpoint's path and
file stamp, with the sha256 it was verified against) and the drafts' training ids (by the
corpus's sha256, the split and the vocabulary). A file that changes is read and checked again.
"""
from __future__ import annotations

import inspect
import logging
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from ..engine.corpus import load_corpus
from ..engine.decode import generate_baseline, generate_speculative
from ..engine.measure import exactness_check, measure_cost
from ..engine.drafts.base import Draft
from ..engine.errors import SpecsweepError
from ..engine.replay import ProposalRecorder, ReplayDraft
from ..engine.timing import PairedTiming, cost_round_options, paired_timing, timing_options
from ..engine.tree import check_widths, generate_tree, max_nodes
from ..engine.train import TrainConfig, TrainedTarget, get_target, target_location
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
    tree_widths_of(cfg)
    integer("n_chars", cfg.n_chars, 1)
    integer("seed", cfg.seed, 0)
    integer("timing.pairs", cfg.timing.pairs, 1)
    timing_options_of(cfg)
    cost_options_of(cfg)
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
    draft_model_check(cfg, need)
    n_heads = cfg.draft.get("n_heads")  # a draft of heads drafts at most one char per head
    if isinstance(n_heads, int) and cfg.k > n_heads:
        raise SpecsweepError(f"k = {cfg.k} exceeds the {n_heads} heads of draft {cfg.draft.get('name', '?')!r} "
                             f"(set draft.n_heads >= k)")


def draft_target_cfg(cfg: DictConfig, draft_cfg: DictConfig | None = None) -> DictConfig | None:
    """The config of the target a model draft runs (`draft.model`, a conf/model/ file placed
    there by the draft's defaults list): `cfg` with `model` replaced by it, so the draft is
    trained on the same corpus and tokenizer, with the same training settings and train_seed,
    through the same code and cache as any target. None for a draft without a model of its own."""
    draft_cfg = cfg.draft if draft_cfg is None else draft_cfg
    model = draft_cfg.get("model")
    if not OmegaConf.is_dict(model):
        return None
    out = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "model"])
    with open_dict(out):
        out.model = OmegaConf.to_container(model, resolve=True)
    return out


def draft_model_check(cfg: DictConfig, need: int) -> None:
    """A model draft must fit the trial's chars in its own context window and must not be the
    target itself: the same model config, corpus, training and train_seed give the same cache
    key, hence the same checkpoint, and a target drafting for itself accepts every char by
    construction (p = q) while paying a full forward per drafted char: it measures only the
    loop's overhead, so it is refused rather than swept."""
    dcfg = draft_target_cfg(cfg)
    if dcfg is None:
        return
    name = cfg.draft.get("name", "?")
    if dcfg.model.block_size < need:
        raise SpecsweepError(f"draft {name!r}: its model's context window ({dcfg.model.block_size}) is shorter than "
                             f"prompt + n_chars + k = {need}")
    if OmegaConf.to_container(cfg.model, resolve=True) == OmegaConf.to_container(dcfg.model):
        raise SpecsweepError(f"draft {name!r} has the target's own model config: it would be the target drafting "
                             "for itself (acceptance 1 by construction); use a larger target (model=medium) "
                             "or another draft model (model@draft.model=NAME)")


def tree_widths_of(cfg: DictConfig) -> tuple[int, ...] | None:
    """The tree's widths for verify=tree, None for the chain (also for a config without the
    verify group); a bad shape, or a k other than the tree's depth, is refused in one line."""
    verify = cfg.get("verify")
    name = verify.get("name", "chain") if verify is not None else "chain"
    if name == "chain":
        return None
    if name != "tree":
        raise SpecsweepError(f"unknown verify {name!r} (chain or tree)")
    widths = verify.get("widths")
    try:
        shape = check_widths(OmegaConf.to_container(widths) if OmegaConf.is_config(widths) else widths,
                             "verify.widths")
    except ValueError as e:
        raise SpecsweepError(str(e)) from None
    if cfg.k != len(shape):
        raise SpecsweepError(f"verify=tree: k ({cfg.k}) must equal the tree's depth, len(verify.widths) = "
                             f"{len(shape)} for widths {list(shape)}; set k={len(shape)}")
    return shape


def tree_label(widths) -> str:
    """A tree shape as a short label: (4, 2, 2, 1) -> '4-2-2-1'."""
    return "-".join(map(str, widths))


def timing_options_of(cfg: DictConfig) -> dict:
    """paired_timing's adaptive settings from cfg.timing (a config without them: fixed pairs)."""
    t = cfg.timing
    return timing_options(t.get("target_width"), t.get("confidence", 0.95), t.get("max_pairs"), t.get("max_seconds"))


def cost_options_of(cfg: DictConfig) -> dict:
    """measure_cost's adaptive-round settings from cfg.timing (a config without them: fixed rounds)."""
    t = cfg.timing
    return cost_round_options(t.get("cost_width"), t.get("confidence", 0.95), t.get("cost_max_rounds"),
                              t.get("cost_max_seconds"))


def repo_path(p: str | Path) -> Path:
    """Relative paths in the config are relative to the repository root, wherever the job runs."""
    p = Path(p)
    return p if p.is_absolute() else REPO / p


def file_stamp(path: Path) -> tuple | None:
    """(size, mtime, inode) of a file, None if there is none: a file rewritten or replaced
    (written to a temporary name and renamed) gets another stamp."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


# per-process caches (see the module's docstring)
_CORPORA: dict[tuple, tuple] = {}          # corpus settings -> (file stamp, Corpus)
_TARGETS: dict[str, tuple] = {}            # checkpoint path -> (file stamp, TrainedTarget)
_TRAIN_IDS: dict[tuple, torch.Tensor] = {}  # (corpus sha256, val_fraction, vocabulary) -> ids


def load_corpus_of(cfg: DictConfig):
    path = cfg.data.path and str(repo_path(cfg.data.path))
    cache_dir = repo_path(cfg.data.cache_dir)
    settings = (path, str(cache_dir), cfg.data.source, cfg.data.get("synthetic_chars", 60_000))
    source_file = Path(path) if path else cache_dir / "shakespeare.txt" if cfg.data.source == "shakespeare" else None
    stamp = file_stamp(source_file) if source_file else ()  # () for a generated corpus: always the same
    hit = _CORPORA.get(settings)
    if hit is not None and stamp is not None and hit[0] == stamp:
        return hit[1]
    corpus = load_corpus(*settings)
    if stamp is not None and (file_stamp(source_file) if source_file else ()) == stamp:  # unchanged meanwhile
        _CORPORA[settings] = (stamp, corpus)
    return corpus


def train_config_of(cfg: DictConfig) -> TrainConfig:
    return TrainConfig(**OmegaConf.to_container(cfg.train, resolve=True))


def cached_target(path: Path, sha256: str | None = None) -> TrainedTarget | None:
    """The target this process loaded from `path`, if the file is unchanged since (and, with
    `sha256`, holds those bytes)."""
    hit = _TARGETS.get(str(path))
    if hit is None or hit[0] != file_stamp(path) or (sha256 is not None and hit[1].sha256 != sha256):
        return None
    return hit[1]


def get_target_cached(corpus, cfg: DictConfig, progress: bool = True, train_if_missing: bool = True,
                      sha256: str | None = None) -> TrainedTarget:
    """The engine's `get_target` for the config, served from this process's cache when the
    checkpoint file is the one it loaded (and verified) before (with `sha256`: those bytes)."""
    model_kwargs = OmegaConf.to_container(cfg.model, resolve=True)
    train_cfg, cache_dir = train_config_of(cfg), repo_path(cfg.data.cache_dir)
    _, path = target_location(corpus, model_kwargs, train_cfg, cfg.train_seed, cache_dir)
    target = cached_target(path, sha256)
    if target is None:
        stamp = file_stamp(path)
        target = get_target(corpus, model_kwargs, train_cfg, cfg.train_seed, cache_dir, progress,
                            train_if_missing=train_if_missing)
        if stamp is not None and file_stamp(path) == stamp:  # the file it verified and loaded, unchanged meanwhile
            _TARGETS[str(path)] = (stamp, target)
    return target


def load_target(cfg: DictConfig, progress: bool = True):
    """(corpus, TrainedTarget) for the config: the cached target, trained on first use (all cores)."""
    corpus = load_corpus_of(cfg)
    return corpus, get_target_cached(corpus, cfg, progress)


def train_ids_of(cfg: DictConfig, target: TrainedTarget, corpus) -> torch.Tensor:
    """The training split as the target's ids (what drafts are fitted to); read-only."""
    key = (corpus.sha256, cfg.train.val_fraction, tuple(target.tokenizer.chars))
    ids = _TRAIN_IDS.get(key)
    if ids is None:
        train_text, _ = corpus.split(cfg.train.val_fraction)
        _TRAIN_IDS.clear()  # one corpus at a time: 36 MB for the default one
        ids = _TRAIN_IDS[key] = target.tokenizer.encode(train_text)
    return ids


def load_draft_target(cfg: DictConfig, target: TrainedTarget, corpus, draft_cfg: DictConfig | None = None,
                      progress: bool = True) -> TrainedTarget:
    """The trained target a model draft runs (see `draft_target_cfg`). In a sweep's job it is
    the checkpoint the sweep's parent trained and published (fetched and verified, never
    trained here, as the trial's own target); alone, it is loaded from the cache, trained on
    first use. It must share the target's vocabulary (one-line refusal otherwise)."""
    from .context import SweepContext
    dcfg = draft_target_cfg(cfg, draft_cfg)
    ctx = SweepContext.from_cfg(cfg)
    if ctx is not None:
        from .targets import load_published_target
        from .tracking import client_for
        _, small, _ = load_published_target(dcfg, ctx, client_for(ctx.tracking_uri))
    else:
        small = get_target_cached(corpus, dcfg, progress)
    if small.key == target.key:
        raise SpecsweepError(f"draft {(draft_cfg or cfg.draft).get('name', '?')!r} is the target {target.key} itself: "
                             "use a larger target (model=medium) or another draft model (model@draft.model=NAME)")
    if small.tokenizer.chars != target.tokenizer.chars:
        raise SpecsweepError(f"draft model {small.key} has another vocabulary ({small.tokenizer.vocab_size} chars) than "
                             f"the target {target.key} ({target.tokenizer.vocab_size}): train both on the same corpus")
    return small


def draft_kwargs(cls: type, cfg: DictConfig, target: TrainedTarget, corpus=None,
                 draft_cfg: DictConfig | None = None) -> dict:
    """What the harness adds for a draft class whose __init__ accepts it: `cache_dir` (where a
    draft that builds or trains something keeps it: <data.cache_dir>/drafts), `target_key`
    (the target's cache key, part of the draft's own key) and, for a draft config with a
    `model` of its own (with `corpus` given), `model`: that trained model (`load_draft_target`)."""
    offered = {"cache_dir": str(repo_path(cfg.data.cache_dir) / "drafts"), "target_key": target.key}
    accepted = inspect.signature(cls.__init__).parameters
    out = {name: value for name, value in offered.items() if name in accepted}
    if "model" in accepted and corpus is not None and draft_target_cfg(cfg, draft_cfg) is not None:
        out["model"] = load_draft_target(cfg, target, corpus, draft_cfg).model
    return out


def build_draft(cfg: DictConfig, target: TrainedTarget, corpus, draft_cfg: DictConfig | None = None) -> Draft:
    """The draft of `draft_cfg` (default: cfg.draft), fitted to `target` and the training split."""
    draft_cfg = cfg.draft if draft_cfg is None else draft_cfg
    train_ids = train_ids_of(cfg, target, corpus)
    try:
        extra = draft_kwargs(get_class(draft_cfg._target_), cfg, target, corpus, draft_cfg)
        if "model" in extra:  # the config's `model` describes the draft model; the class gets it trained
            draft_cfg = OmegaConf.masked_copy(draft_cfg, [k for k in draft_cfg if k != "model"])
        return instantiate(draft_cfg, target=target.model, train_ids=train_ids, **extra)
    except SpecsweepError:
        raise
    except Exception as e:  # a draft config whose class or arguments do not fit
        cause = e.__cause__ or e
        raise SpecsweepError(f"cannot build draft {draft_cfg.get('name', '?')!r}: {cause}") from None


def free_loop_run(speculate, recorder: ProposalRecorder, g):
    """(run, passes) for measure_cost's free loop (`loops`): the loop replaying the counter run's
    recorded proposals (src/engine/replay.py), timed as the speculative arm is (no overlap
    counter); speculate(track_overlap, with_draft) runs the trial's loop. Run once here, untimed, to
    check it makes the counter run's passes and chars; None, with a warning, where it does not (a
    draft that is not deterministic given the seed)."""
    free = ReplayDraft(recorder)

    def run():
        return speculate(False, free)
    try:
        replayed = run()
    except RuntimeError:
        replayed = None
    if replayed is None or (replayed.tokens, replayed.target_passes) != (g.tokens, g.target_passes):
        log.warning("the free loop's replay diverged from the counter run: free_pass_us and base_pass_us not measured")
        return None
    return run, g.target_passes


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
    widths = tree_widths_of(cfg)

    def new_gen():
        return torch.Generator(device=device).manual_seed(cfg.seed)

    def speculate(track_overlap=True, with_draft=draft):
        """One run of the trial's loop from its seed (with_draft: the draft, or a stand-in for it)."""
        if widths is None:
            return generate_speculative(model, with_draft, prompt, n, k, T, new_gen(), track_overlap=track_overlap)
        return generate_tree(model, with_draft, prompt, n, widths, T, new_gen(), track_overlap=track_overlap)

    def baseline():
        return generate_baseline(model, prompt, n, T, new_gen())

    # deterministic counters: exact given the seed; a chain's proposals recorded for the free loop
    recorder = ProposalRecorder(draft) if widths is None and cfg.timing.free_loop else None
    g = speculate(with_draft=draft if recorder is None else recorder)
    free_run = None if recorder is None else free_loop_run(speculate, recorder, g)
    # the free loop and the baseline loop, timed with the components (the cost model's loop times)
    loops = None if free_run is None else {"free": free_run, "base": (baseline, n)}
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
        metrics[f"acceptance_pos_{i}"] = a / g.target_passes   # tree: passes whose path reached depth i
    # drafted chars per pass: k for the chain, the tree's nodes (fewer where a draft row has
    # fewer chars with mass than a width) for a tree; the cost model's draft term is this times c
    per_pass = g.proposed / g.target_passes
    if widths is not None:
        metrics.update({"tree_depth": len(widths), "tree_nodes": max_nodes(widths), "nodes_per_pass": per_pass})

    with timing_lock or nullcontext():
        metrics.update(measure_cost(model, draft, prompt, k, T, cfg.timing.cost_reps, device, tree_widths=widths,
                                    loops=loops, **cost_options_of(cfg)))
        timing = paired_timing(baseline, lambda: speculate(track_overlap=False),
                               cfg.timing.pairs, device, **timing_options_of(cfg))
    metrics.update(timing.summary())
    metrics["predicted_speedup"] = metrics["chars_per_pass"] / (1 + per_pass * metrics["c"])
    # loop overhead left after the measured components, per pass (used by the cost models)
    spec_s = metrics["speculative_s_median"]
    metrics["overhead_us_per_pass"] = (spec_s * 1e6 - g.target_passes * metrics["verify_pass_us"]
                                       - g.proposed * metrics["draft_char_us"]) / g.target_passes
    if cfg.exactness.enabled:
        metrics.update(exactness_check(model, draft, prompt, T, cfg.exactness.samples, cfg.seed, tree_widths=widths))
    info = {"target_key": target.key, "target_val_loss": target.val_loss, "verify": "chain" if widths is None
            else f"tree {tree_label(widths)} ({max_nodes(widths)} nodes)",
            "target_params": model.n_params(), "draft": draft.name, **{f"draft_{a}": b for a, b in draft.describe().items()}}
    dcfg = draft_target_cfg(cfg)
    if dcfg is not None:  # a model draft: which trained target drafted (a tag `info.draft_model_key`)
        info["draft_model_key"] = target_location(corpus, OmegaConf.to_container(dcfg.model), train_config_of(dcfg),
                                                  dcfg.train_seed, repo_path(dcfg.data.cache_dir))[0]
    return TrialResult(metrics, timing, target.tokenizer.decode(g.tokens), info)
