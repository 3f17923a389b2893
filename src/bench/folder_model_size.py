"""A model from a folder at a real size (printed, never asserted): `make bench-folder`.

A GPT-2-small-shaped target (12 layers, width 768, 12 heads, 50,257 tokens, 1,024 positions:
124 M parameters) and a 2-layer model of the same vocabulary and width, with random weights
(timing does not depend on their values), are written as transformers checkpoints into a
temporary folder and run through the adapter of `model=hf` (src/engine/huggingface/folder_model.py), one torch
thread as in a trial, on each engine of `--engines` (eager: over transformers' DynamicCache;
compiled: torch.compile over its StaticCache of `--positions` slots, one graph per pass width,
compiled in each pass's untimed first call). Per model and engine, one row:

- params, the checkpoint's size, the load time (`load_checkpoint`: config, weights, tokenizer;
  safetensors are memory-mapped, so pages are read on first use, in the prefill before the
  timed passes), and the process's peak resident memory once its passes ran (the models are
  written by a child process, so their building is not counted; a peak, so the draft's row,
  measured second, covers both);
- t1: one-token pass over a cache of `--context` tokens, and tv(w) / t1 for verify passes of
  w = k + 1 tokens at k = 1, 2, 4, 8: the verify-cost curve (near 1: verifying k drafts costs a
  step; near w: each token costs its own pass);
- the draft's cost c = t1(draft) / t1(target) on the same engine, what one drafted token costs
  in target passes.

Each engine loads its own copy of the model (so `peak GiB` covers the engines' copies loaded so
far, and `load s` is the load of that copy). A model's passes on every engine are timed in the
same interleaved rounds (`timing.interleaved_medians`), so the engines' t1 are compared side by
side; the same cache prefix each time (the pass's entries are dropped before the next: a rewind).

    python -m src.bench.folder_model_size                      # GPT-2 small and a 2-layer draft
    python -m src.bench.folder_model_size --layers 6 --context 256 --engines eager
"""
from __future__ import annotations

import multiprocessing
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from ..engine.runtimes.engines import Engine
from ..door import ArgParser, at_least, command
from ..engine.huggingface.checkpoint import offline_transformers
from ..engine.huggingface.folder_model import load_checkpoint, rewind
from ..engine.measuring.timing import interleaved_medians

KS = (1, 2, 4, 8)


def word_tokenizer(vocab: int):
    """A tokenizer of `vocab` word-level tokens (t0, t1, ...): the checkpoint needs one to load."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return offline_transformers().PreTrainedTokenizerFast(tokenizer_object=tok)


def write_model(folder: Path, layers: int, width: int, heads: int, vocab: int, positions: int) -> Path:
    t = offline_transformers()
    config = t.GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=heads,
                          bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    t.GPT2LMHeadModel(config).save_pretrained(folder)
    word_tokenizer(vocab).save_pretrained(folder)
    return folder


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20   # Linux: KiB


@torch.no_grad()
def pass_times(models: dict, context: int, rounds: int) -> dict[tuple[str, int], float]:
    """(engine, w) -> median seconds of a pass of w tokens at position `context` over a cache of
    that many, every engine's model timed in the same rounds."""
    blocks = {}
    for name, model in models.items():
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.cfg.vocab_size, (1, context + max(KS) + 1), generator=gen)
        pos = torch.arange(ids.shape[1])
        model.setup_cache()
        model(ids[:, :context], pos[:context])

        def at(model, ids, pos, w: int):
            def run():
                model(ids[:, context:context + w], pos[context:context + w])
                if not model.static:   # a static cache is rewound by the next pass itself
                    rewind(model.cache, context)
            return run
        blocks |= {(name, w): (at(model, ids, pos, w), 3) for w in (1, *(k + 1 for k in KS))}
    return interleaved_medians(blocks, rounds)


def main(argv: list[str] | None = None) -> int:
    ap = ArgParser(prog="python -m src.bench.folder_model_size", description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=at_least(1), default=12, help="the target's layers (GPT-2 small: 12)")
    ap.add_argument("--draft-layers", type=at_least(1), default=2)
    ap.add_argument("--width", type=at_least(1), default=768)
    ap.add_argument("--heads", type=at_least(1), default=12)
    ap.add_argument("--vocab", type=at_least(2), default=50257)
    ap.add_argument("--positions", type=at_least(2), default=1024)
    ap.add_argument("--context", type=at_least(1), default=128, help="cached tokens before the timed passes")
    ap.add_argument("--rounds", type=at_least(1), default=11)
    ap.add_argument("--engines", default="eager,compiled", help="comma-separated, of eager and compiled")
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    if not engines or set(engines) - {"eager", "compiled"} or len(set(engines)) != len(engines):
        ap.error(f"--engines {args.engines!r}: a comma-separated list of eager and compiled, each once")
    if args.width % args.heads:
        ap.error(f"--width ({args.width}) must be a multiple of --heads ({args.heads})")
    if args.context + max(KS) + 1 > args.positions:
        ap.error(f"--context {args.context} + {max(KS) + 1} exceeds --positions {args.positions}")
    torch.set_num_threads(1)
    rows, t1_target = [], {}
    print(f"torch threads 1; peak resident memory before loading: {peak_rss_gib():.2f} GiB", flush=True)
    with tempfile.TemporaryDirectory(prefix="folder-model-") as tmp:
        for role, layers in (("target", args.layers), ("draft", args.draft_layers)):
            folder = Path(tmp) / role
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:   # its memory is not ours
                pool.submit(write_model, folder, layers, args.width, args.heads, args.vocab, args.positions).result()
            size = sum(p.stat().st_size for p in folder.iterdir()) / 2 ** 20
            models, loaded = {}, {}
            for name in engines:
                t0 = time.perf_counter()
                model, _ = load_checkpoint(folder)
                loaded[name] = (time.perf_counter() - t0, peak_rss_gib(), model.n_params())
                models[name] = Engine(name).wrap(model, role) if name == "compiled" else model
            times = pass_times(models, args.context, args.rounds)
            rss = peak_rss_gib()
            for name in engines:
                t1 = times[name, 1]
                t1_target.setdefault(name, t1)
                load_s, _, params = loaded[name]
                row = {"model": f"{role} ({layers} layers)", "engine": name, "params M": params / 1e6,
                       "folder MB": size, "load s": load_s, "peak GiB": rss, "t1 ms": t1 * 1e3}
                row |= {f"tv(k={k})/t1": times[name, k + 1] / t1 for k in KS}
                row["c"] = t1 / t1_target[name]
                rows.append(row)
            print(f"{role}: measured", flush=True)
            del model, models
    names = list(rows[0])
    print("| " + " | ".join(names) + " |\n|" + "---|" * len(names))
    for r in rows:
        print("| " + " | ".join(v if isinstance(v, str) else f"{v:.2f}" if v < 100 else f"{v:.0f}"
                                for v in r.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(command(main))
