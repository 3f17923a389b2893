"""Context-table drafts: the next char's distribution is looked up by the last `order` chars.

Shared by the n-gram draft (ngram.py) and the target-distilled draft (distilled.py); they differ
only in how they fill the table.

The table. A context of n chars c_1..c_n (c_n the latest) has the integer code
sum_i (c_i + 1) * B^(n-i) with B = V + 1: digits are 1..V, so contexts of different lengths never
share a code (the empty context is 0, a context of length n lies in [B^(n-1), B^n)). Every
context kept, of every length 0..order, is one row of a CSR table sorted by code:

    codes (K,) int64    the context codes, ascending
    lam   (K,) float32  weight of the shorter context's row (the backoff weight)
    ptr   (K+1,) int64  entries of context i are ptr[i]:ptr[i+1]
    chars (E,) uint8 (int16 for V > 256, int32 for V > 32,768) next-char ids, ascending within a context; vals (E,)
                float32 the mass added there

The row of a context is the recurrence over its suffixes, shortest first, starting from the
uniform distribution:
    row_{-1} = 1/V;  row_j = lam_j * row_{j-1} + vals_j   (suffix of length j in the table)
                     row_j = row_{j-1}                    (suffix not in the table)
then `floor_mix`: r = (1 - eps) * row + eps / V (the distilled draft; no floor for n-grams).
At temperature T the draft samples q = w / S with w = r^(1/T) (T = 1: w = r; T = 0: one-hot of
the argmax, the first on ties), C the running sum of w from char 0 up and S = C[V-1]; the CDF it
bisects is C / S. This is BigramDraft's rule (q^(1/T) renormalized), computed in float64 with
elementwise operations and a left-to-right running sum only, so the batched tensor path (`probs`,
`sample_chain`) and the per-context numpy path (`propose`, `next_probs`) give the same bits at
T = 0 and 1 (at other T, numpy's and torch's pow may differ in the last bit). `probs` returns q rounded
to float32, like every draft's `probs`; `propose` hands the float64 rows to the verifier.

Hot loop: a proposal draws its k uniforms in one call; each char is one dict lookup of the
context's code, one draw and an integer update of the code. At T = 1 (the speculative
setting) no row of V floats is built: the recurrence unrolls to a mixture of the table rows of the
context's suffixes plus a uniform part,

    floor-mixed row r = U / V + sum_j c_j * vals_j,   c_j = (1 - eps) * prod_{i > j} lam_i,
                                                      U = (1 - eps) * prod_i lam_i + eps

(j over the suffixes in the table, longest first, stopping at the first lam = 0), and a
`MixtureRow` samples from it with u * S (S = U + sum_j c_j * sum(vals_j)): a walk over the parts, a
bisect within one suffix's entries. It gives q(x) = r(x) / S per char and builds the dense row
only when asked for all of it (the verifier's residual after a rejection). Its q equals the
dense rule's to float rounding (the normalizer is summed in another order), not bit for bit;
`next_probs` and the other temperatures build dense rows: the recurrence on numpy rows over
memoized suffix rows, memoized as Python lists with their CDF, per temperature. Memos are cleared
when they pass `MEMO_LIMIT` rows (the memos of dense rows: `dense_memo_limit`, about 2^20 floats,
so a vocabulary of 50,257 tokens keeps 20 dense rows), and at every `reset`. Nothing else holds a
row of the vocabulary, so the n-gram draft runs over a subword vocabulary (its table is the
contexts and entries met in the training split); the distilled draft does not (`dense_vocab_rows`:
it holds the target's distribution after every training position while it builds).

Tables are cached on disk when the draft is given `cache_dir` and `target_key`: one file per
(draft class, target, the draft's own settings, the training ids it used), written atomically and
sealed with its sha256 (src/engine/atomic.py): a table that fails it is deleted and built again.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import logging
import time
from itertools import accumulate
from pathlib import Path

import numpy as np
import torch

from ..atomic import atomic_path, seal, sealed, unseal
from ..locks import BUILD_WAIT_S, file_lock
from ..sampling import uniforms
from .base import Draft

log = logging.getLogger(__name__)

MEMO_LIMIT = 8192          # rows memoized per memo (a row and its CDF are ~5 KB of Python floats at V = 84)
MEMO_FLOATS = 1 << 20      # floats a memo of dense rows holds at most: a subword vocabulary (V = 50,257) keeps 20 rows


def dense_memo_limit(vocab_size: int) -> int:
    """Rows a memo of dense rows (V floats each) keeps: MEMO_LIMIT, fewer for a large vocabulary."""
    return min(MEMO_LIMIT, max(8, MEMO_FLOATS // vocab_size))
TABLE_KEYS = ("codes", "lam", "ptr", "chars", "vals", "level_contexts")
FORMAT = 1                 # bump when the table layout or a build's meaning changes


def check_order(name: str, order) -> None:
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ValueError(f"{name} order must be an integer >= 1, got {order!r}")


def max_code_digits(vocab_size: int) -> int:
    """The most digits (chars) a code in base V + 1 may have and still fit an int64."""
    n = 1
    while (vocab_size + 1) ** (n + 1) < 2 ** 63:
        n += 1
    return n


def fingerprint(ids: torch.Tensor) -> str:
    """sha256 of a 1-D id tensor's values (as int64): what a table was built from."""
    return hashlib.sha256(ids.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def assemble(levels: list[tuple], vocab_size: int) -> dict:
    """One CSR table from per-level parts, shortest context first.

    levels[j] = (ctx_codes (K_j,) int64 ascending, lam (K_j,), n_entries (K_j,) int64,
                 chars (E_j,), vals (E_j,)), entries grouped by context in code order.
    """
    codes = torch.cat([lv[0] for lv in levels])
    counts = torch.cat([lv[2] for lv in levels])
    ptr = torch.zeros(len(codes) + 1, dtype=torch.int64)
    ptr[1:] = counts.cumsum(0)
    char_dtype = torch.uint8 if vocab_size <= 256 else torch.int16 if vocab_size <= 32768 else torch.int32
    return {"codes": codes.to(torch.int64), "lam": torch.cat([lv[1] for lv in levels]).float(), "ptr": ptr,
            "chars": torch.cat([lv[3] for lv in levels]).to(char_dtype),
            "vals": torch.cat([lv[4] for lv in levels]).float(),
            "level_contexts": torch.tensor([len(lv[0]) for lv in levels], dtype=torch.int64)}


def suffix_codes(ctx: torch.Tensor, base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ctx (M, n) ids, left-padded with -1 -> (codes (M, n+1) int64, valid (M, n+1) bool): column j
    is the code of the last j chars; it is valid when none of them is padding."""
    M, n = ctx.shape
    codes = torch.zeros(M, n + 1, dtype=torch.int64)
    valid = torch.ones(M, n + 1, dtype=torch.bool)
    scale = 1
    for j in range(1, n + 1):
        c = ctx[:, n - j]
        codes[:, j] = codes[:, j - 1] + (c + 1).clamp(min=0) * scale
        valid[:, j] = valid[:, j - 1] & (c >= 0)
        scale *= base
    return codes, valid


class TableRow:
    """One context's table entries: lam (its backoff weight), chars (ascending) and vals (float32
    widened exactly to float) as Python lists for the per-char work, the same as numpy arrays
    (chars_np (n,) int, vals_np (n,) float64) for building a whole row, cum (running sums of vals)
    and mass (= cum[-1])."""
    __slots__ = ("lam", "chars", "vals", "chars_np", "vals_np", "cum", "mass")

    def __init__(self, lam: float, chars_np: np.ndarray, vals_np: np.ndarray):
        self.lam, self.chars_np, self.vals_np = lam, chars_np.astype(np.intp), vals_np.astype(np.float64)
        self.chars, self.vals = chars_np.tolist(), self.vals_np.tolist()
        self.cum = list(accumulate(self.vals))
        self.mass = self.cum[-1] if self.vals else 0.0

    def val(self, x: int) -> float:
        i = bisect.bisect_left(self.chars, x)
        return self.vals[i] if i < len(self.chars) and self.chars[i] == x else 0.0

    def draw(self, y: float) -> int:
        """The char whose running-sum interval holds y in [0, mass): a zero-mass entry has an
        empty interval and is never drawn, also when rounding puts y at or past the mass."""
        i = bisect.bisect_right(self.cum, y)
        if i == len(self.cum):
            i -= 1
            while self.vals[i] == 0:
                i -= 1
        return self.chars[i]


class MixtureRow:
    """A context's q at T = 1 in mixture form: q(x) = (U / V + sum_j c_j * vals_j(x)) / S.

    A sequence of V floats to the verifier (q[x]: one char, computed; iterating builds the
    dense row once). `sample(u)` maps u in [0, 1) to a char with law q: x = u * S falls in the
    part j of width c_j * mass_j (bisect on its running sums) or in the uniform part of width U."""
    __slots__ = ("parts", "uniform", "total", "size", "_dense")

    def __init__(self, parts: list[tuple[float, TableRow]], uniform: float, size: int):
        self.parts, self.uniform, self.size = parts, uniform, size   # parts: (c_j, row j), longest first
        self.total = uniform + sum(c * row.mass for c, row in parts)
        self._dense = None

    def sample(self, u: float) -> int:
        x = u * self.total
        for c, row in self.parts:
            width = c * row.mass
            if x < width:
                return row.draw(x / c)
            x -= width
        if self.uniform > 0:
            return min(int(x * self.size / self.uniform), self.size - 1)
        c, row = next((c, row) for c, row in reversed(self.parts) if row.mass > 0)  # rounding past the end
        return row.draw(row.mass)

    def __getitem__(self, x):
        if type(x) is not int:
            return self.dense()[x]
        if x < 0:
            x += self.size
        r = self.uniform / self.size
        for c, row in self.parts:
            r += c * row.val(x)
        return r / self.total

    def dense(self) -> list[float]:
        """q as V floats: the same sums as `q[x]`, in the same order, for every char at once."""
        if self._dense is None:
            r = np.full(self.size, self.uniform / self.size)
            for c, row in self.parts:
                r[row.chars_np] += c * row.vals_np                 # chars of one row are unique
            self._dense = (r / self.total).tolist()
        return self._dense

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        return iter(self.dense())

    def __copy__(self) -> "MixtureRow":
        """The same row with its dense form not built: a replayed run (src/engine/measuring/replay.py) builds
        it again where the acceptance test needs it, as the loop it replays did."""
        out = MixtureRow.__new__(MixtureRow)
        out.parts, out.uniform, out.total, out.size, out._dense = self.parts, self.uniform, self.total, self.size, None
        return out


class TableDraft(Draft):
    """A draft whose next-char distribution is a table lookup by the last `order` chars.

    Subclasses implement `_build(target, train_ids) -> table dict` and `settings()` (what the
    table depends on besides the target and the training ids), and set `floor_mix`."""
    name = "table"
    floor_mix = 0.0         # eps of the final (1 - eps) * row + eps / V
    folder_targets = True   # counts over token ids (ngram), or the target's forward over them (distilled)
    dense_vocab_rows = False  # True: the build holds a row of V floats per training position (distilled):
                              # a vocabulary above data.max_vocab is refused (checks.py)
    batched = True          # a proposal reads only the context and its uniforms (memos are keyed by
                            # context, so sequences of a batch share them safely)

    @classmethod
    def check_options(cls, *, order, **_) -> None:
        check_order(cls.name, order)

    @classmethod
    def check_vocabulary(cls, order: int, vocab_size: int) -> None:
        """n-gram codes have order + 1 digits in base V + 1 and must fit an int64 (at V = 50,257:
        order 3 at most)."""
        if order + 1 > max_code_digits(vocab_size):
            raise ValueError(f"{cls.name} order {order} is too long for a vocabulary of {vocab_size:,} tokens "
                             f"(at most {max_code_digits(vocab_size) - 1}: its context codes must fit an int64)")

    def __init__(self, target, train_ids: torch.Tensor, name: str | None, order: int,
                 cache_dir: str | Path | None = None, target_key: str | None = None):
        super().__init__(target, train_ids, name)
        V = self.vocab_size
        check_order(self.name, order)
        self.check_vocabulary(order, V)
        if train_ids is None or train_ids.dim() != 1 or len(train_ids) < 2:
            raise ValueError(f"{self.name} needs the training split as a 1-D id tensor of at least 2 chars")
        self.order, self.base = order, V + 1
        self._shift = self.base ** (order - 1)   # code % shift drops the oldest char of a full context
        self.cache_file, self.cached, self.build_s = None, False, 0.0
        t0 = time.perf_counter()
        if cache_dir is not None and target_key is not None:
            self.cache_file = Path(cache_dir) / f"{self.name}-{target_key}-{self._settings_hash(train_ids)}.pt"
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            with file_lock(str(self.cache_file) + ".lock", f"the {self.name} table {self.cache_file.name}",
                           BUILD_WAIT_S):  # parallel trials build a table once
                table = self._load(self.cache_file)
                self.cached = table is not None
                if table is None:
                    table = self._build(target, train_ids)
                    with atomic_path(self.cache_file) as tmp:
                        torch.save(table, tmp)
                    seal(self.cache_file)
        else:
            table = self._build(target, train_ids)
        self.build_s = time.perf_counter() - t0
        self._set_table(table)

    # ---- what subclasses provide -------------------------------------------------------------
    def settings(self) -> dict:
        raise NotImplementedError

    def _build(self, target, train_ids: torch.Tensor) -> dict:
        raise NotImplementedError

    # ---- the table ----------------------------------------------------------------------------
    def _settings_hash(self, train_ids: torch.Tensor) -> str:
        blob = json.dumps({"class": type(self).__name__, "format": FORMAT, "settings": self.settings(),
                           "vocab": self.vocab_size, "train_ids": fingerprint(train_ids)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _load(self, path: Path) -> dict | None:
        """The cached table, or None if there is none, it fails its checksum (overwritten, truncated,
        or without its sidecar: deleted, said in one line) or it cannot be read: it is then rebuilt."""
        if not path.exists():
            return None
        if not sealed(path):
            log.warning("the %s table %s fails its checksum (corrupt or partial): deleted and built again",
                        self.name, path.name)
            unseal(path)
            return None
        try:
            table = torch.load(path, weights_only=True)
        except Exception:
            return None
        if not isinstance(table, dict) or set(table) != set(TABLE_KEYS):
            return None
        return table

    def _set_table(self, table: dict) -> None:
        self.table = table
        self.codes, self.lam, self.ptr = table["codes"], table["lam"], table["ptr"]
        self.chars, self.vals = table["chars"], table["vals"]
        # numpy views (no copies) for the per-context numpy path: a scalar search costs ~1 us there
        self._codes_np, self._lam_np, self._ptr_np = (table[k].numpy() for k in ("codes", "lam", "ptr"))
        self._chars_np, self._vals_np = table["chars"].numpy(), table["vals"].numpy()
        self._uniform = np.full(self.vocab_size, 1.0 / self.vocab_size)
        self._base_rows: dict[int, np.ndarray] = {}  # code -> T=1 row before the floor (any length)
        self._rows: dict[int, tuple] = {}              # code -> (q row, CDF) at self._temperature
        self._dense_limit = dense_memo_limit(self.vocab_size)  # rows kept in the two memos above
        self._temperature = None
        self._table_rows: dict[int, TableRow | None] = {}    # code -> its entries (None: not in the table)
        self._mixtures: dict[int, MixtureRow] = {}            # code -> q at T = 1 (propose)

    def table_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.table.values())

    # ---- rows, batched (probs, sample_chain) ------------------------------------------------
    def _rows64(self, ctx: torch.Tensor) -> torch.Tensor:
        """ctx (M, order) ids, left-padded with -1 -> (M, V) float64 rows before the floor."""
        M, V = ctx.shape[0], self.vocab_size
        codes, valid = suffix_codes(ctx.cpu(), self.base)                    # (M, order+1)
        pos = torch.searchsorted(self.codes, codes).clamp(max=len(self.codes) - 1)
        found = valid & (self.codes[pos] == codes)
        row = torch.full((M, V), 1.0 / V, dtype=torch.float64)
        for j in range(self.order + 1):
            r = found[:, j].nonzero().squeeze(1)                              # rows whose suffix j is kept
            if len(r) == 0:
                continue
            i = pos[r, j]
            row[r] = row[r] * self.lam[i].double().unsqueeze(1)
            start, count = self.ptr[i], self.ptr[i + 1] - self.ptr[i]
            first = count.cumsum(0) - count                                   # offset of each row's entries
            e = torch.arange(int(count.sum())) + (start - first).repeat_interleave(count)
            rr = r.repeat_interleave(count)
            cc = self.chars[e].long()
            row[rr, cc] = row[rr, cc] + self.vals[e].double()                 # (row, char) pairs are unique
        return row

    def _finish(self, rows64: torch.Tensor, temperature: float) -> torch.Tensor:
        """(M, V) float64 rows -> (M, V) float64 q at `temperature` (the module's rule; `_fill` is its
        per-row twin)."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        r = rows64
        if self.floor_mix:
            r = torch.add(torch.mul(r, 1.0 - self.floor_mix), self.floor_mix / self.vocab_size)
        if temperature == 0:
            w = torch.nn.functional.one_hot(r.argmax(-1), r.shape[-1]).double()
        elif temperature == 1:
            w = r
        else:
            w = torch.pow(r, 1.0 / temperature)
        return w / w.cumsum(-1)[..., -1:]

    def _contexts(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, order): the last `order` chars up to each position, -1 before the start."""
        pad = torch.full((idx.shape[0], self.order - 1), -1, dtype=torch.long)
        return torch.cat([pad, idx.cpu().long()], 1).unfold(1, self.order, 1)

    @torch.no_grad()
    def probs(self, idx, temperature):
        B, T = idx.shape
        ctx = self._contexts(idx).reshape(B * T, self.order)
        return self._finish(self._rows64(ctx), temperature).float().view(B, T, -1).to(idx.device)

    @torch.no_grad()
    def sample_chain(self, prefix, k, temperature, gen):
        """The chain `propose` samples, batched: only the last `order` chars are looked up per step."""
        seq, qs = prefix.cpu(), []
        for _ in range(k):
            ctx = self._contexts(seq[:, -self.order:])[:, -1]                 # (B, order)
            q = self._finish(self._rows64(ctx), temperature).float()          # (B, V)
            seq = torch.cat([seq, torch.multinomial(q, 1, generator=gen)], 1)
            qs.append(q)
        return seq[:, prefix.shape[1]:].to(prefix.device), torch.stack(qs, 1).to(prefix.device)

    # ---- rows, one context at a time (propose, next_probs) --------------------------------
    def _base_row(self, code: int, n: int) -> np.ndarray:
        """The T=1 row (V,) float64 (before the floor) of the length-n context `code`, memoized for
        every length. The same float64 operations, in the same order, as `_rows64`."""
        row = self._base_rows.get(code)
        if row is not None:
            return row
        codes = self._codes_np
        i = int(codes.searchsorted(code))
        if i < len(codes) and codes.item(i) == code:
            s, e = self._ptr_np.item(i), self._ptr_np.item(i + 1)
            lam = self._lam_np.item(i)
            # lam = 0 (a row that ignores shorter contexts): 0 * the backoff row is 0, so it is not built
            row = self._suffix_row(code, n) * lam if lam else np.zeros(self.vocab_size)
            row[self._chars_np[s:e]] += self._vals_np[s:e]    # float32 values widened exactly; chars unique
        else:
            row = self._suffix_row(code, n)                   # never written to: shared safely
        if len(self._base_rows) >= self._dense_limit:
            self._base_rows.clear()
        self._base_rows[code] = row
        return row

    def _suffix_row(self, code: int, n: int) -> np.ndarray:
        """The row the length-n context backs off to: its suffix's, or uniform below the empty context."""
        return self._base_row(code % self.base ** (n - 1), n - 1) if n > 0 else self._uniform

    def _fill(self, code: int, n: int, temperature: float) -> tuple[list[float], list[float]]:
        """Build, memoize and return (q row, CDF) of a context at the current temperature: the rule
        of `_finish` on one row (numpy's elementwise operations and running sum give its bits)."""
        r = self._base_row(code, n)
        if self.floor_mix:
            r = r * (1.0 - self.floor_mix) + self.floor_mix / self.vocab_size
        if temperature == 0:
            w = np.zeros_like(r)
            w[int(r.argmax())] = 1.0                          # the first maximum, as torch's argmax
        elif temperature == 1:
            w = r
        else:
            w = r ** (1.0 / temperature)
        run = np.cumsum(w)
        total = run.item(-1)
        q, cdf = (w / total).tolist(), (run / total).tolist()
        # from the last char with mass on, the CDF is exactly 1: rounding never selects a zero-mass char
        last = len(q) - 1 if q[-1] > 0 else int(np.flatnonzero(w)[-1])
        cdf[last:] = [1.0] * (len(cdf) - last)
        if len(self._rows) >= self._dense_limit:
            self._rows.clear()
        self._rows[code] = hit = (q, cdf)
        return hit

    def _memo(self, temperature: float) -> dict:
        if temperature != self._temperature:
            if temperature < 0:
                raise ValueError(f"temperature must be >= 0, got {temperature}")
            self._rows, self._temperature = {}, temperature
        return self._rows

    def _table_row(self, code: int) -> TableRow | None:
        """The table entries of context `code`, or None when it is not in the table; memoized."""
        if code in self._table_rows:
            return self._table_rows[code]
        codes = self._codes_np
        i = int(codes.searchsorted(code))
        row = None
        if i < len(codes) and codes.item(i) == code:
            s, e = self._ptr_np.item(i), self._ptr_np.item(i + 1)
            row = TableRow(self._lam_np.item(i), self._chars_np[s:e], self._vals_np[s:e])
        if len(self._table_rows) >= MEMO_LIMIT:
            self._table_rows.clear()
        self._table_rows[code] = row
        return row

    def _mixture(self, code: int, n: int) -> MixtureRow:
        """Build and memoize the T = 1 q of the length-n context `code` in mixture form: the
        recurrence of the module docstring unrolled, longest suffix first."""
        parts, c = [], 1.0 - self.floor_mix
        for j in range(n, -1, -1):
            row = self._table_row(code % self.base ** j)        # the code of the last j chars
            if row is None:
                continue
            parts.append((c, row))
            c *= row.lam
            if c == 0:                                           # lam = 0: shorter contexts get no weight
                break
        mix = MixtureRow(parts, c + self.floor_mix, self.vocab_size)
        if len(self._mixtures) >= MEMO_LIMIT:
            self._mixtures.clear()
        self._mixtures[code] = mix
        return mix

    def reset(self) -> None:
        """A new sequence starts: the memoized rows are dropped, so each sequence pays for building
        the rows it meets. A trial replays one seed many times; rows kept from the earlier runs
        would time a warm draft that fresh text never meets."""
        self.clear_memos()

    def clear_memos(self) -> None:
        """Forget every memoized row (the next lookups build them again)."""
        self._base_rows, self._rows, self._table_rows, self._mixtures = {}, {}, {}, {}

    def memo_size(self, temperature: float | None = None) -> int:
        """Rows memoized for `temperature` (default: the dense rows' current one; 1: the mixtures
        `propose` samples from)."""
        return len(self._mixtures) if temperature == 1 else len(self._rows)

    def _code(self, context: list[int]) -> tuple[int, int]:
        ctx = context[-self.order:]
        code = 0
        for c in ctx:
            code = code * self.base + c + 1
        return code, len(ctx)

    def _advance(self, code: int, length: int, char: int) -> tuple[int, int]:
        """The code of a context after `char` is appended (its oldest char dropped at full order)."""
        if length < self.order:
            return code * self.base + char + 1, length + 1
        return (code % self._shift) * self.base + char + 1, length

    def propose(self, seq, k, temperature, gen, stop=None):
        if temperature == 1:
            return self._propose_mixture(seq, k, gen, stop)
        return self._propose_dense(seq, k, temperature, gen, stop)

    def _propose_dense(self, seq, k, temperature, gen, stop=None):
        """`propose` from dense rows (every temperature; at T = 1 `propose` uses the mixtures)."""
        rows = self._memo(temperature)
        code, length = self._code(seq)
        drafts, q = [], []
        for u in uniforms(k, gen):
            hit = rows.get(code)
            if hit is None:
                hit = self._fill(code, length, temperature)
            q.append(hit[0])
            d = bisect.bisect_right(hit[1], u)  # CDF rows end at exactly 1 > u
            drafts.append(d)
            if stop is not None and stop(hit[0][d]):
                break
            code, length = self._advance(code, length, d)
        return drafts, q                        # q: a row of V floats per drafted char

    def _propose_mixture(self, seq, k, gen, stop=None):
        """`propose` at T = 1: draws from the mixture form, no dense row built (module docstring)."""
        mixtures = self._mixtures
        code, length = self._code(seq)
        drafts, q = [], []
        for u in uniforms(k, gen):
            mix = mixtures.get(code)
            if mix is None:
                mix = self._mixture(code, length)
            q.append(mix)
            d = mix.sample(u)
            drafts.append(d)
            if stop is not None and stop(mix[d]):
                break
            code, length = self._advance(code, length, d)
        return drafts, q                        # q: a MixtureRow (a sequence of V floats) per drafted char

    def next_probs(self, context, temperature):
        rows = self._memo(temperature)
        code, length = self._code(list(context))
        hit = rows.get(code)
        return (hit if hit is not None else self._fill(code, length, temperature))[0]

    def describe(self):
        levels = self.table["level_contexts"].tolist()
        return {"order": self.order, "table_bytes": self.table_bytes(), "contexts": len(self.codes),
                "entries": len(self.vals), "contexts_by_length": "/".join(map(str, levels)),
                "cached": self.cached, "build_s": round(self.build_s, 2)}
