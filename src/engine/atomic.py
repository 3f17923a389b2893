"""Write files atomically: to a temporary name in the same folder, then rename.

A crash mid-write leaves at worst a stray `*.tmp*` file, never a half file under the real
name that a later run would trust. A cached file that a later run reads back (a checkpoint, an
exported ONNX graph, a draft's table) is also sealed: `seal` writes its sha256 into a sidecar
`<name>.sha256` after the file is in place, and `sealed` is true only for a file that matches its
sidecar, so a file overwritten, truncated or left without its sidecar is never trusted.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to `path`; rename it onto `path` if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sidecar(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def seal(path: str | Path) -> str:
    """Write the sha256 of the file at `path` into its sidecar (atomically); return it."""
    digest = file_sha256(path)
    write_text(sidecar(path), digest + "\n")
    return digest


def sealed(path: str | Path) -> bool:
    """The file exists and matches the sha256 of its sidecar."""
    path, side = Path(path), sidecar(path)
    return path.is_file() and side.is_file() and side.read_text().strip() == file_sha256(path)


def unseal(path: str | Path) -> None:
    """Delete a cached file and its sidecar (a file that failed `sealed`, before it is rebuilt)."""
    for p in (Path(path), sidecar(path)):
        p.unlink(missing_ok=True)
