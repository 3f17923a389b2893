"""A copy of the target whose Linear layers run real int8 kernels (fbgemm), beside the
fake-quantized `int8` draft whose matmuls stay float32: does a real kernel make it cheap?

Its `propose` (cached, one or two chars per call) and `probs` (a full (B, T) forward) run the
same int8 model; since every Linear quantizes each row with a fixed scale (see
src/engine/models/int8_linear.py), a row's q does not depend on what it is batched with.
"""
from __future__ import annotations

import torch

from ..models import int8_linear
from .model_draft import ModelDraft


class Int8KernelDraft(ModelDraft):
    name = "int8_kernels"
    library = None   # its packed int8 Linear layers have no GPT-2 counterpart in transformers
    folder_targets = True   # a model from a folder (model=hf) is copied the same way: its Linear layers

    @classmethod
    def check_options(cls, *, engine, calibration_windows, **_) -> None:
        usable = [e for e in int8_linear.ENGINES if e in torch.backends.quantized.supported_engines]
        if engine not in usable:
            raise ValueError(f"engine must be one of {', '.join(usable) or 'x86, fbgemm (neither is in this torch build)'},"
                             f" got {engine!r}")
        if isinstance(calibration_windows, bool) or not isinstance(calibration_windows, int) or calibration_windows < 1:
            raise ValueError(f"calibration_windows must be >= 1, got {calibration_windows!r}")

    def __init__(self, target, train_ids, name: str | None = None, *, engine: str,
                 calibration_windows: int):
        """engine: the quantized engine the weights are packed for (x86 or fbgemm).
        calibration_windows: how many training windows of the target's context length (at most
        256 tokens) a float forward runs over to set each Linear's input range."""
        self.check_options(engine=engine, calibration_windows=calibration_windows)
        windows = int8_linear.calibration_windows(train_ids, calibration_windows, min(target.cfg.block_size, 256))
        with target.cache_set_aside():  # do not deep-copy the target's cache buffers
            qmodel, self.memory = int8_linear.int8_kernel_copy(target, windows, engine)
        super().__init__(target, train_ids, name, model=qmodel)
        self.engine, self.calibration_windows = engine, calibration_windows

    def describe(self):
        return {"engine": self.engine, "int8_linears": self.memory["int8_linears"],
                "calibration_windows": self.calibration_windows,
                "float32_bytes": self.memory["float32_bytes"], "packed_bytes": self.memory["packed_bytes"]}
