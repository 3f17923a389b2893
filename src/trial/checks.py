"""What is checked of a trial's inputs before any work: its folders, its corpus, its cached checkpoints.

`check_inputs(spec)` tries that a file can be created in the cache folder (corpus, models,
drafts) and in the timing lock's folder; then `check_corpus(spec)` reads the corpus (fetching
the default one on first use, as a trial would) and refuses, in one sentence, one that cannot
serve the trial: a vocabulary of one char or of more than `data.max_vocab`, a prompt with chars
the corpus lacks, a training or validation split shorter than the context window of the target
(or of a model draft's own model) plus one; last, a cached checkpoint the trial would load that
fails its checksum is refused (`check_cached_checkpoints`). The sweep's parent runs it for every
trial of its plan, and a single run before its own; both before the store is touched or a
target trained.
"""
from __future__ import annotations

from ..engine.corpus import Corpus
import tempfile
from pathlib import Path

from ..engine.errors import SpecsweepError
from ..engine.locks import check_creatable
from ..engine.train import corpus_tokenizer, target_location, verify_checkpoint
from .load import load_corpus_of
from .spec import TargetSpec, TrialSpec


def check_inputs(spec: TrialSpec) -> Corpus:
    """Every input check of a trial; returns its corpus."""
    check_creatable(spec.target.data.cache_dir, "the cache (data.cache_dir)")
    if spec.timing.lock:
        check_creatable(spec.timing.lock_dir or Path(tempfile.gettempdir()), "the timing lock (timing.lock_dir)")
    corpus = check_corpus(spec)
    check_cached_checkpoints(spec, corpus)
    return corpus


_VERIFIED: dict[tuple, str] = {}   # (path, size, mtime) -> its sha256, verified by this process


def check_cached_checkpoints(spec: TrialSpec, corpus: Corpus) -> None:
    """A cached checkpoint of the trial's target (or of a model draft's own model) that fails its
    checksum is refused now, before the store is touched, not when the trial loads it. A missing
    one is fine: it will be trained. Each file is hashed once per process while it is unchanged."""
    for target in (spec.target, spec.draft.model):
        if target is None:
            continue
        _, path = target_location(corpus, target.model, target.train, target.train_seed, target.data.cache_dir)
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _VERIFIED:
            _VERIFIED[key] = verify_checkpoint(path)


def check_corpus(spec: TrialSpec) -> Corpus:
    """The trial's corpus, once it is known to serve the trial (one-sentence refusals otherwise)."""
    data = spec.target.data
    corpus = load_corpus_of(data)
    chars = corpus_tokenizer(corpus).chars
    where = f"corpus {data.path or data.source}"
    if len(chars) < 2:
        raise SpecsweepError(f"{where} has {len(chars)} distinct char(s): a model of it has nothing to predict")
    if len(chars) > data.max_vocab:
        raise SpecsweepError(f"{where} has {len(chars)} distinct chars, more than data.max_vocab = {data.max_vocab}: "
                             "use a text of fewer symbols (or raise data.max_vocab)")
    missing = sorted(set(spec.prompt) - set(chars))
    if missing:
        raise SpecsweepError(f"the prompt has chars {''.join(missing)!r} that {where} lacks: "
                             "choose a prompt of the corpus's chars")
    for target, role in ((spec.target, "the target"), (spec.draft.model, f"draft {spec.draft.name!r}'s model")):
        if target is not None:
            check_splits(corpus, target, where, role)
    return corpus


def check_splits(corpus: Corpus, target: TargetSpec, where: str, role: str) -> None:
    """Training and validation need more than one context window each (train.val_fraction splits)."""
    need = target.model["block_size"] + 2
    train_text, val_text = corpus.split(target.train.val_fraction)
    for split, text in (("training", train_text), ("validation", val_text)):
        if len(text) < need:
            raise SpecsweepError(f"{where} is too small: its {split} split has {len(text)} chars, {role}'s context "
                                 f"window of {target.model['block_size']} needs at least {need} (use a larger text, "
                                 "a smaller model.block_size or another train.val_fraction)")
