"""Train the target once and cache it under a hash of everything that determines it.

Cache key = sha256 of (corpus sha256, model config, training config, seed). The checkpoint
is written atomically with a sha256 sidecar; a file lock makes concurrent workers on a
fresh machine train it once: the first takes the lock and trains, the others wait and load.

Shipped targets: a checkpoint in `SHIPPED` (src/engine/models/weights/, in git: the default target,
so a fresh clone answers in minutes instead of training for 10-25) is the cache's first
source for its key. It is copied into the cache only if it is what it claims: its sha256 is the
one `SHIPPED_TARGETS` records here, in tracked source (a hash beside the file guards nothing
against an edit of both), its recipe (`weights/recipe.json`: key, sha256, corpus sha256, model,
training, seed, validation loss) agrees with that record, and its loss on the check slice is
the recorded one; a file that is not is skipped with a warning and the target is trained. The
same key means the same corpus, config and seed, so the shipped file is what training here
would make, up to the float differences of another CPU: `make retrain-default` retrains it and
compares (src/bench/retrain.py).

Every load checks the weights against their record: the loss on the check slice (the first
CHECK_WINDOWS context windows of the validation split, about 100 ms for the default target) is
recomputed and must be the recorded one within CHECK_TOL (`check_recorded_loss`); a checkpoint
trained here records its own (`check_loss`), a shipped one's is in SHIPPED_TARGETS.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..atomic import atomic_path, file_sha256, seal
from ..errors import SpecsweepError, unreadable
from ..locks import TRAINING_WAIT_S, file_lock
from .model import ModelConfig, Transformer
from .tokenizer import CharTokenizer

log = logging.getLogger(__name__)

SHIPPED = Path(__file__).parent / "weights"   # checkpoints shipped in git, and their recipe.json

# key -> what the shipped checkpoint of that key is: its file's sha256, its validation loss (the
# recipe's and the checkpoint's) and its loss on the check slice. Here, in tracked source, and not
# only beside the file; `make retrain-default ARGS=--ship` prints the entry of a newly shipped one,
# and tests/tools/test_shipped_target.py checks that the shipped file matches it.
SHIPPED_TARGETS = {
    "72c784af11a8347d": {"sha256": "837192751c920d908fbc6f31e9e40ebb83438ddaa41dac0221df00a67b5fcd14",
                         "val_loss": 1.5115421613862243, "check_loss": 1.5022251605987549},
}
CHECK_WINDOWS = 8   # the check slice: the first 8 context windows of the validation split (2,048 chars, default target)
CHECK_TOL = 1e-3    # nats/char: the same weights give the same loss on the slice up to float32 rounding (1e-7
# between batch shapes, measured), on any CPU; damaged weights move it by far more (random ones: about +2.9)


@dataclass(frozen=True)
class TrainConfig:
    """The training schedule; the values come from conf/train/ (no defaults here: one source each)."""
    steps: int
    batch_size: int
    lr: float
    min_lr: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    eval_interval: int
    eval_batches: int
    val_fraction: float    # the last val_fraction of the corpus validates


@dataclass
class TrainedTarget:
    model: Transformer
    tokenizer: CharTokenizer
    key: str  # the cache key: identifies this target in every trial record
    val_loss: float
    path: Path
    sha256: str = ""  # of the checkpoint bytes it was loaded from (verified against the sidecar)


def cache_key(corpus_sha: str, model_cfg: dict, train_cfg: TrainConfig, seed: int) -> str:
    blob = json.dumps({"corpus": corpus_sha, "model": model_cfg, "train": asdict(train_cfg),
                       "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def random_windows(ids: torch.Tensor, block: int, batch: int, gen: torch.Generator):
    # random (batch, block) input windows and their next-char targets
    starts = torch.randint(0, len(ids) - block - 1, (batch,), generator=gen)
    x = torch.stack([ids[s:s + block] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + block + 1] for s in starts.tolist()])
    return x, y


@torch.no_grad()
def evaluate(model: Transformer, ids: torch.Tensor, block: int, batch: int = 32) -> float:
    """Mean next-char loss (nats/char) over all non-overlapping windows of `ids`."""
    n_win = (len(ids) - 1) // block
    if n_win == 0:
        raise SpecsweepError(f"validation split ({len(ids)} chars) is shorter than one window ({block})")
    x_all = ids[: n_win * block].view(n_win, block)
    y_all = ids[1: n_win * block + 1].view(n_win, block)
    total = 0.0
    model.eval()
    with model.cache_set_aside():
        for i in range(0, n_win, batch):
            logits = model(x_all[i:i + batch])
            total += F.cross_entropy(logits.flatten(0, 1), y_all[i:i + batch].flatten(), reduction="sum").item()
    return total / (n_win * block)


def _lr(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * frac))


def train(model: Transformer, train_ids, val_ids, cfg: TrainConfig, seed: int, progress: bool = True):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    block = model.cfg.block_size
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.99))
    bar = tqdm(range(cfg.steps), desc="training target", disable=not progress, mininterval=2.0)
    for step in bar:
        model.train()
        for g in opt.param_groups:
            g["lr"] = _lr(step, cfg)
        x, y = random_windows(train_ids, block, cfg.batch_size, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        if (step + 1) % cfg.eval_interval == 0 or step + 1 == cfg.steps:
            eval_gen = torch.Generator().manual_seed(seed + 1)  # same windows at every eval
            model.eval()
            with torch.no_grad():
                vl = sum(F.cross_entropy(model(xv).flatten(0, 1), yv.flatten()).item()
                         for xv, yv in (random_windows(val_ids, block, cfg.batch_size, eval_gen)
                                        for _ in range(cfg.eval_batches))) / cfg.eval_batches
            bar.set_postfix(train=f"{loss.item():.3f}", val=f"{vl:.3f}")
            log.info("step %d/%d  train loss %.4f  val loss (sampled) %.4f", step + 1, cfg.steps, loss.item(), vl)
    model.eval()
    return model


def save_checkpoint(path: Path, payload: dict) -> None:
    """Checkpoint and its sha256 sidecar, each written atomically (sidecar last: atomic.seal)."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)
    seal(path)


def verify_checkpoint(path: Path) -> str:
    """The checkpoint's sha256, after checking it against its sidecar."""
    sidecar = path.with_name(path.name + ".sha256")
    if not sidecar.is_file():
        raise SpecsweepError(f"checkpoint {path} has no checksum file; delete it to retrain")
    try:
        digest, recorded = file_sha256(path), sidecar.read_text().strip()
    except OSError as e:
        raise SpecsweepError(f"checkpoint {path} cannot be read ({e.strerror or e}): make it and its .sha256 readable, "
                             "or delete them to retrain") from None
    if digest != recorded:
        raise SpecsweepError(f"checkpoint {path} fails its checksum (truncated or tampered); delete it to retrain")
    return digest


def check_loss(model: Transformer, tok: CharTokenizer, corpus, train_cfg: TrainConfig) -> float:
    """The mean next-char loss (nats/char) on the check slice: the first CHECK_WINDOWS context
    windows of the validation split (as many as it holds), one batch as `evaluate` runs it."""
    block = model.cfg.block_size
    _, val_text = corpus.split(train_cfg.val_fraction)
    return evaluate(model, tok.encode(val_text[: CHECK_WINDOWS * block + 1]), block)


def recorded_check_loss(key: str, digest: str, ckpt: dict) -> float | None:
    """The check-slice loss a checkpoint's weights must give: its own record (trained here), else
    the shipped record of its key when its bytes are the shipped ones; None for a checkpoint
    written before check losses were recorded."""
    if "check_loss" in ckpt:
        return float(ckpt["check_loss"])
    known = SHIPPED_TARGETS.get(key)
    return known["check_loss"] if known is not None and known["sha256"] == digest else None


def check_recorded_loss(path: Path, key: str, digest: str, ckpt: dict, model: Transformer, tok: CharTokenizer,
                        corpus, train_cfg: TrainConfig) -> None:
    """Refuse weights that do not give their recorded loss on the check slice (edited or damaged,
    whatever their checksum says); a checkpoint with no record, or a shipped key's with other bytes
    and no record, is refused too: it cannot be told from a damaged one."""
    recorded = recorded_check_loss(key, digest, ckpt)
    if recorded is None:
        if key in SHIPPED_TARGETS:
            raise SpecsweepError(f"checkpoint {path} has target {key}'s key but neither the shipped bytes nor a "
                                 "recorded check loss: delete it (and its .sha256) to use the shipped one")
        return   # trained before check losses were recorded: its checksum is all there is
    got = check_loss(model, tok, corpus, train_cfg)
    if not abs(got - recorded) <= CHECK_TOL:
        raise SpecsweepError(f"checkpoint {path}: its loss on the check slice is {got:.4f} nats/char, its record says "
                             f"{recorded:.4f} (tolerance {CHECK_TOL:g}): damaged or edited; delete it (and its .sha256) "
                             "to retrain")


def verify_target(path: Path, key: str, corpus, train_cfg: TrainConfig) -> str:
    """A cached checkpoint checked as a load checks it, without keeping the model: its sidecar's
    sha256 and its recorded loss on the check slice (`check_recorded_loss`). Returns its sha256."""
    digest = verify_checkpoint(path)
    ckpt = read_checkpoint(path)
    model, tok = model_from_checkpoint(ckpt)
    check_recorded_loss(path, key, digest, ckpt, model, tok, corpus, train_cfg)
    return digest


def check_shipped_readable(name: str, folder: Path = SHIPPED) -> None:
    """The shipped checkpoint `name` that a missing cache entry would be copied from can be read: an
    unreadable one is refused in one line rather than trained instead (10-25 minutes)."""
    src = folder / name
    why = unreadable(src) if src.exists() else None
    if why:
        raise SpecsweepError(f"the shipped target {src} cannot be read ({why}): make it readable "
                             "(or restore it: git checkout -- src/engine/models/weights)")


def read_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a file that matches its checksum but still does not load
        raise SpecsweepError(f"checkpoint {path} cannot be read ({type(e).__name__}); delete it to retrain") from None


def model_from_checkpoint(ckpt: dict) -> tuple[Transformer, CharTokenizer]:
    model = Transformer(ModelConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    return model, CharTokenizer(ckpt["vocab"])


# corpus sha256 -> its sorted characters: a corpus's vocabulary is read once per process
# (a 5 MB text takes tens of ms), however many trials ask for its target
_VOCABULARIES: dict[str, list[str]] = {}


def corpus_tokenizer(corpus) -> CharTokenizer:
    chars = _VOCABULARIES.get(corpus.sha256)
    if chars is None:
        chars = _VOCABULARIES[corpus.sha256] = CharTokenizer.from_text(corpus.text).chars
    return CharTokenizer(chars)


def _target_spec(corpus, model_kwargs: dict, train_cfg: TrainConfig, seed: int, cache_dir: str | Path):
    tok = corpus_tokenizer(corpus)
    mcfg = ModelConfig(vocab_size=tok.vocab_size, **model_kwargs)
    key = cache_key(corpus.sha256, asdict(mcfg), train_cfg, seed)
    return tok, mcfg, key, Path(cache_dir) / "models" / f"target-{key}.pt"


def target_location(corpus, model_kwargs: dict, train_cfg: TrainConfig, seed: int,
                    cache_dir: str | Path) -> tuple[str, Path]:
    """(cache key, checkpoint path) of the target for this (corpus, config, seed): no training."""
    _, _, key, path = _target_spec(corpus, model_kwargs, train_cfg, seed, cache_dir)
    return key, path


@contextmanager
def all_cores():
    """Training runs on every core, whatever thread cap the caller's trials use; at most
    SPECSWEEP_TRAIN_THREADS of them where that is set (the tests set 1: each of their workers trains
    on a core of its own, instead of two workers' threads taking turns on both)."""
    before = torch.get_num_threads()
    torch.set_num_threads(training_threads())
    try:
        yield
    finally:
        torch.set_num_threads(before)


def training_threads() -> int:
    """The threads training uses: every core, or SPECSWEEP_TRAIN_THREADS (an integer >= 1) if fewer."""
    cores = os.cpu_count() or 1
    cap = os.environ.get("SPECSWEEP_TRAIN_THREADS", "").strip()
    return min(cores, int(cap)) if cap.isdigit() and int(cap) >= 1 else cores


def recipe(key: str, corpus_sha: str, model_cfg: dict, train_cfg: TrainConfig, seed: int, ckpt: dict,
           sha256: str) -> dict:
    """What a shipped checkpoint records about itself (one entry of weights/recipe.json)."""
    return {"key": key, "sha256": sha256, "corpus_sha256": corpus_sha, "model": model_cfg,
            "train": asdict(train_cfg), "seed": seed, "val_loss": float(ckpt["val_loss"]),
            "check_loss": float(ckpt["check_loss"]),
            "train_seconds": round(float(ckpt["train_seconds"]), 1), "n_params": int(ckpt["n_params"])}


def shipped_entry(entry: dict) -> str:
    """The SHIPPED_TARGETS line (src/engine/models/train.py) of a shipped checkpoint's recipe `entry`."""
    return (f'"{entry["key"]}": {{"sha256": "{entry["sha256"]}", "val_loss": {entry["val_loss"]!r}, '
            f'"check_loss": {entry["check_loss"]!r}}},')


def shipped_recipes(folder: Path = SHIPPED) -> dict[str, dict]:
    """key -> recipe of the checkpoints shipped in `folder` ({} without a recipe file)."""
    try:
        return {r["key"]: r for r in json.loads((folder / "recipe.json").read_text())}
    except FileNotFoundError:
        return {}


def shipped_problem(key: str, src: Path, entry: dict, corpus, train_cfg: TrainConfig) -> str | None:
    """Why the shipped file `src` of `key` (recipe `entry`) is not what SHIPPED_TARGETS says it is,
    in a few words; None when it is: the recorded sha256, a recipe that agrees with the record, the
    recorded validation loss in the checkpoint, the recorded loss on the check slice."""
    known = SHIPPED_TARGETS.get(key)
    if known is None:
        return "its key is not in SHIPPED_TARGETS (src/engine/models/train.py)"
    try:
        digest = file_sha256(src)
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    if digest != known["sha256"]:
        return "it fails its checksum (its sha256 is not the one src/engine/models/train.py records)"
    if entry.get("sha256") != known["sha256"] or entry.get("val_loss") != known["val_loss"]:
        return "recipe.json disagrees with src/engine/models/train.py (sha256 or val_loss)"
    ckpt = read_checkpoint(src)
    if ckpt["val_loss"] != known["val_loss"]:
        return f"its checkpoint records validation loss {ckpt['val_loss']:.4f}, src/engine/models/train.py {known['val_loss']:.4f}"
    model, tok = model_from_checkpoint(ckpt)
    got = check_loss(model, tok, corpus, train_cfg)
    if not abs(got - known["check_loss"]) <= CHECK_TOL:
        return f"its loss on the check slice is {got:.4f} nats/char, recorded {known['check_loss']:.4f}"
    return None


def copy_shipped(key: str, path: Path, folder: Path | None, corpus, train_cfg: TrainConfig) -> bool:
    """Copy the shipped checkpoint of `key` to the cache `path` (sealed); False if none is
    shipped, or the shipped file is not what it claims (`shipped_problem`: a warning, and the
    target is trained instead)."""
    if folder is None:
        return False
    src = folder / path.name
    entry = shipped_recipes(folder).get(key)
    if entry is None or not src.is_file():
        return False
    problem = shipped_problem(key, src, entry, corpus, train_cfg)
    if problem:
        log.warning("the shipped target %s (%s) is not what it claims: %s; training it instead", key, src, problem)
        return False
    with atomic_path(path) as tmp:
        shutil.copyfile(src, tmp)
    seal(path)
    log.info("target %s: the shipped checkpoint (validation loss %.4f nats/char; `make retrain-default` "
             "retrains and compares)", key, SHIPPED_TARGETS[key]["val_loss"])
    return True


def get_target(corpus, model_kwargs: dict, train_cfg: TrainConfig, seed: int, cache_dir: str | Path,
               progress: bool = True, train_if_missing: bool = True, shipped: Path | None = SHIPPED) -> TrainedTarget:
    """Load the cached target for this (corpus, config, seed); a missing one is copied from
    `shipped` if it holds that key (None: never), else trained (with every core).
    train_if_missing=False refuses to train: a sweep's worker gets its target from the tracking
    server instead, so the same key always means the same bytes."""
    tok, mcfg, key, path = _target_spec(corpus, model_kwargs, train_cfg, seed, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fresh = False   # copied (and checked) or trained by this call: its loss on the check slice is known good
    with file_lock(str(path) + ".lock", f"target {key} (another process may be training it)", TRAINING_WAIT_S):
        if not path.is_file() and train_if_missing and copy_shipped(key, path, shipped, corpus, train_cfg):
            fresh = True
        elif not path.is_file():
            fresh = True
            if not train_if_missing:
                raise SpecsweepError(f"target {key} is not in the cache {path.parent} and this process may not train it")
            train_text, val_text = corpus.split(train_cfg.val_fraction)
            train_ids, val_ids = tok.encode(train_text), tok.encode(val_text)
            if len(train_ids) <= mcfg.block_size + 1 or len(val_ids) <= mcfg.block_size + 1:
                raise SpecsweepError(f"corpus too small ({len(corpus.text)} chars) for a context window of "
                                     f"{mcfg.block_size}; use a larger text or a smaller model.block_size")
            torch.manual_seed(seed)
            model = Transformer(mcfg)
            log.info("training target %s (%d params, a vocabulary of %d chars) on %d chars, %d threads", key,
                     model.n_params(), tok.vocab_size, len(train_ids), os.cpu_count() or 1)
            t0 = time.perf_counter()
            with all_cores():
                train(model, train_ids, val_ids, train_cfg, seed, progress)
                val_loss = evaluate(model, val_ids, mcfg.block_size)
            secs = time.perf_counter() - t0
            log.info("trained target %s in %.0f s: validation loss %.4f nats/char", key, secs, val_loss)
            save_checkpoint(path, {"model_config": asdict(mcfg), "state_dict": model.state_dict(),
                                   "vocab": tok.chars, "val_loss": val_loss, "train_seconds": secs,
                                   "n_params": model.n_params(),
                                   "check_loss": check_loss(model, tok, corpus, train_cfg)})
    digest = verify_checkpoint(path)
    ckpt = read_checkpoint(path)
    model, tok = model_from_checkpoint(ckpt)
    if not fresh:
        check_recorded_loss(path, key, digest, ckpt, model, tok, corpus, train_cfg)
    return TrainedTarget(model, tok, key, float(ckpt["val_loss"]), path, digest)
