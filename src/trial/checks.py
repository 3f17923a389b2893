"""What is checked of a trial's inputs before any work: its folders, its corpus, its cached checkpoints.

`check_inputs(spec)` tries that a file can be created in the cache folder (corpus, models,
drafts) and in the timing lock's folder; then `check_corpus(spec)` reads the corpus (fetching
the default one on first use, as a trial would) and refuses, in one sentence, one that cannot
serve the trial: a vocabulary of one char or of more than `data.max_vocab`, a prompt with chars
the corpus lacks, a training or validation split shorter than the context window of the target
(or of a model draft's own model) plus one; a model from a folder (the target, a draft's model)
is loaded as the trial will load it (its weights read, its prefix test passed) and the target's
tokenizer must encode the whole corpus (`check_folder_models`); then a tree or a batch too large
for the memory available (`check_memory`); last, a cached checkpoint the trial would load that
cannot be read, fails its checksum or does not give its recorded loss on the check slice, or an
unreadable shipped one, is refused (`check_cached_checkpoints`). The sweep's parent runs it for every
trial of its plan, and a single run before its own; both before the store is touched or a
target trained.
"""
from __future__ import annotations

from ..engine.models.corpus import Corpus
import tempfile
from pathlib import Path

from ..engine.errors import SpecsweepError
from ..engine.locks import check_creatable
from ..engine.models.tokenizer import vocabulary_difference
from ..engine.models.train import check_shipped_readable, corpus_tokenizer, target_location, verify_target
from .load import load_corpus_of, load_folder_target, train_ids_of
from .capabilities import draft_class
from .spec import TargetSpec, TrialSpec, check_window, is_folder_model
from .workload import WorkloadSpec, workload_prompts


def check_inputs(spec: TrialSpec) -> Corpus:
    """Every input check of a trial; returns its corpus."""
    check_creatable(spec.target.data.cache_dir, "the cache (data.cache_dir)")
    if spec.timing.lock:
        check_creatable(spec.timing.lock_dir or Path(tempfile.gettempdir()), "the timing lock (timing.lock_dir)")
    corpus = check_corpus(spec)
    if spec.draft.model is not None and is_folder_model(spec.draft.model.model):
        check_folder_draft(spec, corpus)
    if is_folder_model(spec.target.model):
        check_folder_prompt(spec, corpus)
        check_folder_models(spec, corpus)
        return corpus
    check_folder_models(spec, corpus)   # a draft's model from a folder
    check_memory(spec, len(corpus_tokenizer(corpus).chars))
    check_cached_checkpoints(spec, corpus)
    return corpus


def folder_tokens(folder: str) -> list[str]:
    """The tokens of a folder model's tokenizer, in id order (one-line refusal if it does not load)."""
    from ..engine.huggingface.folder_model import HFTokenizer
    from ..engine.huggingface.checkpoint import offline_transformers
    try:
        return HFTokenizer(offline_transformers().AutoTokenizer.from_pretrained(folder, local_files_only=True)).chars
    except Exception as e:   # noqa: BLE001
        raise SpecsweepError(f"model.path {folder}: transformers cannot load its tokenizer "
                             f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})") from None


def check_folder_draft(spec: TrialSpec, corpus: Corpus) -> None:
    """A draft model from a folder must have the target's tokenizer: the same tokens in the same order."""
    mine = folder_tokens(spec.draft.model.model["path"])
    theirs = (folder_tokens(spec.target.model["path"]) if is_folder_model(spec.target.model)
              else corpus_tokenizer(corpus).chars)
    differ = vocabulary_difference(mine, theirs, ("the draft's", "the target's"))
    if differ:
        raise SpecsweepError(f"draft {spec.draft.name!r}: its tokenizer is not the target's ({differ}): a draft must "
                             "propose the target's tokens; give a draft model saved with the target's tokenizer "
                             "(the same tokens in the same order)")


def check_folder_prompt(spec: TrialSpec, corpus: Corpus) -> None:
    """A model from a folder (model=hf): its vocabulary must be at most data.max_vocab tokens for a
    draft whose build holds a row of it per training position (distilled) and small enough for a
    table draft's order (its context codes fit an int64), its tokenizer must encode every prompt of
    the workload, and each prompt + its n_chars + k tokens must fit its context window and a draft
    model's (counted in tokens here: the spec counts chars for the tool's own models only)."""
    from ..engine.huggingface.folder_model import HFTokenizer
    from ..engine.huggingface.checkpoint import offline_transformers
    folder = spec.target.model["path"]
    try:
        tok = HFTokenizer(offline_transformers().AutoTokenizer.from_pretrained(folder, local_files_only=True))
    except Exception as e:   # noqa: BLE001
        raise SpecsweepError(f"model.path {folder}: transformers cannot load its tokenizer "
                             f"({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})") from None
    cls = draft_class(spec.draft.cls)
    if tok.vocab_size > spec.target.data.max_vocab and getattr(cls, "dense_vocab_rows", False):
        raise SpecsweepError(f"model.path {folder}: its tokenizer has {tok.vocab_size:,} tokens, more than "
                             f"data.max_vocab = {spec.target.data.max_vocab}: draft {spec.draft.name!r} holds a "
                             "row of the vocabulary per training position while it builds (bigram and ngram do not)")
    if hasattr(cls, "check_vocabulary") and "order" in spec.draft.options:
        try:
            cls.check_vocabulary(spec.draft.options["order"], tok.vocab_size)
        except ValueError as e:
            raise SpecsweepError(f"draft {spec.draft.name!r}: {e}") from None
    prompts = workload_prompts(spec.workload, corpus.split(spec.target.train.val_fraction)[1])
    lengths = []
    for p in prompts:
        try:
            n = len(tok.encode(p.text))
        except SpecsweepError as e:
            raise SpecsweepError(f"{p.where}: {e}") from None
        if n == 0:
            raise SpecsweepError(f"{p.where}: the checkpoint's tokenizer encodes its prompt {p.text[:40]!r} as no tokens")
        lengths.append(n)
    windows = [("the model's", spec.target.model)]
    if spec.draft.model is not None:
        windows.append((f"draft {spec.draft.name!r}'s model's", spec.draft.model.model))
    for whose, model in windows:
        check_window(WorkloadSpec(spec.workload.name, spec.workload.options, tuple(prompts)), spec.k,
                     model["block_size"], "tokens", lengths, whose)

def check_folder_models(spec: TrialSpec, corpus: Corpus) -> None:
    """Each model from a folder the trial reads (its target, a draft's model) is loaded now, as the
    trial will load it (`load_folder_target`: its weights read, the prefix test of a causal LM
    passed), and a target's tokenizer encodes the whole corpus: the training split's ids are kept
    for the trial (`train_ids_of`), the validation split is encoded once here."""
    for target in (spec.target, spec.draft.model):
        if target is not None and is_folder_model(target.model):
            loaded = load_folder_target(target)
            if target is spec.target:
                check_corpus_tokens(spec, loaded, corpus)


def check_corpus_tokens(spec: TrialSpec, target, corpus: Corpus) -> None:
    """The corpus through the target's tokenizer (training split, then validation); a char it
    cannot encode is named in one line."""
    try:
        train_ids_of(spec.target, target, corpus)
        target.tokenizer.encode(corpus.split(spec.target.train.val_fraction)[1])
    except SpecsweepError:
        bad = []
        for c in sorted(set(corpus.text)):
            try:
                target.tokenizer.encode(c)
            except SpecsweepError:
                bad.append(c)
        data = spec.target.data
        raise SpecsweepError(f"corpus {data.path or data.source}: the checkpoint's tokenizer cannot encode it "
                             f"({len(bad)} char(s) it has no token for: {''.join(bad[:10])!r}): use a corpus of the "
                             "tokenizer's chars (data.path=FILE) or a checkpoint whose tokenizer has them") from None


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable); None where unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def decode_memory_bytes(spec: TrialSpec, vocab: int) -> int:
    """A lower bound on what decoding allocates for the target at its largest, in bytes: the KV cache
    (2 x layers x batch x (block_size + tree nodes) x d_model float32) and, for a tree of N nodes,
    one pass's ancestor matrix (a list of lists, 8 bytes a cell, and a bool tensor), its mask and
    attention scores over the cache (heads x (N+1) x slots float32) and its rows (N x vocab floats as
    Python lists and a float32 tensor)."""
    m = spec.target.model
    nodes = spec.drafted_per_pass if spec.tree else 0
    slots = m["block_size"] + nodes
    cache = 2 * m["n_layer"] * spec.batch * slots * m["d_model"] * 4
    if not spec.tree:
        return cache
    width = nodes + 1
    return cache + 9 * width * width + width * slots * (1 + 4 * m["n_head"]) + nodes * vocab * (32 + 4)


def check_memory(spec: TrialSpec, vocab: int) -> None:
    """A tree or a batch whose decoding cannot fit in this machine's available memory is refused,
    with both sizes, before anything is allocated (an 8-GB request would otherwise fail after the
    target trained, or swap the machine)."""
    need, free = decode_memory_bytes(spec, vocab), available_memory()
    if free is None or need <= free:
        return
    shape = (f"verify.widths={list(spec.tree)} ({spec.drafted_per_pass:,} nodes a pass)" if spec.tree
             else f"batch={spec.batch}")
    raise SpecsweepError(f"{shape} needs at least {need / 2**30:,.1f} GiB to decode, and this machine has "
                         f"{free / 2**30:,.1f} GiB available: use a smaller "
                         f"{'tree' if spec.tree else 'batch'}")


_VERIFIED: dict[tuple, str] = {}   # (path, size, mtime) -> its sha256, verified by this process


def check_cached_checkpoints(spec: TrialSpec, corpus: Corpus) -> None:
    """A cached checkpoint of the trial's target (or of a model draft's own model) that cannot be
    read, fails its checksum or does not give its recorded loss on the check slice
    (engine/train.py: verify_target) is refused now, before the store is touched, not when the
    trial loads it. A missing one is fine: it will be copied from the shipped ones (which must be
    readable) or trained. Each file is checked once per process while it is unchanged."""
    for target in (spec.target, spec.draft.model):
        if target is None or is_folder_model(target.model):   # a folder is read where it lies, never cached
            continue
        target_key, path = target_location(corpus, target.model, target.train, target.train_seed, target.data.cache_dir)
        try:
            st = path.stat()
        except FileNotFoundError:
            check_shipped_readable(path.name)
            continue
        except OSError as e:
            raise SpecsweepError(f"checkpoint {path} cannot be read ({e.strerror or e}): make its folder readable, "
                                 "or choose another data.cache_dir") from None
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in _VERIFIED:
            _VERIFIED[key] = verify_target(path, target_key, corpus, target.train)


def check_corpus(spec: TrialSpec) -> Corpus:
    """The trial's corpus, once it is known to serve the trial (one-sentence refusals otherwise)."""
    data = spec.target.data
    corpus = load_corpus_of(data)
    where = f"corpus {data.path or data.source}"
    if is_folder_model(spec.target.model):   # its own tokenizer, not the corpus's chars (check_folder_prompt)
        check_splits(corpus, spec.target, where, "the target")
        return corpus
    chars = corpus_tokenizer(corpus).chars
    if len(chars) < 2:
        raise SpecsweepError(f"{where} has {len(chars)} distinct char(s): a model of it has nothing to predict")
    if len(chars) > data.max_vocab:
        raise SpecsweepError(f"{where} has {len(chars)} distinct chars, more than data.max_vocab = {data.max_vocab}: "
                             "use a text of fewer symbols (or raise data.max_vocab)")
    known = set(chars)
    for p in workload_prompts(spec.workload, corpus.split(spec.target.train.val_fraction)[1]):
        missing = sorted(set(p.text) - known)
        if missing:
            name = "the prompt" if p.where == "the prompt" else f"{p.where}: its prompt"
            raise SpecsweepError(f"{name} has chars {''.join(missing)!r} that {where} lacks: "
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
