"""Models from a folder (src/engine/huggingface/folder_model.py): the tool's target exported as a transformers
checkpoint loads back with the same logits and the same counters; tiny GPT-2, Llama and Qwen2
checkpoints with random weights, made here (no hub), run the tool's chain and tree loops exactly.

Exactness per position: the chars the loop emits on each architecture, position by position
given the emitted prefix, against the model's exact distribution (a chi-square test per
position at p < ALPHA = 1e-4; 8 loops (3 architectures with the bigram, Llama over its
DynamicCache and over the static cache engine=compiled uses again in the rewind's fast test, 2
with the int8 copy, a tree on Llama) x 6 positions: a correct loop fails with probability < 0.5%).
The negative controls: the production code with its rewind removed (a DynamicCache not cropped,
a static cache whose write count is not set back), on the Llama checkpoint, where a stale cache
moves the law by more than 0.1 (asserted: GPT-2's random weights at their initial scale move it
by at most 0.005 and could not fail a rewind test), and a tree mask handed over as 0/1 instead of
0/-inf: the same test must reject each at p < 1e-6; the first's cached passes, and those of a
tree whose accepted path is not moved in the cache, differ from the full forward. The compiled engine on Llama: its passes equal the full
forward and its greedy loops eager decoding (GPT-2's compiled trials: tests/trial/test_folder_target.py).
"""
from __future__ import annotations

import json

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, generate_speculative, prefill
from src.engine.decoding.tree import Tree, TreeMasks, commit_path, generate_tree, tree_verify
from src.engine.drafts import BigramDraft
from src.engine.errors import SpecsweepError
from src.engine.huggingface.checkpoint import MARKER, char_tokenizer, export_checkpoint, offline_transformers
from src.engine.huggingface.folder_model import HFModel, load_checkpoint
from tests.chisquare import varying_multinomial_test
from tests.engine.runtimes.test_engines import engine, engine_cache  # noqa: F401 - a fixture

ALPHA = 1e-4
ARCHS = ("gpt2", "llama", "qwen2")


def tiny_config(arch: str, vocab: int):
    """A 2-layer config of `arch` with weights drawn wide (initializer_range 0.5): distributions
    peaked and context-dependent, so a loop that attends to the wrong cache entries shows."""
    t = offline_transformers()
    common = dict(vocab_size=vocab, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                  initializer_range=0.5, tie_word_embeddings=False)
    if arch == "gpt2":
        return t.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=96, **common)
    if arch == "llama":
        return t.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, max_position_embeddings=96, **common)
    return t.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=96, **common)


@pytest.fixture(scope="module")
def checkpoints(tiny, tmp_path_factory):
    """arch -> folder of a random-weight checkpoint with the tiny target's char tokenizer, and one
    output row more: room for a special token the architecture's tokenizer class adds (Qwen2's
    adds <|endoftext|>), as real checkpoints have rows beyond their tokenizer's."""
    _, _, target = tiny
    t = offline_transformers()
    out = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp(arch)
        torch.manual_seed(0)
        t.AutoModelForCausalLM.from_config(tiny_config(arch, target.tokenizer.vocab_size + 1)).save_pretrained(folder)
        char_tokenizer(target.tokenizer.chars).save_pretrained(folder)
        out[arch] = folder
    return out


@pytest.fixture(scope="module")
def exported(tiny, tmp_path_factory):
    _, _, target = tiny
    return export_checkpoint(target.model, target.tokenizer, tmp_path_factory.mktemp("export") / "tiny",
                             {"target_key": target.key})


def bigram(tiny, model):
    cfg, corpus, target = tiny
    return BigramDraft(model, target.tokenizer.encode(corpus.split(0.1)[0]), alpha=0.5)


class NoRewind(HFModel):
    """NEGATIVE CONTROL: never drops cached entries, so a pass after a rejection sees stale keys."""

    def setup_cache(self, batch: int = 1, extra: int = 0) -> None:
        super().setup_cache(batch, extra)
        self.cache.crop = lambda n: None


class NoRewindStatic(HFModel):
    """NEGATIVE CONTROL: a static cache (engine=compiled's) whose write count is set back only for
    a new sequence, never after a rejection: a pass after one writes after the rejected drafts
    and attends to them."""

    def __init__(self, hf):
        super().__init__(hf)
        self.use_static_cache()

    def set_write_count(self, start: int) -> None:
        if start == 0:
            super().set_write_count(0)


def cached_vs_full(model, ids: list[int], probs: bool = False) -> float:
    """Largest |logit difference| (probs: |probability difference|) between the cached passes of a
    loop that rewinds (5 drafts rejected, then a pass of 4 from the same position: a stale entry
    stays in the slot after it) and one full forward over the ids those passes saw."""
    P = 8
    model.setup_cache()
    pos = torch.arange(len(ids))
    with torch.no_grad():
        model(torch.tensor([ids[:P]]), pos[:P])
        model(torch.tensor([[9] * 5]), pos[P:P + 5])                        # drafts that get rejected
        got = model(torch.tensor([ids[P:P + 4]]), pos[P:P + 4])            # the rewind: position P again
        with model.cache_set_aside():
            want = model(torch.tensor([ids[:P + 4]]))[:, P:]
    if probs:
        got, want = torch.softmax(got, -1), torch.softmax(want, -1)
    return (got - want).abs().max().item()


def test_an_export_loads_back_with_the_same_tokenizer_and_logits(tiny, exported):
    cfg, corpus, target = tiny
    model, tok = load_checkpoint(exported)
    text = corpus.text[:500]
    assert tok.encode(text).tolist() == target.tokenizer.encode(text).tolist() and tok.decode(tok.encode(text)) == text
    assert tok.chars == target.tokenizer.chars and model.cfg.vocab_size == target.model.cfg.vocab_size
    assert model.cfg.block_size == target.model.cfg.block_size
    assert json.loads((exported / MARKER).read_text())["target_key"] == target.key
    ids = target.tokenizer.encode(text[:64]).unsqueeze(0)
    with torch.no_grad(), target.model.cache_set_aside():
        assert (model(ids) - target.model(ids)).abs().max().item() < 1e-4
    assert cached_vs_full(model, ids[0].tolist()) < 1e-4
    with pytest.raises(SpecsweepError, match="cannot encode"):
        tok.encode("the cat \u2603")                                        # a char outside the vocabulary


def test_the_export_reproduces_the_tool_models_counters_for_the_same_seed(tiny, exported):
    cfg, _, target = tiny
    model, _ = load_checkpoint(exported)
    prompt = target.tokenizer.encode(cfg.prompt)
    for k in (1, 4):
        for temperature in (1.0, 0.0):
            runs = [generate_speculative(m, bigram(tiny, m), prompt, 60, k, temperature,
                                         torch.Generator().manual_seed(5)) for m in (target.model, model)]
            mine, theirs = runs
            assert (mine.tokens, mine.target_passes, mine.chars_emitted, mine.passes_log) == \
                (theirs.tokens, theirs.target_passes, theirs.chars_emitted, theirs.passes_log), (k, temperature)
    base = [generate_baseline(m, prompt, 60, 1.0, torch.Generator().manual_seed(5)).tokens for m in (target.model, model)]
    assert base[0] == base[1]


@pytest.mark.parametrize("arch", ARCHS)
def test_cached_passes_with_rewinds_equal_the_full_forward(tiny, checkpoints, arch):
    _, corpus, target = tiny
    ids = target.tokenizer.encode(corpus.text[:40]).tolist()
    model, _ = load_checkpoint(checkpoints[arch])
    assert cached_vs_full(model, ids) < 1e-4
    broken = NoRewind(model.hf)                                             # negative control
    assert cached_vs_full(broken, ids) > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_a_static_cache_with_rewinds_equals_the_full_forward(tiny, checkpoints, arch):
    """engine=compiled's cache (transformers' StaticCache, rewound by setting its write count back),
    run eager; the compiled passes over it are checked in test_the_compiled_engine_..."""
    _, corpus, target = tiny
    ids = target.tokenizer.encode(corpus.text[:40]).tolist()
    model, _ = load_checkpoint(checkpoints[arch])
    model.use_static_cache()
    assert cached_vs_full(model, ids) < 1e-4
    assert cached_vs_full(NoRewindStatic(model.hf), ids) > 1e-2             # negative control


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama"])   # GPT-2 compiled: the export's trials (tests/trial/test_folder_target.py)
def test_the_compiled_engine_runs_a_model_from_a_folder_as_eager_does(tiny, checkpoints, engine_cache, arch):
    """Its passes over the static cache with rewinds equal the full forward; greedy, its baseline
    and its chains (k = 1, 3) emit eager decoding's tokens; one graph per pass width, none rerun.
    One architecture: about 45 s of compiles each (the static cache itself is checked eager on
    all three above, and every compiled pass's first call against eager by the engine)."""
    cfg, corpus, target = tiny
    ids = target.tokenizer.encode(corpus.text[:40]).tolist()
    model, tok = load_checkpoint(checkpoints[arch])
    prompt = tok.encode(cfg.prompt)
    base = generate_baseline(model, prompt, 40, 0.0, torch.Generator().manual_seed(0)).tokens
    e = engine("compiled", engine_cache)
    runner = e.wrap(model)
    assert runner.model.static and not model.static and cached_vs_full(runner, ids) < 1e-4   # a twin: model untouched
    assert generate_baseline(runner, prompt, 40, 0.0, torch.Generator().manual_seed(0)).tokens == base
    for k in (1, 3):
        assert generate_speculative(runner, bigram(tiny, runner), prompt, 40, k, 0.0,
                                    torch.Generator().manual_seed(0)).tokens == base, k
    widths = {8, 5, 4, len(prompt) - 1, 1, 2}   # cached_vs_full's, the prefill (the prompt less its last), k + 1
    assert {key[0][1] for key in runner.compile_s} == widths and not runner.fallback


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_speculative_equals_greedy_decoding(tiny, checkpoints, arch):
    """Chains of k = 1 and 3, and trees of widths (2, 1) and (3, 2, 1)."""
    cfg, _, target = tiny
    model, tok = load_checkpoint(checkpoints[arch])
    prompt = tok.encode(cfg.prompt)
    base = generate_baseline(model, prompt, 40, 0.0, torch.Generator().manual_seed(0)).tokens
    for k in (1, 3):
        assert generate_speculative(model, bigram(tiny, model), prompt, 40, k, 0.0,
                                    torch.Generator().manual_seed(0)).tokens == base, k
    for widths in ((2, 1), (3, 2, 1)):
        assert generate_tree(model, bigram(tiny, model), prompt, 40, widths, 0.0,
                             torch.Generator().manual_seed(0)).tokens == base, widths


def loop_law(model, draft, prompt: list[int], k: int, n_chars: int, runs: int,
             widths: tuple | None = None) -> list[tuple[int, float]]:
    """(position, p-value) of the loop's emitted chars (the chain loop drafting k, or the tree loop
    of `widths`) against the model's exact law given each prefix."""
    if widths is None:
        seqs = [generate_speculative(model, draft, prompt, n_chars, k, 1.0, torch.Generator().manual_seed(s),
                                     track_overlap=False).tokens for s in range(runs)]
    else:
        seqs = [generate_tree(model, draft, prompt, n_chars, widths, 1.0, torch.Generator().manual_seed(s),
                              track_overlap=False).tokens for s in range(runs)]
    chars = torch.tensor(seqs)
    P = len(prompt)
    with torch.no_grad(), model.cache_set_aside():
        p = torch.softmax(model(torch.cat([torch.tensor([prompt] * runs), chars], 1)), -1)[:, P - 1:P - 1 + n_chars]
    return [(m + 1, varying_multinomial_test(chars[:, m], p[:, m])[2]) for m in range(n_chars)]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_the_loop_keeps_the_models_law_at_every_position(tiny, checkpoints, arch):
    cfg, _, target = tiny
    model, tok = load_checkpoint(checkpoints[arch])
    prompt = tok.encode(cfg.prompt).tolist()
    for m, pv in loop_law(model, bigram(tiny, model), prompt, 2, 6, 600):
        assert pv > ALPHA, f"{arch}: position {m} p = {pv:.2e}"


REWIND_RUNS = 200   # loops per law test of the rewind on Llama: about 2 s; the missing rewind is caught at
# p ~ 1e-9 there (600 runs: below 1e-200), the loop that rewinds passes at p > 0.05 at every position


def missing_rewind(monkeypatch, cache: str) -> None:
    """The production code with its rewind removed: the DynamicCache never cropped (hf_model.rewind a
    no-op), or the static cache's write count set back for a new sequence only, never after a
    rejection (engine=compiled's rewind)."""
    import src.engine.huggingface.folder_model as hf_model
    if cache == "dynamic":
        monkeypatch.setattr(hf_model, "rewind", lambda c, length: None)
    else:
        real = HFModel.set_write_count
        monkeypatch.setattr(HFModel, "set_write_count", lambda self, start: real(self, 0) if start == 0 else None)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_loop_that_does_not_rewind_its_cache_is_caught_on_a_rotary_checkpoint(tiny, checkpoints, monkeypatch, cache):
    """The rewind's guard, on the eager adapter's DynamicCache and engine=compiled's static cache
    (run eager: the compiled graph runs over the same cache, its rewind set outside it). It runs on
    the Llama checkpoint (rotary positions, weights drawn wide), where a stale cache changes the law:
    without the rewind, the pass after 5 rejected drafts moves some probability by more than 0.1
    (the precondition, asserted: a checkpoint where stale entries move them by at most 0.005, as
    GPT-2's random weights at their initial scale do, could not fail this test). The loop that
    rewinds keeps the model's law at every position (p > ALPHA); with the rewind removed from the
    production code (`missing_rewind`) the same test rejects it at p < 1e-6."""
    cfg, corpus, target = tiny
    model, tok = load_checkpoint(checkpoints["llama"])
    if cache == "static":
        model.use_static_cache()
    prompt = tok.encode(cfg.prompt).tolist()
    for m, pv in loop_law(model, bigram(tiny, model), prompt, 2, 6, REWIND_RUNS):
        assert pv > ALPHA, f"{cache} cache: position {m} p = {pv:.2e}"
    missing_rewind(monkeypatch, cache)
    assert cached_vs_full(model, target.tokenizer.encode(corpus.text[:40]).tolist(), probs=True) > 0.1
    results = loop_law(model, bigram(tiny, model), prompt, 2, 6, REWIND_RUNS)
    assert min(pv for _, pv in results) < 1e-6, results


def tree_of(tokens: list[int], parents: list[int]) -> Tree:
    """A Tree of root tokens[0] and nodes tokens[1:] with the given parents (breadth-first)."""
    depth = [0]
    for q in parents[1:]:
        depth.append(depth[q] + 1)
    children = [[i for i, q in enumerate(parents) if q == j] for j in range(len(parents))]
    return Tree(tokens, parents, depth, children, [None] * len(parents), [1.0] * len(parents))


def tree_vs_full(model, ids: list[int], parents: list[int]) -> float:
    """Largest |logit difference| between one tree pass after ids[:P] (then its accepted path, the
    last leaf's, committed and a pass after it) and full forwards over each node's own path."""
    P, n = 8, len(parents)
    tokens = ids[P - 1:P - 1 + n]                      # the root, then one token per node
    tree = tree_of(tokens, parents)
    positions = prefill(model, ids[:P], extra=n)
    with torch.no_grad():
        got = tree_verify(model, tree, P, positions, TreeMasks(positions.device), 1.0).log()   # (n, V)
        path = []
        node = n - 1
        while node:
            path.insert(0, node)
            node = parents[node]
        commit_path(model, path, P, positions)
        nxt = ids[:P] + [tokens[i] for i in path] + [3]
        after = model(torch.tensor([[3]]), positions[len(nxt) - 1:len(nxt)])[0, -1]
        with model.cache_set_aside():
            worst = 0.0
            for i in range(n):
                line, node = [], i
                while node:
                    line.insert(0, tokens[node])
                    node = parents[node]
                want = torch.log_softmax(model(torch.tensor([ids[:P] + line]))[0, -1], -1)
                worst = max(worst, (got[i] - want).abs().max().item())
            want = model(torch.tensor([nxt]))[0, -1]
    return max(worst, (after - want).abs().max().item())


@pytest.mark.parametrize("arch", ARCHS)
def test_a_tree_pass_and_its_committed_path_equal_full_forwards(tiny, checkpoints, arch):
    """The tree's mask, given to the architecture as a 4D mask: every node's distribution equals a
    full forward over its own path; after the deepest path is committed (moved in the cache) the
    next pass equals a full forward over the committed tokens. Negative control: a cache whose
    path is not moved."""
    _, corpus, target = tiny
    ids = target.tokenizer.encode(corpus.text[:40]).tolist()
    model, _ = load_checkpoint(checkpoints[arch])
    parents = [-1, 0, 0, 1, 2, 2, 5]                    # two branches, the last leaf three deep on the second
    assert model.takes_tree_mask()
    assert tree_vs_full(model, ids, parents) < 1e-4
    model.move_cache = lambda src, dst: None            # negative control: the path stays in its scratch slots
    assert tree_vs_full(model, ids, parents) > 1e-2


@pytest.mark.slow
def test_the_tree_loop_keeps_the_models_law_and_catches_a_mask_that_does_not_mask(tiny, checkpoints, monkeypatch):
    """The tree loop (widths (2, 1)) on the Llama checkpoint with its int8-kernel copy as the draft
    (kept often, so paths of depth 2 are moved in the cache often): the law per position. Negative
    control: the tree's mask handed over as 0/1 added to the scores instead of 0/-inf (a boolean
    mask taken for an additive one), so every node sees the whole tree, its future included; the
    probe would refuse such an adapter, so it is told the mask works."""
    import src.engine.huggingface.folder_model as hf_model
    from src.engine.drafts import Int8KernelDraft
    cfg, corpus, target = tiny
    model, tok = load_checkpoint(checkpoints["llama"])
    draft = Int8KernelDraft(model, tok.encode(corpus.split(0.1)[0]), engine="x86", calibration_windows=8)
    prompt = tok.encode(cfg.prompt).tolist()
    for m, pv in loop_law(model, draft, prompt, 0, 6, 600, widths=(2, 1)):
        assert pv > ALPHA, f"tree: position {m} p = {pv:.2e}"
    monkeypatch.setattr(hf_model, "additive", lambda allowed, dtype: allowed.to(dtype)[None, None])
    model._tree_mask = True
    results = loop_law(model, draft, prompt, 0, 6, 300, widths=(2, 1))
    assert min(pv for _, pv in results) < 1e-6, results


def test_batches_and_an_architecture_without_a_4d_mask_are_refused_in_one_line(checkpoints):
    model, _ = load_checkpoint(checkpoints["gpt2"])
    with pytest.raises(SpecsweepError, match="one sequence at a time"):
        model.setup_cache(4)
    model.hf.forward = ignoring_the_mask(model.hf.forward)      # an architecture that builds its own mask
    with pytest.raises(SpecsweepError, match="does not honour a custom 4D attention mask"):
        model.setup_cache(1, extra=4)
    model.setup_cache(1)                                        # a chain still runs


def ignoring_the_mask(forward):
    def run(*args, attention_mask=None, **kwargs):
        return forward(*args, **kwargs)
    return run


def test_folders_that_are_not_checkpoints_are_refused(tmp_path, checkpoints):
    cases = {"missing": tmp_path / "nosuch", "a file": tmp_path / "file.txt", "empty": tmp_path / "empty"}
    cases["a file"].write_text("x")
    cases["empty"].mkdir()
    messages = {"missing": "does not exist", "a file": "is not a folder", "empty": "no config.json"}
    for name, path in cases.items():
        with pytest.raises(SpecsweepError, match=messages[name]):
            load_checkpoint(path)
    no_tok = tmp_path / "no_tokenizer"
    no_tok.mkdir()
    for f in checkpoints["gpt2"].iterdir():
        if f.name in ("config.json", "model.safetensors"):
            (no_tok / f.name).write_bytes(f.read_bytes())
    with pytest.raises(SpecsweepError, match="no tokenizer"):
        load_checkpoint(no_tok)
    seq2seq = tmp_path / "t5"                                               # an architecture that is not a causal LM
    seq2seq.mkdir()
    offline_transformers().T5Config(vocab_size=32, d_model=16, num_layers=1, num_heads=2, d_ff=32).save_pretrained(seq2seq)
    (seq2seq / "model.safetensors").write_bytes(b"")
    (seq2seq / "tokenizer.json").write_text("{}")
    with pytest.raises(SpecsweepError, match="not a causal LM"):
        load_checkpoint(seq2seq)


def test_an_export_refuses_a_folder_in_use(tiny, exported):
    _, _, target = tiny
    with pytest.raises(SpecsweepError, match="not an empty folder"):
        export_checkpoint(target.model, target.tokenizer, exported)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_the_targets_int8_kernel_copy_drafts_for_a_model_from_a_folder(tiny, checkpoints, arch):
    """draft=int8_kernels on a model from a folder: every projection runs int8 kernels (GPT-2's
    Conv1D converted to Linear first), and the loop with it keeps the target's law per position
    and greedy decoding's tokens."""
    from src.engine.drafts import Int8KernelDraft
    from src.engine.models.int8_linear import Int8Linear
    cfg, corpus, target = tiny
    model, tok = load_checkpoint(checkpoints[arch])
    draft = Int8KernelDraft(model, tok.encode(corpus.split(0.1)[0]), engine="x86", calibration_windows=8)
    n_proj = 4 if arch == "gpt2" else 7                                    # per layer: GPT-2's Conv1D, Llama's Linear
    assert draft.describe()["int8_linears"] == 2 * n_proj + 1              # 2 layers and the output layer
    assert sum(isinstance(m, Int8Linear) for m in draft.model.modules()) == 2 * n_proj + 1
    prompt = tok.encode(cfg.prompt)
    for m, pv in loop_law(model, draft, prompt.tolist(), 2, 6, 600):
        assert pv > ALPHA, f"{arch} int8: position {m} p = {pv:.2e}"
    base = generate_baseline(model, prompt, 40, 0.0, torch.Generator().manual_seed(0)).tokens
    assert generate_speculative(model, draft, prompt, 40, 3, 0.0, torch.Generator().manual_seed(0)).tokens == base


def test_the_sparse_bigram_is_the_dense_one_and_a_subword_vocabulary_needs_no_table(tiny):
    """Above DENSE_MAX tokens the bigram keeps sparse counts and builds rows when met: forced on
    the tiny vocabulary, every row, CDF, batch of probs and proposal equals the dense table's;
    at GPT-2's 50,257 tokens it builds without a V x V table."""
    cfg, corpus, target = tiny
    ids = target.tokenizer.encode(corpus.split(0.1)[0])
    dense, sparse = (BigramDraft(target.model, ids, alpha=0.5, dense_max=m) for m in (10 ** 6, 1))
    assert not dense.sparse and sparse.sparse
    for temperature in (1.0, 0.7):
        dense._tables(temperature), sparse._tables(temperature)
        for prev in range(target.tokenizer.vocab_size):
            assert torch.allclose(torch.tensor(sparse._rows[prev]), torch.tensor(dense._rows[prev]), atol=1e-7)
            assert torch.allclose(torch.tensor(sparse._cdf[prev]), torch.tensor(dense._cdf[prev]), atol=1e-12)
        idx = ids[:64].view(4, 16)
        assert torch.allclose(sparse.probs(idx, temperature), dense.probs(idx, temperature), atol=1e-7)
        prompt = target.tokenizer.encode(cfg.prompt).tolist()
        a, b = (d.propose(prompt, 8, temperature, torch.Generator().manual_seed(3)) for d in (dense, sparse))
        assert a[0] == b[0]
    big = BigramDraft(type("M", (), {"cfg": type("C", (), {"vocab_size": 50257, "block_size": 1024})})(),
                      torch.randint(0, 50257, (200_000,), generator=torch.Generator().manual_seed(0)), alpha=0.5)
    assert big.sparse and big.describe()["table_bytes"] < 10 * 2 ** 20          # not the 10 GB of V x V
    row = big.next_probs([123], 1.0)
    assert len(row) == 50257 and abs(sum(row) - 1) < 1e-4


def save_folder(folder, model, chars):
    """`model` (random weights) and a char tokenizer of `chars`, as save_pretrained writes them."""
    model.save_pretrained(folder)
    char_tokenizer(chars).save_pretrained(folder)
    return folder


def encoders(tmp_path, chars):
    """name -> folder of a tiny checkpoint that is not a causal LM, and two that are (BERT as a
    decoder, a causal XLM): random weights at the architectures' own initial scale."""
    t = offline_transformers()
    torch.manual_seed(0)
    bert = dict(vocab_size=len(chars), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=96)
    xlm = dict(vocab_size=len(chars), emb_dim=32, n_layers=2, n_heads=4, max_position_embeddings=96, is_decoder=True)
    models = {"bert_mlm": t.BertForMaskedLM(t.BertConfig(**bert)),              # an encoder, saved as one
              "bert_encoder": t.BertLMHeadModel(t.BertConfig(**bert)),          # bert's causal class, is_decoder false
              "xlm_bidirectional": t.XLMWithLMHeadModel(t.XLMConfig(causal=False, **xlm)),   # says is_decoder, attends both ways
              "bert_decoder": t.BertLMHeadModel(t.BertConfig(is_decoder=True, **bert)),
              "xlm_causal": t.XLMWithLMHeadModel(t.XLMConfig(causal=True, **xlm))}
    return {name: save_folder(tmp_path / name, m, chars) for name, m in models.items()}


def test_a_model_that_is_not_a_causal_lm_is_refused_by_its_config_or_its_prefix_test(tiny, tmp_path, checkpoints):
    """A folder is measured only if its config says it decodes causally (an encoder saved as
    BertForMaskedLM, a bert whose config does not say is_decoder: true: refused before any weight
    is read) and the loaded model passes the prefix test: its logits at earlier positions stay
    within PREFIX_RTOL of their scale when tokens are appended (an XLM with causal=false says
    is_decoder but attends both ways: refused when loaded). BERT as a decoder, a causal XLM and
    the GPT-2, Llama and Qwen2 checkpoints load, their prefix change at rounding level."""
    from src.engine.huggingface.folder_model import PREFIX_RTOL, check_folder, prefix_change
    _, _, target = tiny
    folders = encoders(tmp_path, target.tokenizer.chars)
    for name, message in (("bert_mlm", "saved as BertForMaskedLM, not a causal LM"),
                          ("bert_encoder", "decodes causally only as a decoder, and its config does not say "
                                           "is_decoder: true")):
        with pytest.raises(SpecsweepError, match=message):
            check_folder(folders[name])                     # the config alone: before any weight is read
    check_folder(folders["xlm_bidirectional"])              # its config says is_decoder ...
    with pytest.raises(SpecsweepError, match=r"not a causal LM: appending tokens moves the logits at earlier "
                                             r"positions by [0-9.]+e-0[0-3] of their scale"):
        load_checkpoint(folders["xlm_bidirectional"])       # ... its prefix test says otherwise
    for folder in (folders["bert_decoder"], folders["xlm_causal"], *checkpoints.values()):
        model, tok = load_checkpoint(folder)
        assert prefix_change(model.hf, tok.vocab_size, model.cfg.block_size) < PREFIX_RTOL / 10, folder.name


def test_an_unreadable_checkpoint_folder_or_file_is_refused_in_one_line(checkpoints, tmp_path, monkeypatch):
    """A folder without read permission, or a weights file in it, is refused before anything is
    loaded (PermissionError, not a traceback). Root reads any file whatever its mode: there the
    denial is simulated where the check asks (os.access for the folder, open for the file); as
    another user the modes are set for real too."""
    import builtins
    import os
    import shutil
    import src.engine.huggingface.folder_model as hf_model
    folder = tmp_path / "llama"
    shutil.copytree(checkpoints["llama"], folder)
    weights = folder / "model.safetensors"
    real_access, real_open = os.access, builtins.open
    monkeypatch.setattr(hf_model.os, "access", lambda p, mode: False if str(p) == str(folder) else real_access(p, mode))
    with pytest.raises(SpecsweepError, match="cannot be read \\(permission denied\\)"):
        load_checkpoint(folder)
    monkeypatch.setattr(hf_model.os, "access", real_access)

    def denied(path, *args, **kwargs):
        if str(path) == str(weights):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", denied)
    with pytest.raises(SpecsweepError, match="model.safetensors cannot be read \\(Permission denied\\)"):
        load_checkpoint(folder)
    monkeypatch.setattr(builtins, "open", real_open)
    if os.geteuid() != 0:
        for path, message in ((weights, "model.safetensors cannot be read"), (folder, "permission denied")):
            path.chmod(0)
            try:
                with pytest.raises(SpecsweepError, match=message):
                    load_checkpoint(folder)
            finally:
                path.chmod(0o700 if path.is_dir() else 0o600)
