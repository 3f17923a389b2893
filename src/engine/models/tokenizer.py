"""Character tokenizer: the vocabulary is the sorted set of the corpus's characters."""
from __future__ import annotations

import numpy as np
import torch

from ..errors import SpecsweepError


class CharTokenizer:
    def __init__(self, chars: list[str]):
        self.chars = list(chars)
        self.index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """str -> (len,) long. Vectorized through a code-point lookup table (a 5 MB corpus in ~50 ms)."""
        codes = torch.from_numpy(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
        table = torch.full((max(max(map(ord, self.chars)), int(codes.max()) if len(codes) else 0) + 1,), -1,
                           dtype=torch.long)
        table[[ord(c) for c in self.chars]] = torch.arange(len(self.chars))
        ids = table[codes]
        if (ids < 0).any():
            missing = sorted({chr(c) for c in codes[ids < 0].unique().tolist()})
            raise SpecsweepError(f"text has characters outside the model's vocabulary: {missing!r}")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in (ids.tolist() if hasattr(ids, "tolist") else ids))
