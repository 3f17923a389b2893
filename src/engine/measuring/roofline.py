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
`measure_machine` times the rates on this machine, one thread: a 1024^3 float32 GEMM, a copy the
size of a pass's bytes (the weights and the cache stay in cache from one pass to the next, so this
is the bandwidth a pass sees) and a 64 MB copy (from memory, reported beside it);
src/bench/machine_limit.py sets each engine's measured pass beside the bound.
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
    bytes_per_s: float      # copy bandwidth of a working set the size of a pass's (in cache here)
    memory_bytes_per_s: float  # copy bandwidth of a 64 MB working set (from memory)

    def compute_s(self, cost: PassCost) -> float:
        return cost.flops / self.flops_per_s

    def bound_s(self, cost: PassCost) -> float:
        """The pass's lower bound: its arithmetic at the GEMM rate, or its bytes at the bandwidth of
        a working set of its size (the weights and the cache stay in cache between passes)."""
        return max(self.compute_s(cost), cost.bytes / self.bytes_per_s)


def _best_of(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_rate(nbytes: int, repeats: int) -> float:
    """Bytes read and written per second copying a tensor of `nbytes` (best of `repeats`)."""
    src = torch.empty(max(1, nbytes // FLOAT))
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * FLOAT / _best_of(lambda: dst.copy_(src), repeats)


def measure_machine(pass_bytes: float, n: int = 1024, memory_mb: int = 64, repeats: int = 7) -> Machine:
    """This machine's rates, on the threads torch is set to (the trials use one): the best of
    `repeats` runs of an n^3 float32 matmul, of a copy of `pass_bytes` and of a `memory_mb` MB copy."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    gemm = _best_of(lambda: torch.mm(a, b, out=out), repeats)
    return Machine(2.0 * n ** 3 / gemm, copy_rate(int(pass_bytes), repeats * 3),
                   copy_rate(memory_mb * (1 << 20), repeats))
