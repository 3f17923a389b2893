"""The machine's limit for one target pass: the arithmetic and the bytes it cannot avoid.

Counted from the model's shape, for one sequence and a pass of `width` input positions over a
KV cache of `slots` slots (the model attends over every slot of its cache, a mask hiding the
ones a query may not see, so the attention work grows with the cache, not with the text):

    flops  per layer: 2 w d (3 d)  q, k, v         2 w d d  output projection
                      2 w d (4 d) 2  the MLP         2 w S d  scores + 2 w S d  weighted values
           the head:  2 w d V
    bytes  every weight once (float32), the cache's keys and values read once (2 L S d floats),
           the new keys and values written (2 L w d floats), the logits written (w V floats)

(LayerNorms, GELU, softmax and embeddings are left out: a few w d per layer, under 1% here.)
A pass can take no less than max(flops / peak FLOP/s, bytes / bandwidth): the machine's bound.
`measure_machine` times the two rates on this machine, one thread (a 1024^3 float32 GEMM, a
64 MB copy); src/bench/roofline.py sets each engine's measured pass beside the bound.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

FLOAT = 4  # bytes of a float32


@dataclass(frozen=True)
class PassCost:
    width: int
    flops: float
    bytes: float


def pass_cost(vocab_size: int, d_model: int, n_layer: int, slots: int, width: int) -> PassCost:
    """FLOPs and bytes of one pass of `width` positions over `slots` cache slots."""
    w, d, S, L, V = width, d_model, slots, n_layer, vocab_size
    per_layer = 2 * w * d * 3 * d + 2 * w * d * d + 2 * 2 * w * d * 4 * d + 2 * 2 * w * S * d
    flops = L * per_layer + 2 * w * d * V
    weights = L * (3 * d * d + d * d + 8 * d * d) + V * d      # the Linear layers, float32
    moved = weights + 2 * L * S * d + 2 * L * w * d + w * V     # + the cache read, its new slots, the logits
    return PassCost(width, float(flops), float(moved * FLOAT))


@dataclass(frozen=True)
class Machine:
    flops_per_s: float      # single-thread float32 GEMM throughput
    bytes_per_s: float      # copy bandwidth (bytes read + written per second)

    def bound_s(self, cost: PassCost) -> float:
        return max(cost.flops / self.flops_per_s, cost.bytes / self.bytes_per_s)


def _best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_machine(n: int = 1024, copy_mb: int = 64, repeats: int = 5) -> Machine:
    """This machine's rates, on the threads torch is set to (the trials use one): the best of
    `repeats` runs of an n^3 float32 matmul and of a `copy_mb` MB tensor copy."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    gemm = _best_of(lambda: torch.mm(a, b, out=out), repeats)
    src = torch.empty(copy_mb * (1 << 20) // FLOAT)
    dst = torch.empty_like(src)
    copy = _best_of(lambda: dst.copy_(src), repeats)
    return Machine(2.0 * n ** 3 / gemm, 2.0 * src.numel() * FLOAT / copy)
