"""Fake quantization, as in the seed: weights rounded to a b-bit symmetric grid, kept float32.

The matmuls stay float32, so a fake-quantized copy costs exactly as much time as the target:
it saves memory (reported below), not time.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn


def fake_quantize(w: torch.Tensor, bits: int, granularity: str = "channel", group_size: int = 32):
    """Round a 2-D weight (out, in) to `bits`-bit symmetric integers times a float scale.

    granularity: 'tensor' (one scale), 'channel' (one per output row), or 'group' (one per
    `group_size` consecutive inputs of each row). Returns (dequantized weight, scales); every
    element then satisfies |w - w_dq| <= scale / 2.
    """
    if bits < 2 or bits > 16:
        raise ValueError(f"bits must be in 2..16, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    out_f, in_f = w.shape
    if granularity == "tensor":
        view = w.reshape(1, 1, -1)
    elif granularity == "channel":
        view = w.reshape(out_f, 1, in_f)
    elif granularity == "group":
        if in_f % group_size:
            raise ValueError(f"group_size {group_size} does not divide the input width {in_f}")
        view = w.reshape(out_f, in_f // group_size, group_size)
    else:
        raise ValueError(f"granularity must be tensor, channel or group, got {granularity!r}")
    scale = view.abs().amax(-1, keepdim=True).clamp_min(1e-12) / qmax  # (rows, groups, 1)
    w_dq = (view / scale).round().clamp(-qmax, qmax) * scale
    return w_dq.reshape(out_f, in_f), scale.reshape(-1)


def quantized_copy(model: nn.Module, bits: int, granularity: str = "channel", group_size: int = 32):
    """A deep copy of `model` with every Linear and Embedding weight fake-quantized.

    Returns (copy, report) where report has float32 bytes of the target and packed bytes
    (ints at `bits` bits + float32 scales; LayerNorm parameters stay float32) of the copy.
    """
    qmodel = copy.deepcopy(model)
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    packed_bits = 0
    quantized = set()
    for mod in qmodel.modules():
        if isinstance(mod, (nn.Linear, nn.Embedding)):
            w_dq, scales = fake_quantize(mod.weight.data, bits, granularity, group_size)
            mod.weight.data.copy_(w_dq)
            packed_bits += mod.weight.numel() * bits + scales.numel() * 32
            quantized.add(id(mod.weight))
    packed_bits += sum(p.numel() * 32 for p in qmodel.parameters() if id(p) not in quantized)
    return qmodel, {"float32_bytes": float_bytes, "packed_bytes": packed_bits // 8}
