"""A fake-quantized copy of the target as the draft (int8 / int4 in the seed)."""
from __future__ import annotations

from ..models.quantize import quantized_copy
from .model_draft import ModelDraft


class QuantizedDraft(ModelDraft):
    name = "quantized"

    @classmethod
    def check_options(cls, *, bits, granularity, group_size, **_) -> None:
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
            raise ValueError(f"bits must be an integer in 2..16, got {bits!r}")
        if granularity not in ("tensor", "channel", "group"):
            raise ValueError(f"granularity must be tensor, channel or group, got {granularity!r}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")

    def __init__(self, target, train_ids, name: str | None = None, *, bits: int,
                 granularity: str, group_size: int):
        self.check_options(bits=bits, granularity=granularity, group_size=group_size)
        with target.cache_set_aside():  # do not deep-copy the target's cache buffers
            qmodel, self.memory = quantized_copy(target, bits, granularity, group_size)
        super().__init__(target, train_ids, name, model=qmodel)
        self.bits, self.granularity, self.group_size = bits, granularity, group_size

    def describe(self):
        return {"bits": self.bits, "granularity": self.granularity, "group_size": self.group_size,
                "float32_bytes": self.memory["float32_bytes"], "packed_bytes": self.memory["packed_bytes"]}
