"""A Hugging Face causal LM from a local folder, run by the tool's own loops; and the tool's
targets written as such folders.

`load_checkpoint(path)` reads a transformers checkpoint (config, weights, tokenizer) offline and
returns an `HFModel` and an `HFTokenizer`: the interface the tool's loops use of its own
`Transformer` and `CharTokenizer` (src/engine/decoding/decode.py).

- `HFModel(ids, input_pos)` runs the model on tokens at positions input_pos, contiguous,
  over the architecture's own cache (transformers' `DynamicCache`): entries at input_pos[0] and
  beyond are dropped first (`rewind`), so rejecting drafts is a rewind of the position, as in the
  tool's cache written by position. Without a cache (`cache_set_aside`) it is a full forward from
  position 0. A tree pass (`HFModel(ids, input_pos, slots, mask)`, verify=tree) writes its nodes
  at contiguous cache slots after the committed tokens, each at the position of its depth, and
  attends through the tree's mask (src/engine/decoding/tree.py: each node sees the committed tokens, its
  ancestors and itself), given as a 4D additive float mask, which transformers hands to the
  attention as it is; committing the accepted path copies its nodes' keys and values to the
  slots after the committed tokens (`move_cache`). Whether an architecture honours such a mask is
  tried on the model once, when a tree's cache is first set up (`takes_tree_mask`); one that does
  not is refused in one line. Batches of several sequences are refused in one line.
  On engine=compiled (`compile_pass`, on the twin `with_static_cache` makes: the same weights) the
  cache is transformers' `StaticCache` of block_size slots instead, allocated once; a pass at position p sets every layer's write count back to p
  (the rewind) and the causal mask hides the slots from p + width on; the model's forward over it
  runs through torch.compile, one graph per pass width; chains only.
- `HFTokenizer` encodes with the checkpoint's tokenizer, no special tokens added; a text it
  cannot encode is refused in one line. Counters the tool calls chars are then tokens.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import SpecsweepError, unreadable
from .checkpoint import WINDOW_KEYS, offline_transformers


@dataclass(frozen=True)
class HFShape:
    """What the loops read of a model's config (Transformer's ModelConfig has the same names)."""
    vocab_size: int
    block_size: int   # the context window: the positions the model was built for (or model.max_len)


class HFTokenizer:
    """A transformers tokenizer with CharTokenizer's interface (encode to a long tensor, decode)."""

    def __init__(self, tok):
        self.tok = tok
        vocab = tok.get_vocab()
        self.chars = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]   # its tokens, in id order
        self.vocab_size = max(vocab.values()) + 1   # ids 0..vocab_size-1 (special tokens included)

    def encode(self, text: str) -> torch.Tensor:
        try:
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
        except Exception as e:   # noqa: BLE001 - e.g. a char-level vocabulary without the char, and no unknown token
            raise SpecsweepError(f"the checkpoint's tokenizer cannot encode {text[:40]!r}: "
                                 f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class HFModel(nn.Module):
    """A transformers causal LM behind the interface of the tool's Transformer that the chain loops use."""

    def __init__(self, hf, max_len: int | None = None):
        super().__init__()
        self.hf = hf.eval()
        c = hf.config.get_text_config(decoder=True)
        window = next((getattr(c, key) for key in WINDOW_KEYS if isinstance(getattr(c, key, None), int)), None)
        if window is None and max_len is None:
            raise SpecsweepError(f"{type(hf).__name__}'s config names no context window: set model.max_len")
        block = min(v for v in (window, max_len) if v is not None)
        self.max_len = max_len
        self.cfg = HFShape(int(hf.get_output_embeddings().weight.shape[0]), int(block))
        self.register_buffer("causal", torch.zeros(0, device=next(hf.parameters()).device), persistent=False)
        self.cache = None
        self._tree_mask: bool | None = None   # takes_tree_mask's answer, once tried
        self.static = False   # a static cache (engine=compiled: `compile_pass`), else a DynamicCache
        self._static = None   # the static cache, allocated once and kept: a compiled graph holds its tensors

    @property
    def _cache_batch(self) -> int:   # the Transformer's name for it: the rows of the cache set up, 0 without
        return 1 if self.cache is not None else 0

    def n_params(self) -> int:
        return sum(p.numel() for p in self.hf.parameters())

    def setup_cache(self, batch: int = 1, extra: int = 0) -> None:
        if batch != 1:
            raise SpecsweepError("a model from a folder decodes one sequence at a time here (batch=1)")
        if extra and self.static:
            raise SpecsweepError("engine=compiled verifies chains on a model from a folder: use verify=chain "
                                 "(trees run on engine=eager)")
        if extra and not self.takes_tree_mask():
            raise SpecsweepError(f"{type(self.hf).__name__} does not honour a custom 4D attention mask, which a "
                                 "tree's verify pass needs: use verify=chain")
        if not self.static:
            self.cache = offline_transformers().DynamicCache(config=self.hf.config)
            return
        if self._static is None:
            t = offline_transformers()
            cache = t.StaticCache(config=self.hf.config, max_cache_len=self.cfg.block_size)
            odd = {type(layer).__name__ for layer in cache.layers} - {"StaticLayer"}
            if odd:
                raise SpecsweepError(f"engine=compiled: {type(self.hf).__name__}'s static cache has {', '.join(sorted(odd))} "
                                     "layers, whose writes a rewind cannot move back here: use engine=eager")
            self._static = cache
        self.cache = self._static

    def use_static_cache(self) -> None:
        """From now on the cache is transformers' StaticCache (see compile_pass); one set up already
        is replaced by it (its contents are gone)."""
        had = self.cache is not None
        self.static, self.cache = True, None
        if had:
            self.setup_cache()

    def with_static_cache(self) -> "HFModel":
        """A twin over a static cache of its own, sharing this model's weights: the compiled
        engine runs the twin, so a model loaded once serves trials on every engine."""
        twin = HFModel(self.hf, self.max_len)
        twin._tree_mask = self._tree_mask
        twin.use_static_cache()
        return twin

    def set_write_count(self, start: int) -> None:
        """The static cache's rewind: every layer writes its next keys and values at slot `start`,
        and the causal mask hides the slots from there on."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(start)

    def compile_pass(self, mode: str | None = None, options: dict | None = None):
        """This model with its cached pass through torch.compile (the compiled engine runs it on
        `with_static_cache`'s twin): a callable with the forward's signature. The cache is
        transformers' StaticCache of block_size slots (model.max_len, else the config's window:
        every pass attends over all of them, the slots not yet written masked), allocated once
        and kept, so the graph's shapes never change; a pass at position p first sets every
        layer's write count to p (a rewind), so rejecting drafts stays a rewind of the position.
        The checks and that count run eager, the model's forward over the cache compiled: one
        graph per pass width."""
        if not self.static:
            raise ValueError("compile_pass runs over a static cache: call use_static_cache first")
        step = torch.compile(self._pass, dynamic=False, fullgraph=True, mode=mode, options=options or None)

        def run(idx, input_pos=None, slots=None, mask=None, *, return_hidden: bool = False):
            return self.forward(idx, input_pos, slots, mask, return_hidden=return_hidden, step=step)
        return run

    def _pass(self, idx: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The model over its cache (a static one: written from each layer's count on)."""
        return self.hf(input_ids=idx, position_ids=position_ids, past_key_values=self.cache, use_cache=True).logits.float()

    def drop_cache(self) -> None:
        self.cache = None

    def takes_tree_mask(self) -> bool:
        """Whether the architecture honours a custom 4D attention mask, tried once on the model: over
        4 tokens, the causal mask given as a 4D mask must give the plain forward's logits, and a
        mask under which the last token sees only itself must give that token's logits alone at
        its position (and not the plain forward's)."""
        if self._tree_mask is None:
            self._tree_mask = self._try_tree_mask()
        return self._tree_mask

    @torch.no_grad()
    def _try_tree_mask(self) -> bool:
        device = next(self.hf.parameters()).device
        ids = torch.arange(1, 5, device=device)[None] % self.cfg.vocab_size
        pos = torch.arange(4, device=device)[None]
        causal = torch.ones(4, 4, dtype=torch.bool, device=device).tril()
        alone = causal.clone()
        alone[3, :3] = False
        try:
            plain = self.hf(input_ids=ids, position_ids=pos, use_cache=False).logits
            given = self.hf(input_ids=ids, position_ids=pos, attention_mask=additive(causal, plain.dtype),
                            use_cache=False).logits
            hidden = self.hf(input_ids=ids, position_ids=pos, attention_mask=additive(alone, plain.dtype),
                             use_cache=False).logits[:, 3]
            single = self.hf(input_ids=ids[:, 3:], position_ids=pos[:, 3:], use_cache=False).logits[:, 0]
        except Exception:   # noqa: BLE001 - an architecture that refuses the mask's shape or kind
            return False
        return bool(torch.allclose(given, plain, atol=1e-4) and torch.allclose(hidden, single, atol=1e-4)
                    and not torch.allclose(hidden, plain[:, 3], atol=1e-3))

    def move_cache(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the keys and values at cache slots `src` to slots `dst` (a tree's accepted path to
        the slots after the committed tokens), in every layer."""
        dynamic = offline_transformers().cache_utils.DynamicLayer
        for layer in self.cache.layers:
            if type(layer) is not dynamic:
                raise SpecsweepError(f"{type(self.hf).__name__}'s cache has {type(layer).__name__} layers: a tree's "
                                     "accepted path cannot be moved in it; use verify=chain")
            layer.keys[:, :, dst] = layer.keys[:, :, src]
            layer.values[:, :, dst] = layer.values[:, :, src]

    @contextmanager
    def cache_set_aside(self):
        saved = self.cache
        self.cache = None
        try:
            yield self
        finally:
            if saved is not None:
                self.setup_cache()

    def forward(self, idx: torch.Tensor, input_pos: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, *, return_hidden: bool = False, step=None):
        if return_hidden:
            raise SpecsweepError("a model from a folder gives no hidden state to a draft: use a draft that does not "
                                 "read the target's")
        if self.cache is None:
            if mask is not None or (input_pos is not None and int(input_pos[0]) != 0):
                raise ValueError("without a KV cache a pass is a full forward from position 0, without a mask")
            return self.hf(input_ids=idx, use_cache=False).logits.float()
        if input_pos is None:
            raise ValueError("input_pos is required while a KV cache is set up")
        width = idx.shape[1]
        slots = input_pos if slots is None else slots
        start = int(slots[0])
        at = torch.arange(start, start + width, device=slots.device)
        if not torch.equal(slots, at):
            raise ValueError("a pass writes contiguous cache slots here")
        have = self.cache.get_seq_length()
        if start > have:
            raise ValueError(f"a pass at slot {start} over a cache of {have} tokens: slots must follow on")
        if self.static:
            if mask is not None:
                raise ValueError("a static cache takes no tree mask here")
            if start + width > self.cfg.block_size:
                raise ValueError(f"a pass up to slot {start + width} over a static cache of {self.cfg.block_size}")
            self.set_write_count(start)
            return (step or self._pass)(idx, input_pos.view(1, -1))
        rewind(self.cache, start)   # what was cached from `start` on is replaced
        extra = {}
        if mask is not None:        # (width, S) over cache slots: query i sees slot j
            extra["attention_mask"] = additive(mask[:, :start + width], self.hf.dtype)
        out = self.hf(input_ids=idx, position_ids=input_pos.view(1, -1).expand(idx.shape[0], -1),
                      cache_position=at, past_key_values=self.cache, use_cache=True, **extra)
        return out.logits.float()


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean (query, key) mask as the (1, 1, query, key) additive float mask attention adds to
    its scores: 0 where allowed, the dtype's lowest value elsewhere."""
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def rewind(cache, length: int) -> None:
    """Drop a DynamicCache's entries past `length` tokens (its crop takes the count to remove, negated)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def context_window(path: Path) -> int | None:
    """The context window its config.json names (its text config's, for a multimodal one); None if none."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise SpecsweepError(f"model.path {path}: config.json cannot be read ({e})") from None
    for node in (config, config.get("text_config") or {}):
        for key in WINDOW_KEYS:
            if isinstance(node.get(key), int) and node[key] > 0:
                return node[key]
    return None


def check_folder(path: Path) -> None:
    """A folder holding a transformers checkpoint: config.json naming an architecture with a causal
    LM class and saying it decodes causally (`check_causal_config`), weights, a tokenizer, every file
    readable (one line otherwise); nothing is loaded but config.json."""
    if not path.exists():
        raise SpecsweepError(f"model.path {path} does not exist")
    if not path.is_dir():
        raise SpecsweepError(f"model.path {path} is not a folder: give a transformers checkpoint's folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise SpecsweepError(f"model.path {path} cannot be read (permission denied): give a folder you can read")
    if not (path / "config.json").is_file():
        raise SpecsweepError(f"model.path {path} is not a transformers checkpoint (no config.json)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise SpecsweepError(f"model.path {path} holds no weights (*.safetensors or *.bin)")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json",
                                              "tokenizer.model")):
        raise SpecsweepError(f"model.path {path} holds no tokenizer (tokenizer.json or tokenizer_config.json)")
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        why = unreadable(f)
        if why:
            raise SpecsweepError(f"model.path {path}: {f.name} cannot be read ({why}): give a folder whose files you "
                                 "can read")
    try:
        config = json.loads((path / "config.json").read_text())
        config.get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise SpecsweepError(f"model.path {path}: config.json cannot be read ({e})") from None
    check_causal_config(path, config)


def check_causal_config(path: Path, config: dict) -> None:
    """The config says the model decodes causally: its architecture has a causal LM class in
    transformers, the classes it was saved from (`architectures`) include a causal LM (an encoder
    saved as BertForMaskedLM is not), and an architecture that is also an encoder (bert, roberta,
    ...: its causal class attends both ways unless the config makes it a decoder) says
    `is_decoder: true`. The loaded model must pass the prefix test too (`check_prefix`)."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES as MASKED)
    model_type = config.get("model_type")
    if model_type not in CAUSAL:
        raise SpecsweepError(f"model.path {path}: architecture {model_type!r} is not a causal LM transformers can load "
                             "(AutoModelForCausalLM has no class for it)")
    named = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    causal = set(CAUSAL.values())
    if named and not any(a in causal or a.endswith(("ForCausalLM", "LMHeadModel")) for a in named):
        raise SpecsweepError(f"model.path {path}: its config says it was saved as {', '.join(named)}, not a causal LM "
                             f"(an encoder's predictions see later tokens): give a causal LM's checkpoint "
                             f"({CAUSAL[model_type]} for {model_type!r})")
    if model_type in MASKED and config.get("is_decoder") is not True:
        raise SpecsweepError(f"model.path {path}: a {model_type!r} model decodes causally only as a decoder, and its "
                             "config does not say is_decoder: true (its predictions would see later tokens): give a "
                             "causal LM's checkpoint")


PREFIX_RTOL = 1e-4   # the prefix test's tolerance, relative to the largest logit (at least 1): float32's
# epsilon is 1.2e-7 and a causal LM's logits at a prefix move only by the rounding of sums taken in
# another order (measured 6e-7 on a tiny Llama, 1.3e-6 on GPT-2, weights drawn wide), while an
# encoder's attention to the appended tokens moves them by 4e-3 even with BERT's initial weights


@torch.no_grad()
def prefix_change(hf, vocab: int, window: int) -> float:
    """How much the logits at the first positions of a fixed sequence move when tokens are appended,
    relative to their largest magnitude (at least 1): 0 up to rounding for a causal LM."""
    device = next(hf.parameters()).device
    n = max(2, min(16, window))
    ids = ((torch.arange(n, device=device) * 7 + 3) % vocab)[None]   # (1, n): a fixed sequence of the vocabulary
    full = hf(input_ids=ids, use_cache=False).logits.float()[:, :n // 2]
    head = hf(input_ids=ids[:, :n // 2], use_cache=False).logits.float()
    return float((full - head).abs().max() / full.abs().max().clamp(min=1.0))


def check_prefix(path: Path, model: "HFModel", vocab: int) -> None:
    """Refuse a loaded model whose logits at earlier positions move when tokens are appended: not an
    autoregressive law, whatever its config says."""
    change = prefix_change(model.hf, vocab, model.cfg.block_size)
    if not change <= PREFIX_RTOL:
        raise SpecsweepError(f"model.path {path}: not a causal LM: appending tokens moves the logits at earlier "
                             f"positions by {change:.1e} of their scale (a causal LM's move by rounding only, below "
                             f"{PREFIX_RTOL:g}): give a causal LM's checkpoint")


def load_checkpoint(path: str | Path, max_len: int | None = None, device: str = "cpu") -> tuple[HFModel, HFTokenizer]:
    """(HFModel, HFTokenizer) of the checkpoint in `path`, read offline, float32, eval mode."""
    path = Path(path)
    check_folder(path)
    t = offline_transformers()
    t.utils.logging.disable_progress_bar()   # its weight-loading bar says nothing a trial's log needs
    try:
        config = t.AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:   # noqa: BLE001 - an unreadable or unknown config
        raise SpecsweepError(f"model.path {path}: transformers cannot read its config ({str(e).splitlines()[0]})") \
            from None
    try:
        hf = t.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except ValueError as e:
        raise SpecsweepError(f"model.path {path}: architecture {config.model_type!r} is not a causal LM "
                             f"transformers can load ({str(e).splitlines()[0][:120]})") from None
    except Exception as e:   # noqa: BLE001 - damaged or unreadable weights (safetensors' SafetensorError, OSError)
        raise SpecsweepError(f"model.path {path}: its weights cannot be loaded ({type(e).__name__}: "
                             f"{(str(e).splitlines() or [''])[0][:120]}): replace the damaged or unreadable file") \
            from None
    try:
        tok = t.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:   # noqa: BLE001
        raise SpecsweepError(f"model.path {path}: transformers cannot load its tokenizer "
                             f"({str(e).splitlines()[0][:120]})") from None
    model = HFModel(hf.to(device), max_len)
    tokenizer = HFTokenizer(tok)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise SpecsweepError(f"model.path {path}: the tokenizer's ids go up to {tokenizer.vocab_size - 1}, the model's "
                             f"output has {model.cfg.vocab_size} rows")
    check_prefix(path, model, tokenizer.vocab_size)
    return model, tokenizer
