"""Memory held (src/engine/measuring/memory.py): each storage counted once, what the target holds left out
of the draft's count, and a trial's target counted as its weights, mask and KV cache."""
from __future__ import annotations

import numpy as np
import torch

from src.engine.measuring.memory import held_bytes
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg


class Holder:
    """A draft-like object of this package (memory walks objects of src/): a model, a table, views."""
    __module__ = "src.engine.drafts.planted"

    def __init__(self, target):
        self.target = target                                        # the target's: not the draft's
        self.model = torch.nn.Linear(10, 10, bias=False)            # 400 bytes
        self.model.register_buffer("scale", torch.zeros(5, dtype=torch.float64))   # 40 bytes
        table = torch.zeros(64, dtype=torch.float64)                # 512 bytes
        self.tables = {"codes": table, "codes_np": table.numpy(), "copy": [table[:8]]}   # views of it: once
        self.array = np.zeros((4, 4), dtype=np.int32)               # 64 bytes
        self.array_view = self.array[1:]                            # a view: once
        self.rows = [[0.1, 0.2], [0.3]]                             # Python numbers: not counted


def test_each_storage_is_counted_once_and_the_target_is_left_out():
    target = torch.nn.Linear(100, 100)
    holder = Holder(target)
    assert held_bytes(holder, exclude=target) == 400 + 40 + 512 + 64
    assert held_bytes(holder) == 400 + 40 + 512 + 64 + (100 * 100 + 100) * 4
    assert held_bytes(target) == (100 * 100 + 100) * 4


def test_a_trial_logs_its_target_as_weights_mask_and_cache(tiny):
    cfg, corpus, target = tiny
    spec = trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=int8", "k=2", "timing.lock=false"))
    m = run_trial(spec, progress=False, loaded=(corpus, target)).metrics
    c = target.model.cfg
    weights = sum(p.numel() for p in target.model.parameters()) * 4
    expected = weights + c.block_size ** 2 + 2 * c.n_layer * c.block_size * c.d_model * 4   # bool mask, K and V
    assert m["memory_target_bytes"] == expected
    # a fake-quantized copy holds float32 weights of the same shapes and a cache of its own
    assert m["memory_draft_bytes"] >= expected and m["memory_bytes"] == m["memory_target_bytes"] + m["memory_draft_bytes"]
    assert m["peak_rss_bytes"] > m["memory_bytes"]
