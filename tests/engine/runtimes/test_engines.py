"""Every engine computes what eager computes, and the loops on it keep the target's law.

1. Logits: at pass widths 1..17 (onnx; compiled: 1, 2, 9, 17 on the tiny target and 1, 9 at the
   default shape, each graph a compile of seconds;
   `make bench ARGS="+bench=roofline"` compares every width) and for tree masks (nodes in scratch slots, each
   seeing the prefix and its ancestors), a pass on each engine gives eager's logits within
   ATOL = 1e-4 (float32: the engines sum in other orders), pass after pass over one cache, on
   the tiny target and on a model of the default target's shape (random weights).
2. The law: the production loop (`generate_speculative`, `generate_tree`) run on each engine
   emits chars whose law, position by position given the emitted prefix, is the target's (a
   chi-square per position against the exact distributions, from eager full forwards; ALPHA as
   in test_exactness.py), for the bigram draft on each engine and a model draft (int8, itself on
   the engine) on onnx.
   The negative control: an engine that forgets to write a pass's keys into its cache.
3. Greedy: at temperature 0 the loops on each engine give the eager baseline's chars.
"""
from __future__ import annotations

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, generate_speculative, prefill
from src.engine.runtimes.engines import Engine
from src.engine.models.model import ModelConfig, Transformer
from src.engine.runtimes.onnx_engine import OnnxModel
from src.engine.decoding.tree import generate_tree
from tests.conftest import compose_cfg, draft_for, session_folder
from tests.engine.decoding.test_exactness import ALPHA, position_p_values

ATOL = 1e-4
ENGINES = [pytest.param("compiled", marks=pytest.mark.slow), "onnx"]   # make test-fast: onnx (no compiles)
CHAIN_WIDTHS = {"onnx": range(1, 18), "compiled": (1, 2, 9, 17)}   # compiled: seconds a graph to compile
DEFAULT_SHAPE_WIDTHS = {"onnx": range(1, 18), "compiled": (1, 9)}   # the default shape: minutes at 4 widths


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory):
    """Inductor's on-disk cache, shared by the session's workers: a graph one worker compiled is
    loaded, not compiled again, by the others."""
    return session_folder(tmp_path_factory, "engine_cache")


def engine(name: str, cache) -> Engine:
    """The engine as conf/engine/NAME.yaml ships it (its compile options)."""
    from omegaconf import OmegaConf
    from src.paths import CONF_DIR
    conf = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "engine" / f"{name}.yaml"))
    return Engine(conf["name"], conf.get("mode"), conf.get("options"), cache)


def default_shape_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=84, block_size=256, n_layer=4, n_head=4, d_model=128,
                                   dropout=0.0)).eval()


def tree_mask(P: int, parents: list[int], block: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slots (1+N,), mask (1+N, slots)) of a tree after a prefix of P-1 cached chars: the root
    (the last committed char) at slot P-1, node i in scratch slot block+i-1, each seeing the
    prefix and its ancestors (itself included)."""
    n = len(parents)
    at = torch.tensor([P - 1] + [block + i for i in range(n)])
    mask = torch.zeros(1 + n, slots, dtype=torch.bool)
    mask[:, :P - 1] = True
    for i in range(1 + n):
        j = i
        while j >= 0:
            mask[i, at[j]] = True
            j = parents[j - 1] if j > 0 else -1
    return at, mask


def compare_passes(model: Transformer, runner, prompt: list[int], widths, gen) -> float:
    """The largest |logit difference| between runner and eager over passes of each width in turn,
    each pass writing the cache the next one reads (the same ids into both)."""
    P, V, worst = len(prompt), model.cfg.vocab_size, 0.0
    with torch.no_grad():
        for w in widths:
            positions = prefill(runner, prompt)    # compiled: the eager model's own cache, filled once;
            if isinstance(runner, OnnxModel):      # onnx keeps a cache of its own: eager prefills its own
                prefill(model, prompt)
            start = P - 1
            for _ in range(2):                    # two passes: the second reads what the first wrote
                if start + w > model.cfg.block_size:
                    break
                x = torch.randint(0, V, (1, w), generator=gen)
                got = runner(x, positions[start:start + w])
                want = model(x, positions[start:start + w])
                worst = max(worst, (got - want).abs().max().item())
                start += w
    return worst


@pytest.mark.parametrize("name", ENGINES)
def test_chain_passes_equal_eager_on_the_tiny_target(tiny, engine_cache, name):
    _, _, target = tiny
    runner = engine(name, engine_cache).wrap(target.model)
    prompt = target.tokenizer.encode("the cat ").tolist()
    assert compare_passes(target.model, runner, prompt, CHAIN_WIDTHS[name], torch.Generator().manual_seed(1)) < ATOL


@pytest.mark.slow
@pytest.mark.parametrize("name", ENGINES)
def test_chain_passes_equal_eager_at_the_default_shape(engine_cache, name):
    model = default_shape_model()
    runner = engine(name, engine_cache).wrap(model)
    prompt = list(range(20))
    assert compare_passes(model, runner, prompt, DEFAULT_SHAPE_WIDTHS[name], torch.Generator().manual_seed(2)) < ATOL


@pytest.mark.parametrize("name", ENGINES)
def test_tree_passes_equal_eager(tiny, engine_cache, name):
    _, _, target = tiny
    model = target.model
    runner = engine(name, engine_cache).wrap(model)
    prompt = target.tokenizer.encode("the cat ").tolist()
    P, block, extra = len(prompt), model.cfg.block_size, 8
    for parents in ([0, 0, 1, 1, 2], [0, 1, 2, 3], [0, 0, 0, 0, 1, 2, 3, 4]):   # node i's parent (0: the root)
        at, mask = tree_mask(P, parents, block, block + extra)
        x = torch.randint(0, model.cfg.vocab_size, (1, 1 + len(parents)), generator=torch.Generator().manual_seed(3))
        pos = torch.tensor([P - 1] + [P - 1 + depth(parents, i + 1) for i in range(len(parents))])
        with torch.no_grad():
            prefill(runner, prompt, extra=extra)
            if isinstance(runner, OnnxModel):
                prefill(model, prompt, extra=extra)
            got = runner(x, pos, at, mask)
            want = model(x, pos, at, mask)
        assert (got - want).abs().max().item() < ATOL, parents


def depth(parents: list[int], node: int) -> int:
    d = 0
    while node:
        node, d = parents[node - 1], d + 1
    return d


def on_engine(tiny, name: str, draft_name: str, cache):
    """(engine, the tiny target on it, a fresh draft of conf/draft/DRAFT_NAME.yaml, its model on it too)."""
    cfg, corpus, target = tiny
    e = engine(name, cache)
    runner = e.wrap(target.model)
    draft = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={draft_name}"), target, corpus)
    e.wrap_draft(draft)
    return e, runner, draft


class ForgetfulOnnx(OnnxModel):
    """NEGATIVE CONTROL: an engine that never writes a pass's keys and values into its cache."""

    def __call__(self, idx, input_pos=None, slots=None, mask=None, *, return_hidden: bool = False):
        if self.kT is None:
            return super().__call__(idx, input_pos, slots, mask, return_hidden=return_hidden)
        kT, v = self.kT.copy(), self.v.copy()
        out = super().__call__(idx, input_pos, slots, mask, return_hidden=return_hidden)
        self.kT[...], self.v[...] = kT, v
        return out


def loop_law(target_model, runner, draft, prompt, k: int, n_chars: int, runs: int, tree=None) -> list:
    """Per emitted position 1..n_chars, the chi-square p-value of the chars the loop on `runner`
    emitted, against the target's exact distribution given each run's emitted prefix (eager)."""
    seqs = []
    for seed in range(runs):
        gen = torch.Generator().manual_seed(seed)
        g = (generate_speculative(runner, draft, prompt, n_chars, k, 1.0, gen, track_overlap=False) if tree is None
             else generate_tree(runner, draft, prompt, n_chars, tree, 1.0, gen, track_overlap=False))
        seqs.append(g.tokens)
    chars = torch.tensor(seqs)                                                 # (runs, n_chars)
    P = len(prompt)
    with torch.no_grad(), target_model.cache_set_aside():
        full = torch.cat([torch.tensor([prompt] * runs), chars], 1)
        p = torch.softmax(target_model(full), -1)[:, P - 1:P - 1 + n_chars]    # (runs, n_chars, V)
    return position_p_values(chars, torch.ones_like(chars, dtype=torch.bool), p)


# the bigram on both engines; the int8 draft (its own model on the engine too) on onnx: on the
# compiled engine its passes' logits and its greedy loops are checked, not its law (minutes of compiles)
@pytest.mark.parametrize("name,draft_name", [pytest.param("compiled", "bigram", marks=pytest.mark.slow),
                                             ("onnx", "bigram"), pytest.param("onnx", "int8", marks=pytest.mark.slow)])
def test_the_loop_on_each_engine_keeps_the_targets_law(tiny, engine_cache, name, draft_name):
    cfg, _, target = tiny
    e, runner, draft = on_engine(tiny, name, draft_name, engine_cache)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    for k, tree in ((2, None), (2, (2, 1))):
        results = loop_law(target.model, runner, draft, prompt, k, 6, 1500, tree)
        assert [m for m, _ in results] == list(range(1, 7))
        for m, pv in results:
            assert pv > ALPHA, f"{name}/{draft_name} k={k} tree={tree}: position {m} p = {pv:.2e}"


def test_the_law_test_catches_an_engine_that_forgets_its_cache(tiny, engine_cache):
    cfg, corpus, target = tiny
    runner = ForgetfulOnnx(target.model, "forgetful", engine_cache)
    draft = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram"), target, corpus)
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    results = loop_law(target.model, runner, draft, prompt, 2, 6, 1500)
    assert min(pv for _, pv in results) < 1e-6, results


@pytest.mark.parametrize("name", ENGINES)
@pytest.mark.parametrize("draft_name", ["bigram", "int8"])
def test_greedy_loops_on_each_engine_equal_the_eager_baseline(tiny, engine_cache, name, draft_name):
    cfg, _, target = tiny
    e, runner, draft = on_engine(tiny, name, draft_name, engine_cache)
    prompt = target.tokenizer.encode(cfg.prompt)
    base = generate_baseline(target.model, prompt, 60, 0.0, torch.Generator().manual_seed(0))
    assert generate_baseline(runner, prompt, 60, 0.0, torch.Generator().manual_seed(0)).tokens == base.tokens
    for k in (1, 4):
        spec = generate_speculative(runner, draft, prompt, 60, k, 0.0, torch.Generator().manual_seed(0))
        assert spec.tokens == base.tokens, k
    tree = generate_tree(runner, draft, prompt, 60, (1, 1, 1), 0.0, torch.Generator().manual_seed(0))
    assert tree.tokens == base.tokens
    assert not any(r.fallback for r in e.runners)   # the target and the int8 draft both ran on the engine
