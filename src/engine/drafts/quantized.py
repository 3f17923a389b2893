"""A fake-quantized copy of the target as the draft (int8 / int4 in the seed)."""
from __future__ import annotations

from ..quantize import quantized_copy
from .model_draft import ModelDraft


class QuantizedDraft(ModelDraft):
    name = "quantized"

    def __init__(self, target, train_ids, name: str | None = None, *, bits: int,
                 granularity: str, group_size: int):
        with target.cache_set_aside():  # do not deep-copy the target's cache buffers
            qmodel, self.memory = quantized_copy(target, bits, granularity, group_size)
        super().__init__(target, train_ids, name, model=qmodel)
        self.bits, self.granularity, self.group_size = bits, granularity, group_size

    def describe(self):
        return {"bits": self.bits, "granularity": self.granularity, "group_size": self.group_size,
                "float32_bytes": self.memory["float32_bytes"], "packed_bytes": self.memory["packed_bytes"]}
