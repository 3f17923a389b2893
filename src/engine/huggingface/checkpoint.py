"""The tool's model as a transformers checkpoint: in memory (the library's loop runs it) and written
to a folder (a model from a folder loads it back); and transformers itself, imported offline.

`to_transformers(model)` converts the tool's `Transformer` into a `GPT2LMHeadModel` with the same
function: the default target is GPT-2's architecture without biases (learned positions, pre-LN
blocks, an erf-GELU MLP of width 4 d_model), so the weights are copied (Conv1D keeps nn.Linear's
weight transposed), every bias is zero and the head is untied. `tests/engine/huggingface/test_library_loop.py`
checks the logits equal the tool's eager forward at every position within float32 tolerance.

`export_checkpoint(model, tokenizer, folder)` writes the tool's `Transformer` as a GPT-2
checkpoint (`to_transformers`: the same logits) with a character-level tokenizer that
transformers loads (`AutoTokenizer`): one token per character, the tool's vocabulary in its
order, decoded by concatenation. Loading the export gives the tool's model back: the same
logits at every position, and the same counters for the same seed
(tests/engine/huggingface/test_folder_model.py).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # never a hub: the models are the tool's own
import torch

from ..errors import SpecsweepError
from ..models.model import Transformer
from ..models.tokenizer import CharTokenizer

MARKER = "specsweep.json"   # written by export_checkpoint: which of the tool's targets the folder holds


def offline_transformers():
    """The transformers module, imported offline (never a hub) and quiet."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import transformers
    transformers.logging.set_verbosity_error()   # its per-call notes (pad token, cache) say nothing here
    return transformers


def gpt2_config(model: Transformer):
    """The GPT2Config of the tool's model's shape: no token has a special role (no EOS stops a run)."""
    t = offline_transformers()
    c = model.cfg
    return t.GPT2Config(vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.d_model, n_layer=c.n_layer,
                        n_head=c.n_head, n_inner=4 * c.d_model, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                        scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False)


@torch.no_grad()
def to_transformers(model: Transformer):
    """The tool's Transformer as a GPT2LMHeadModel computing the same logits (eval mode, float32, on
    the model's device). Conv1D computes x @ W + b with W (in, out): nn.Linear's weight transposed."""
    t = offline_transformers()
    hf = t.GPT2LMHeadModel(gpt2_config(model)).eval()
    src, dst = model, hf.transformer
    dst.wte.weight.copy_(src.tok_emb.weight)
    dst.wpe.weight.copy_(src.pos_emb.weight)
    for a, b in zip(src.blocks, dst.h):
        b.ln_1.weight.copy_(a.ln1.weight)
        b.ln_1.bias.copy_(a.ln1.bias)
        b.ln_2.weight.copy_(a.ln2.weight)
        b.ln_2.bias.copy_(a.ln2.bias)
        b.attn.c_attn.weight.copy_(a.attn.qkv.weight.T)
        b.attn.c_proj.weight.copy_(a.attn.proj.weight.T)
        b.mlp.c_fc.weight.copy_(a.mlp[0].weight.T)
        b.mlp.c_proj.weight.copy_(a.mlp[2].weight.T)
        for conv in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj):
            conv.bias.zero_()
    dst.ln_f.weight.copy_(src.ln_f.weight)
    dst.ln_f.bias.copy_(src.ln_f.bias)
    hf.lm_head.weight.copy_(src.head.weight)
    hf.generation_config = generation_defaults(hf.generation_config)
    return hf.to(next(model.parameters()).device)


WINDOW_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")   # where configs keep theirs


def generation_defaults(gc):
    """A generation config with nothing of its own: no special tokens, no top-k or top-p cut."""
    gc = copy.deepcopy(gc)
    gc.bos_token_id = gc.eos_token_id = gc.pad_token_id = None
    gc.top_k, gc.top_p = 0, 1.0
    return gc


def char_tokenizer(chars: list[str]):
    """A transformers tokenizer of one token per character (ids in `chars`' order), decoded by
    concatenation, with no special tokens: a text with another character cannot be encoded."""
    t = offline_transformers()
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return t.PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False)


def export_checkpoint(model: Transformer, tokenizer: CharTokenizer, folder: str | Path, source: dict | None = None) -> Path:
    """Write the tool's model as a transformers GPT-2 checkpoint with a char-level tokenizer in
    `folder` (created; an existing non-empty folder is refused). `source` (e.g. the target's cache
    key) goes into the folder's specsweep.json."""
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SpecsweepError(f"{folder} exists and is not an empty folder: export into a new one")
    hf = to_transformers(model).cpu()
    hf.generation_config = offline_transformers().GenerationConfig()   # transformers' defaults: no special tokens
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    char_tokenizer(tokenizer.chars).save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps({"exported_by": "specsweep", **(source or {})}, indent=1) + "\n")
    return folder
