"""Memory a trial holds: the bytes of the tensors and arrays reachable from the target and the draft.

A draft costs memory as well as time (a second model's weights and KV cache, a context table).
`held_bytes(root, exclude=...)` counts, once each, the storages of every torch tensor and numpy
array reachable from `root` through module parameters and buffers, object attributes, and lists,
tuples and dicts (a KV cache, a table's arrays, a quantized copy's weights, a checkpoint's own
cache objects), leaving out the storages reachable from `exclude` (a draft that holds the target,
as the heads do, is charged only for what is its own). Counted after the trial's runs, the caches
are at their largest. What it cannot see: Python lists and dicts of numbers (a table draft's
per-context memos), ONNX Runtime's and inductor's own copies and code, and the interpreter; the
process's high-water mark (`peak_rss_bytes`) holds those, and everything else the process ran.
"""
from __future__ import annotations

import resource
import sys

import numpy as np
import torch

MAX_DEPTH = 8   # attribute hops from a root: deep enough for a model's cache objects, bounded for safety


def _storages(obj, seen_objects: set, found: dict, depth: int) -> None:
    """Add every tensor or array storage reachable from obj to `found` (key -> bytes)."""
    if depth > MAX_DEPTH or id(obj) in seen_objects:
        return
    seen_objects.add(id(obj))
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.strided and not obj.is_meta:
            storage = obj.untyped_storage()
            key = (obj.device.type, storage.data_ptr())
            found[key] = max(found.get(key, 0), storage.nbytes())
        return
    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        key = ("cpu", base.__array_interface__["data"][0])   # an array over a tensor's memory: the same key
        found[key] = max(found.get(key, 0), base.nbytes)
        return
    if isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    if isinstance(obj, torch.nn.Module):
        for t in list(obj.parameters(recurse=False)) + list(obj.buffers(recurse=False)):
            _storages(t, seen_objects, found, depth + 1)
        for m in obj.children():
            _storages(m, seen_objects, found, depth + 1)
        attrs = {k: v for k, v in vars(obj).items() if k not in ("_parameters", "_buffers", "_modules")}
        for v in attrs.values():
            _storages(v, seen_objects, found, depth + 1)
        return
    if isinstance(obj, dict):
        for v in obj.values():
            _storages(v, seen_objects, found, depth + 1)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        if obj and all(isinstance(x, (int, float)) for x in obj):   # numbers: none of our storages
            return
        for v in obj:
            _storages(v, seen_objects, found, depth + 1)
        return
    if hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.split(".")[0] in (
            "src", "transformers"):
        for v in vars(obj).values():
            _storages(v, seen_objects, found, depth + 1)


def storages(root) -> dict:
    found: dict = {}
    _storages(root, set(), found, 0)
    return found


def held_bytes(root, exclude=None) -> int:
    """Bytes of the storages reachable from root and not from exclude."""
    mine = storages(root)
    if exclude is not None:
        for key in storages(exclude):
            mine.pop(key, None)
    return int(sum(mine.values()))


def peak_rss_bytes() -> int:
    """This process's resident-set high-water mark (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
