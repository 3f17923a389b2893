"""Real int8 matmuls on the CPU: a copy of the target whose nn.Linear layers run fbgemm's kernels.

Each Linear becomes an `Int8Linear`: weights qint8 per output channel, packed once for the
quantized engine (x86 or fbgemm: both run fbgemm's u8 x s8 -> s32 GEMM); inputs quantized to
uint8 with a FIXED scale and zero point per layer, calibrated once on training text; float32
out (`quantized::linear_with_input_q_dq_qweight_dq_output_fp32`). Embeddings, LayerNorm and
attention stay float32.

Why fixed input scales rather than dynamic ones (`torch.ao.quantization.quantize_dynamic`): a
dynamic linear takes one scale from the min and max of its whole input, so a row's result
depends on the other rows fed with it. The draft's `propose` feeds one or two chars per call,
while its `probs` (what the exactness tests drive) scores a (B, T) batch at once; with dynamic
scales the two would give different q, and the tests must see the q the draft sampled from.
With a fixed scale every row is quantized by itself and accumulated in int32, exactly,
whatever the batch.

Inputs use 7 bits (0..127, as the ao observers' `reduce_range` for x86): fbgemm's AVX2 kernel
adds pairs of u8 x s8 products in int16, which 8-bit inputs could saturate.
"""
from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager

import torch
import torch.nn as nn

INPUT_QMAX = 127    # 7-bit inputs: no int16 saturation in fbgemm's AVX2 pairs
WEIGHT_QMAX = 127   # symmetric int8 weights, one scale per output channel
ENGINES = ("x86", "fbgemm")  # the engines whose packed weights implement the fp32-output op


@contextmanager
def quantized_engine(engine: str):
    """Pack weights for `engine`, then restore the process's engine setting."""
    usable = [e for e in ENGINES if e in torch.backends.quantized.supported_engines]
    if engine not in usable:
        raise ValueError(f"engine must be one of {', '.join(usable) or 'x86, fbgemm (neither is in this torch build)'},"
                         f" got {engine!r}")
    saved = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = saved


def input_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Affine uint8 parameters covering [min(lo, 0), max(hi, 0)] with INPUT_QMAX steps, zero
    exactly representable (as the ao MinMaxObserver computes them): (scale, zero point)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max((hi - lo) / INPUT_QMAX, 1e-8)
    zero_point = int(min(max(round(-lo / scale), 0), INPUT_QMAX))
    return scale, zero_point


class Int8Linear(nn.Module):
    """A Linear whose matmul is fbgemm's int8 GEMM. x (..., in) -> (..., out) float32."""

    def __init__(self, linear: nn.Linear, lo: float, hi: float):
        super().__init__()
        w = linear.weight.detach().float()                                   # (out, in)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scales = w.abs().amax(1).clamp_min(1e-12) / WEIGHT_QMAX              # (out,)
        bias = None if linear.bias is None else linear.bias.detach().float()
        with warnings.catch_warnings():
            # torch 2.13 marks quantized tensor creation deprecated (torchao replaces it), yet
            # the fbgemm kernels still take their weights only this way; silence that warning.
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*deprecated",
                                    category=UserWarning)
            wq = torch.quantize_per_channel(w, scales.double(), torch.zeros_like(scales, dtype=torch.long),
                                            0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(wq, bias)
        self.x_scale, self.x_zero_point = input_qparams(lo, hi)
        # inputs outside the calibrated range are clipped to it, as quantization would, but
        # before the kernel: codes above INPUT_QMAX could saturate its int16 pair sums
        self.x_lo = -self.x_zero_point * self.x_scale
        self.x_hi = (INPUT_QMAX - self.x_zero_point) * self.x_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).clamp(self.x_lo, self.x_hi)   # (N, in)
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            rows, self.x_scale, self.x_zero_point, self.packed)              # (N, out)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, x_scale={self.x_scale:.4g}, x_zp={self.x_zero_point}"


@torch.no_grad()
def input_ranges(model: nn.Module, windows: torch.Tensor) -> dict[str, tuple[float, float]]:
    """Min and max of every Linear's input over a float forward of `windows` (B, T) ids."""
    ranges: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            def record(_mod, args, _out, name=name):
                x = args[0]
                ranges[name] = (float(x.min()), float(x.max()))
            hooks.append(mod.register_forward_hook(record))
    try:
        model(windows)
    finally:
        for h in hooks:
            h.remove()
    return ranges


def calibration_windows(train_ids: torch.Tensor, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """(n, length) windows of the training ids at random starts (a fixed generator); shorter
    than `length` when the training text is."""
    if n < 1:
        raise ValueError(f"calibration_windows must be >= 1, got {n}")
    length = min(length, len(train_ids) - 1)
    if length < 1:
        raise ValueError(f"calibration needs at least 2 training chars, got {len(train_ids)}")
    starts = torch.randint(0, len(train_ids) - length, (n,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([train_ids[s:s + length] for s in starts.tolist()])


def conv1d_as_linear(model: nn.Module) -> int:
    """Replace, in place, every transformers `Conv1D` (GPT-2's projections: x @ W + b with W of shape
    (in, out)) by the nn.Linear computing the same (weight W transposed), so a model from a folder
    (model=hf) gets int8 kernels there too. Returns how many were replaced."""
    done = 0
    for mod in list(model.modules()):
        for name, child in list(mod.named_children()):
            if type(child).__name__ == "Conv1D" and hasattr(child, "nf") and child.weight.dim() == 2:
                lin = nn.Linear(child.weight.shape[0], child.weight.shape[1], bias=child.bias is not None)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.T)
                    if child.bias is not None:
                        lin.bias.copy_(child.bias)
                setattr(mod, name, lin)
                done += 1
    return done


def int8_kernel_copy(model: nn.Module, windows: torch.Tensor, engine: str = "x86"):
    """A deep copy of `model` with every Linear (and transformers' Conv1D: `conv1d_as_linear`) an
    `Int8Linear`, its input range calibrated on
    a float forward of `windows` (B, T). Returns (copy, report): report has the float32 bytes
    of `model` and the packed bytes of the copy (int8 weights + one float32 scale per output
    channel of each Linear; every other parameter float32)."""
    qmodel = copy.deepcopy(model).eval()
    conv1d_as_linear(qmodel)
    ranges = input_ranges(qmodel, windows)
    float_bytes = sum(p.numel() * 4 for p in model.parameters())
    packed = 0
    with quantized_engine(engine):
        for name, mod in list(qmodel.named_modules()):
            for child_name, child in list(mod.named_children()):
                if isinstance(child, nn.Linear):
                    full = f"{name}.{child_name}" if name else child_name
                    setattr(mod, child_name, Int8Linear(child, *ranges[full]))
                    bias = 0 if child.bias is None else child.bias.numel()
                    packed += child.weight.numel() + 4 * (child.out_features + bias)  # int8s, f32 scales, f32 bias
    packed += sum(p.numel() * 4 for p in qmodel.parameters())  # what is left: embeddings, LayerNorm
    n_linear = sum(isinstance(m, Int8Linear) for m in qmodel.modules())
    return qmodel, {"float32_bytes": float_bytes, "packed_bytes": packed, "int8_linears": n_linear, "engine": engine}
