"""What a trial loads: the corpus, the trained target, the draft.

A `TargetSource` gives a trial its corpus and its trained targets (the trial's own, and a
model draft's). `LocalTargets`, the one a trial alone uses, reads this host's model cache and
trains a missing target on first use, with every core; a sweep's worker gets a source of its
own from the sweep (src/sweep/targets.py: `PublishedTargets`), which fetches the target its
sweep's parent published and never trains.

What is loaded is kept per process, keyed by what determines it, so the jobs a process runs
one after another (joblib at n_jobs=1, a loky worker) load it once: the corpus (by its
settings and its file's size, mtime and inode), the target (by its checkpoint's path and file
stamp, with the sha256 it was verified against) and the drafts' training ids (by the corpus's
sha256, the split and the vocabulary). A file that changes is read and checked again.
"""
from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

import torch

from ..engine.atomic import file_sha256
from ..engine.models.corpus import Corpus, load_corpus
from ..engine.drafts.base import Draft
from ..engine.errors import SpecsweepError
from ..engine.models.tokenizer import vocabulary_difference
from ..engine.models.train import TrainedTarget, get_target, target_location
from .capabilities import draft_class
from .spec import DataSpec, DraftSpec, TargetSpec, is_folder_model


def file_stamp(path: Path) -> tuple | None:
    """(size, mtime, inode) of a file, None if there is none: a file rewritten or replaced
    (written to a temporary name and renamed) gets another stamp."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


# per-process caches (see the module's docstring)
_CORPORA: dict[DataSpec, tuple] = {}        # corpus settings -> (file stamp, Corpus)
_TARGETS: dict[str, tuple] = {}             # checkpoint path -> (file stamp, TrainedTarget)
_TRAIN_IDS: dict[tuple, torch.Tensor] = {}  # (corpus sha256, val_fraction, vocabulary) -> ids


def corpus_file(data: DataSpec) -> Path | None:
    """The file the corpus is read from (None for a generated one)."""
    if data.path:
        return data.path
    return data.cache_dir / "shakespeare.txt" if data.source == "shakespeare" else None


def load_corpus_of(data: DataSpec) -> Corpus:
    source_file = corpus_file(data)
    stamp = file_stamp(source_file) if source_file else ()  # () for a generated corpus: always the same
    hit = _CORPORA.get(data)
    if hit is not None and stamp is not None and hit[0] == stamp:
        return hit[1]
    corpus = load_corpus(data.path and str(data.path), data.cache_dir, data.source, data.synthetic_chars)
    if stamp is not None and (file_stamp(source_file) if source_file else ()) == stamp:  # unchanged meanwhile
        _CORPORA[data] = (stamp, corpus)
    return corpus


def target_key_and_path(corpus: Corpus, spec: TargetSpec) -> tuple[str, Path]:
    """(cache key, checkpoint path) of the target `spec` names: no training. A model from a folder
    (model=hf) has the key "hf-" + its folder's digest, and the folder as its path."""
    if is_folder_model(spec.model):
        folder = Path(spec.model["path"])
        return "hf-" + folder_digest(folder)[:16], folder
    return target_location(corpus, spec.model, spec.train, spec.train_seed, spec.data.cache_dir)


_FOLDER_DIGESTS: dict[str, tuple] = {}     # folder -> (its files' stamps, digest)


def folder_stamp(folder: Path) -> tuple:
    """(name, size, mtime, inode) of each file in the folder: a file added, changed or replaced changes it."""
    return tuple(sorted((p.name, file_stamp(p)) for p in folder.iterdir() if p.is_file()))


def folder_digest(folder: Path) -> str:
    """sha256 over the folder's files (name and sha256 of each), computed once per process while
    the files are unchanged: what identifies a model from a folder in every trial record."""
    stamp = folder_stamp(folder)
    hit = _FOLDER_DIGESTS.get(str(folder))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    h = hashlib.sha256()
    for name, _ in stamp:
        h.update(f"{name}\0{file_sha256(folder / name)}\n".encode())
    digest = h.hexdigest()
    if folder_stamp(folder) == stamp:   # unchanged meanwhile
        _FOLDER_DIGESTS[str(folder)] = (stamp, digest)
    return digest


def load_folder_target(spec: TargetSpec) -> TrainedTarget:
    """The model from a folder (model=hf) as a TrainedTarget: key "hf-<digest>", no validation loss
    (NaN: it was not trained here), path the folder; loaded once per process while unchanged."""
    from ..engine.huggingface.folder_model import load_checkpoint
    folder = Path(spec.model["path"])
    hit = _TARGETS.get(str(folder))
    if hit is not None and hit[0] == folder_stamp(folder):
        return hit[1]
    stamp, digest = folder_stamp(folder), folder_digest(folder)
    model, tokenizer = load_checkpoint(folder, spec.model.get("max_len"))
    target = TrainedTarget(model, tokenizer, "hf-" + digest[:16], float("nan"), folder, digest)
    if folder_stamp(folder) == stamp:
        _TARGETS[str(folder)] = (stamp, target)
    return target


def cached_target(path: Path, sha256: str | None = None) -> TrainedTarget | None:
    """The target this process loaded from `path`, if the file is unchanged since (and, with
    `sha256`, holds those bytes)."""
    hit = _TARGETS.get(str(path))
    if hit is None or hit[0] != file_stamp(path) or (sha256 is not None and hit[1].sha256 != sha256):
        return None
    return hit[1]


def get_target_cached(corpus: Corpus, spec: TargetSpec, progress: bool = True, train_if_missing: bool = True,
                      sha256: str | None = None) -> TrainedTarget:
    """The engine's `get_target` for the spec, served from this process's cache when the
    checkpoint file is the one it loaded (and verified) before (with `sha256`: those bytes). A model
    from a folder is loaded from it (never trained)."""
    if is_folder_model(spec.model):
        target = load_folder_target(spec)
        if sha256 is not None and target.sha256 != sha256:
            raise SpecsweepError(f"model.path {target.path} changed since its sweep began (digest "
                                 f"{target.sha256[:12]}..., the sweep's {sha256[:12]}...): rerun the sweep")
        return target
    _, path = target_key_and_path(corpus, spec)
    target = cached_target(path, sha256)
    if target is None:
        stamp = file_stamp(path)
        target = get_target(corpus, spec.model, spec.train, spec.train_seed, spec.data.cache_dir, progress,
                            train_if_missing=train_if_missing)
        if stamp is not None and file_stamp(path) == stamp:  # the file it verified and loaded, unchanged meanwhile
            _TARGETS[str(path)] = (stamp, target)
    return target


class TargetSource:
    """Where a trial's corpus and trained targets come from."""

    def corpus(self, data: DataSpec) -> Corpus:
        return load_corpus_of(data)

    def target(self, corpus: Corpus, spec: TargetSpec, progress: bool = True) -> TrainedTarget:
        raise NotImplementedError


class LocalTargets(TargetSource):
    """This host's model cache; a missing target is trained on first use (all cores)."""

    def target(self, corpus: Corpus, spec: TargetSpec, progress: bool = True) -> TrainedTarget:
        return get_target_cached(corpus, spec, progress)


def load_target(spec: TargetSpec, source: TargetSource | None = None, progress: bool = True):
    """(corpus, TrainedTarget) of `spec`, from `source` (default: the local cache)."""
    source = source or LocalTargets()
    corpus = source.corpus(spec.data)
    return corpus, source.target(corpus, spec, progress)


def train_ids_of(spec: TargetSpec, target: TrainedTarget, corpus: Corpus) -> torch.Tensor:
    """The training split as the target's ids (what drafts are fitted to); read-only."""
    key = (corpus.sha256, spec.train.val_fraction, tuple(target.tokenizer.chars))
    ids = _TRAIN_IDS.get(key)
    if ids is None:
        train_text, _ = corpus.split(spec.train.val_fraction)
        _TRAIN_IDS.clear()  # one corpus at a time: 36 MB for the default one
        ids = _TRAIN_IDS[key] = target.tokenizer.encode(train_text)
    return ids


def load_draft_model(draft: DraftSpec, target: TrainedTarget, corpus: Corpus, source: TargetSource,
                     progress: bool = True) -> TrainedTarget:
    """The trained model a model draft runs (`draft.model`), from the same source as the
    trial's target. It must share the target's vocabulary (one-line refusal otherwise)."""
    small = source.target(corpus, draft.model, progress)
    if small.key == target.key:
        raise SpecsweepError(f"draft {draft.name!r} is the target {target.key} itself: "
                             "use a larger target (model=medium) or another draft model (model@draft.model=NAME)")
    differ = vocabulary_difference(small.tokenizer.chars, target.tokenizer.chars, ("the draft's", "the target's"))
    if differ:
        raise SpecsweepError(f"draft model {small.key} has another vocabulary than the target {target.key} ({differ}): "
                             "train both on the same corpus, or give a checkpoint with the target's tokenizer")
    return small


def cache_kwargs(cls: type, target_spec: TargetSpec, target: TrainedTarget) -> dict:
    """`cache_dir` (<data.cache_dir>/drafts) and `target_key`, for a draft class whose __init__
    takes them: where a draft that builds or trains something keeps it, keyed by the target."""
    accepted = inspect.signature(cls.__init__).parameters
    offered = {"cache_dir": str(target_spec.data.cache_dir / "drafts"), "target_key": target.key}
    return {name: value for name, value in offered.items() if name in accepted}


def build_draft(draft: DraftSpec, target_spec: TargetSpec, target: TrainedTarget, corpus: Corpus,
                source: TargetSource | None = None) -> Draft:
    """The draft `draft` names, fitted to `target` and the training split. A class whose
    __init__ accepts them also gets `cache_dir` (where a draft that builds or trains something
    keeps it: <data.cache_dir>/drafts), `target_key` (the target's cache key, part of the
    draft's own key) and, for a draft with a model of its own, `model`: that trained model."""
    cls = draft_class(draft.cls)
    extra = cache_kwargs(cls, target_spec, target)
    if draft.model is not None:
        extra["model"] = load_draft_model(draft, target, corpus, source or LocalTargets()).model
    train_ids = train_ids_of(target_spec, target, corpus)
    try:
        return cls(target=target.model, train_ids=train_ids, name=draft.name, **draft.options, **extra)
    except SpecsweepError:
        raise
    except Exception as e:  # a draft config whose arguments do not fit the class
        raise SpecsweepError(f"cannot build draft {draft.name!r}: {e}") from None


def draft_model_key(draft: DraftSpec, corpus: Corpus) -> str | None:
    """The cache key of a model draft's trained model (None for other drafts)."""
    return None if draft.model is None else target_key_and_path(corpus, draft.model)[0]
