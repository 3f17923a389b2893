"""A batch of B sequences decodes each sequence exactly as if it were alone (src/engine/decoding/batch.py).

1. No leakage: a (B, T) pass with each row at its own positions over a cache of B rows gives each
   row the logits of that row's own one-sequence pass (eager, onnx; the compiled engine too, slow).
   Negative control (onnx): a batch mask that lets every row see as many cached slots as the
   longest row (a shorter row then attends to slots it never wrote).
2. The pieces: `draw_rows` draws what `draw` draws with the same uniform; `accept_rows` decides
   each row as `speculative_accept` decides it alone, with that row's uniforms.
3. The law, per sequence: the production batch loop at B = 4, its rows started from different
   prompts (so their acceptance lengths differ pass by pass), emits for sequence 0 and sequence
   B-1 chars whose law at every position of a pass, the bonus position k+1 included, is the
   target's given the emitted prefix (a chi-square per position against exact distributions;
   ALPHA as in test_exactness.py), for a table draft (bigram) and a model draft (int4: the tiny
   target's int8 copy accepts nearly every char, so its rows would rarely differ); the bigram's
   batch on the onnx engine too (its own batched graphs).
   Negative control: a batch cut at its shortest accepted prefix that then draws the residual
   of the wrong position for the rows that accepted more (rejected at p < 1e-6).
4. Independence between sequences: rows 0 and B-1 started from one prompt emit first chars
   that collide (x0 == x_{B-1}) as often as two independent draws from the target's law do
   (a z-test on the collision count against its exact mean and variance), for the bigram, int4
   and a near-uniform bigram whose drafts are mostly rejected. Negative control: sequences that
   share one acceptance uniform per pass (rejected at p < 1e-6 with the near-uniform bigram).
5. Greedy: at temperature 0 the batched baseline and the batched speculative loop give each
   sequence the one-sequence greedy baseline's chars, on eager, onnx and compiled (slow).

False-failure rate: under 30 tests at ALPHA = 1e-4 here: < 0.3% for a random seed; the seeds are fixed.
"""
from __future__ import annotations

import copy
import math
from collections import defaultdict

import numpy as np
import pytest
import torch

import src.engine.decoding.batch as batch_mod
from src.engine.decoding.batch import generate_baseline_batch, generate_speculative_batch, stream_generators
from src.engine.decoding.decode import generate_baseline, prefill
from src.engine.sampling import (UniformBuffer, accept_rows, draw, draw_rows, residual_weights, speculative_accept,
                                 uniforms)
from tests.chisquare import varying_multinomial_test
from tests.conftest import compose_cfg, draft_for
from tests.engine.runtimes.test_engines import engine, engine_cache  # noqa: F401  (engine_cache: the session's compile cache)
from tests.engine.decoding.test_exactness import ALPHA

B = 4
RUNS = 1500


def batch_draft(tiny, name: str, *overrides: str):
    cfg, corpus, target = tiny
    return draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}", *overrides), target, corpus)


# a near-uniform bigram: most drafts are rejected, so nearly every pass draws a residual (where a
# shared uniform shows: two rows with one prompt then draw the same residual char)
FLAT = ("bigram", "draft.alpha=1000")


def two_prompts(tiny) -> list[list[int]]:
    """B prompts of the config prompt's length: rows 0 and B-1 from two different windows of the
    corpus (unequal acceptance), the rows between them from the config prompt."""
    cfg, corpus, target = tiny
    P = len(cfg.prompt)
    first = target.tokenizer.encode(cfg.prompt).tolist()
    other = target.tokenizer.encode(corpus.text[5000:5000 + P]).tolist()
    return [first] + [first] * (B - 2) + [other]


# ---- 1. no leakage -----------------------------------------------------------------------------

def ragged_passes_match(model, runner, prompts, gen) -> float:
    """The largest |logit difference| between row b of ragged batch passes on `runner` and the
    same inputs passed alone, over an eager copy of the model holding row b's cached prefix only;
    three passes, after each of which row b keeps b+1 of its inputs (the rows move apart)."""
    V, worst = model.cfg.vocab_size, 0.0
    alone = copy.deepcopy(model)
    cached = [p[:-1] for p in prompts]   # per row: the ids its cache holds, at positions 0, 1, ...
    with torch.no_grad():
        positions = batch_mod.prefill_batch(runner, prompts)
        for w in (3, 2, 3):
            x = torch.randint(0, V, (len(prompts), w), generator=gen)                 # (B, w)
            starts = torch.tensor([len(c) for c in cached])[:, None]                 # (B, 1)
            got = runner(x, starts + positions[:w])                                  # (B, w, V)
            for b, c in enumerate(cached):
                prefill(alone, c + [0])                                              # caches c
                want = alone(x[b:b + 1], positions[len(c):len(c) + w])               # (1, w, V)
                worst = max(worst, (got[b] - want[0]).abs().max().item())
            cached = [c + x[b, :min(w, b + 1)].tolist() for b, c in enumerate(cached)]
    return worst


def corpus_prompts(tiny) -> list[list[int]]:
    """B windows of the corpus, 8 chars each."""
    _, corpus, target = tiny
    return [target.tokenizer.encode(corpus.text[i:i + 8]).tolist() for i in range(0, 4000 * B, 4000)]


def test_ragged_batch_passes_equal_each_row_alone(tiny):
    _, _, target = tiny
    model = target.model
    prompts = corpus_prompts(tiny)
    assert ragged_passes_match(model, model, prompts, torch.Generator().manual_seed(5)) < 1e-5


@pytest.mark.slow
def test_ragged_batch_passes_on_the_compiled_engine(tiny, engine_cache):
    _, _, target = tiny
    runner = engine("compiled", engine_cache).wrap(target.model)
    prompts = corpus_prompts(tiny)
    assert ragged_passes_match(target.model, runner, prompts, torch.Generator().manual_seed(6)) < 1e-4
    assert not runner.fallback and len(runner.compile_s) >= 2   # the batch's shapes ran compiled


def test_ragged_batch_passes_on_the_onnx_engine(tiny, engine_cache):
    _, _, target = tiny
    runner = engine("onnx", engine_cache).wrap(target.model)
    prompts = corpus_prompts(tiny)
    assert ragged_passes_match(target.model, runner, prompts, torch.Generator().manual_seed(7)) < 1e-4
    assert not runner.fallback and {shape[0] for shape, _ in runner.compile_s} == {B}   # batch graphs ran


def test_the_ragged_test_catches_an_onnx_batch_mask_of_the_longest_row(tiny, engine_cache, monkeypatch):
    from src.engine.runtimes.onnx_engine import OnnxModel
    _, _, target = tiny
    runner = engine("onnx", engine_cache).wrap(target.model)
    right = OnnxModel.batch_masks

    def longest(self, pos, S):   # NEGATIVE CONTROL: every row sees the slots before the longest row's start
        return right(self, np.broadcast_to(pos.max(0, keepdims=True), pos.shape), S)
    monkeypatch.setattr(OnnxModel, "batch_masks", longest)
    assert ragged_passes_match(target.model, runner, corpus_prompts(tiny), torch.Generator().manual_seed(7)) > 1e-2


def test_a_leaking_cache_is_caught():
    """NEGATIVE CONTROL for test 1: a cache update that writes every row's keys into row 0 too."""
    from src.engine.models.model import KVCache, ModelConfig, Transformer
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=16, block_size=32, n_layer=2, n_head=2, d_model=16, dropout=0.0)).eval()
    original = KVCache.update

    def leaky(self, slots, k, v):
        out = original(self, slots, k, v)
        if slots.dim() == 2:   # the last row's keys and values also land in row 0, at the last row's slots
            self.k[0, :, slots[-1]] = k[-1]
            self.v[0, :, slots[-1]] = v[-1]
        return out
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8]]
    KVCache.update = leaky
    try:
        worst = ragged_passes_match(model, model, prompts, torch.Generator().manual_seed(7))
    finally:
        KVCache.update = original
    assert worst > 1e-3


# ---- 2. the pieces -----------------------------------------------------------------------------

def test_draw_rows_draws_what_draw_draws():
    gen = torch.Generator().manual_seed(8)
    probs = torch.rand(500, 30, generator=gen)
    probs[:, ::3] = 0.0                                   # chars of weight 0 are never drawn
    u = torch.rand(500, generator=gen, dtype=torch.float64).tolist()
    got = draw_rows(probs, u).tolist()
    assert got == [draw(row, ub) for row, ub in zip(probs.tolist(), u)]
    assert all(c % 3 for c in got)
    assert draw_rows(probs[:2], [1 - 2 ** -53, 0.0]).tolist() == [draw(probs[0].tolist(), 1 - 2 ** -53),
                                                                   draw(probs[1].tolist(), 0.0)]


@pytest.mark.parametrize("dense", [True, False])
def test_accept_rows_decides_each_row_as_alone(dense):
    gen = torch.Generator().manual_seed(9)
    Bn, k, V = 6, 3, 12
    p = torch.softmax(torch.randn(Bn, k + 1, V, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(Bn, k, V, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=gen).view(Bn, k).tolist()
    rows = [0, 2, 3, 5]                                   # rows 1 and 4 are padding
    for trial in range(50):
        seeds = [100 * trial + b for b in range(Bn)]
        got = accept_rows(p, q if dense else [r.tolist() for r in q], drafts,
                          [torch.Generator().manual_seed(s) for s in seeds], rows)
        assert sorted(got) == rows
        for b in rows:
            assert got[b] == speculative_accept(p[b], q[b], drafts[b], torch.Generator().manual_seed(seeds[b]))


# ---- 3. the law per sequence -------------------------------------------------------------------

def cut_at_shortest(p, q, drafts, sources, rows):
    """NEGATIVE CONTROL: the batch keeps only the shortest accepted prefix, and a row that accepted
    more draws the residual max(0, p - q) at that position, where its draft was in fact accepted."""
    out = accept_rows(p, q, drafts, sources, rows)
    n_min = min(n for n, _ in out.values())
    for b in rows:
        if out[b][0] > n_min:
            qrow = q[b, n_min].tolist() if isinstance(q, torch.Tensor) else list(q[b][n_min])
            out[b] = n_min, draw(residual_weights(p[b, n_min].tolist(), qrow), uniforms(1, sources[b])[0])
    return out


def batch_runs(target_model, draft, prompts, k, n_chars, runs, temperature=1.0):
    """`runs` batch generations, seeds 0.. . Returns the list of BatchGenerations."""
    return [generate_speculative_batch(target_model, draft, prompts, n_chars, k, temperature,
                                       stream_generators(seed, len(prompts)), track_overlap=False)
            for seed in range(runs)]


def pass_position_draws(target_model, prompts, gens: list, row: int, k: int):
    """For sequence `row`: per position m = 1..k+1 of a pass, (chars, exact target distributions
    given the emitted prefix) over every pass of every run."""
    P = len(prompts[row])
    seqs = [g.sequences[row] for g in gens]
    L = max(len(s) for s in seqs)
    ids = torch.tensor([prompts[row] + s + [0] * (L - len(s)) for s in seqs])            # (runs, P + L)
    with torch.no_grad(), target_model.cache_set_aside():
        p = torch.softmax(target_model(ids), -1)[:, P - 1:]                            # (runs, L + 1, V)
    chars, probs = defaultdict(list), defaultdict(list)
    for r, g in enumerate(gens):
        at = 0
        for n in g.accepts[row]:
            for m in range(n + 1):                          # the pass's n kept drafts, then its own char
                chars[m + 1].append(seqs[r][at + m])
                probs[m + 1].append(p[r, at + m])
            at += n + 1
    return {m: (torch.tensor(chars[m]), torch.stack(probs[m])) for m in sorted(chars)}


def law_p_values(target_model, prompts, gens, row, k):
    return {m: varying_multinomial_test(c, pr)[2]
            for m, (c, pr) in pass_position_draws(target_model, prompts, gens, row, k).items() if len(c) >= 50}


@pytest.mark.parametrize("draft_name", ["bigram", pytest.param("int4", marks=pytest.mark.slow)])
def test_each_sequence_of_a_batch_has_the_targets_law_at_every_pass_position(tiny, draft_name):
    _, _, target = tiny
    draft, prompts, k = batch_draft(tiny, draft_name), two_prompts(tiny), 2
    gens = batch_runs(target.model, draft, prompts, k, 6, RUNS)
    first = [(g.accepts[0][0], g.accepts[B - 1][0]) for g in gens]
    assert sum(a != b for a, b in first) > 0.1 * RUNS        # rows 0 and B-1 accept unequal lengths
    for row in (0, B - 1):
        pv = law_p_values(target.model, prompts, gens, row, k)
        assert sorted(pv) == list(range(1, k + 2)), pv        # every pass position, the bonus k+1 included
        for m, v in pv.items():
            assert v > ALPHA, f"{draft_name} sequence {row}: pass position {m} p = {v:.2e}"


def test_each_sequence_of_an_onnx_batch_has_the_targets_law_at_every_pass_position(tiny, engine_cache):
    _, _, target = tiny
    e = engine("onnx", engine_cache)
    runner = e.wrap(target.model)
    draft, prompts, k = batch_draft(tiny, "bigram"), two_prompts(tiny), 2
    gens = batch_runs(runner, draft, prompts, k, 6, RUNS)
    assert (B, k + 1) in {shape for shape, _ in runner.compile_s} and not runner.fallback   # the batch graph verified
    for row in (0, B - 1):
        pv = law_p_values(target.model, prompts, gens, row, k)
        assert sorted(pv) == list(range(1, k + 2)), pv
        for m, v in pv.items():
            assert v > ALPHA, f"onnx sequence {row}: pass position {m} p = {v:.2e}"


def test_the_law_test_catches_a_batch_cut_at_its_shortest_prefix(tiny, monkeypatch):
    _, _, target = tiny
    draft, prompts, k = batch_draft(tiny, "bigram"), two_prompts(tiny), 2
    monkeypatch.setattr(batch_mod, "accept_rows", cut_at_shortest)
    gens = batch_runs(target.model, draft, prompts, k, 6, RUNS)
    worst = min(v for row in (0, B - 1) for v in law_p_values(target.model, prompts, gens, row, k).values())
    assert worst < 1e-6, worst


# ---- 4. independence between sequences ---------------------------------------------------------

class SharedUniforms(UniformBuffer):
    """NEGATIVE CONTROL: every row's acceptance tests read the same k+1 uniforms in a pass (row 0's)."""

    def __init__(self, source: UniformBuffer, rows: int):
        super().__init__(source.gen)
        self.source, self.rows, self.calls, self.values = source, rows, 0, []

    def take(self, n):
        if self.calls % self.rows == 0:
            self.values = self.source.take(n)
        self.calls += 1
        return self.values


def shared_uniform_accept(p, q, drafts, sources, rows):
    shared = SharedUniforms(sources[rows[0]], len(rows))
    return accept_rows(p, q, drafts, [shared] * len(sources), rows)


def collision_p_value(target_model, prompt, gens) -> float:
    """Two-sided p-value of the count of runs whose rows 0 and B-1 emitted the same first char,
    against independent draws from the target's law after `prompt` (binomial mean, normal tail)."""
    with torch.no_grad(), target_model.cache_set_aside():
        p = torch.softmax(target_model(torch.tensor([prompt])), -1)[0, -1].double()     # (V,)
    s = float((p * p).sum())
    n = len(gens)
    hits = sum(g.sequences[0][0] == g.sequences[B - 1][0] for g in gens)
    z = (hits - n * s) / math.sqrt(n * s * (1 - s))
    return math.erfc(abs(z) / math.sqrt(2))


@pytest.mark.parametrize("draft_args", [("bigram",), ("int4",), FLAT])
def test_sequences_of_a_batch_are_independent(tiny, draft_args):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    gens = batch_runs(target.model, batch_draft(tiny, *draft_args), [prompt] * B, 2, 1, RUNS)
    assert collision_p_value(target.model, prompt, gens) > ALPHA


def test_the_independence_test_catches_a_shared_acceptance_uniform(tiny, monkeypatch):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    monkeypatch.setattr(batch_mod, "accept_rows", shared_uniform_accept)
    gens = batch_runs(target.model, batch_draft(tiny, *FLAT), [prompt] * B, 2, 1, RUNS)
    assert collision_p_value(target.model, prompt, gens) < 1e-6


# ---- 5. greedy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["eager", "onnx", pytest.param("compiled", marks=pytest.mark.slow)])
@pytest.mark.parametrize("draft_name", ["bigram", "ngram", "int8"])
def test_greedy_batch_equals_each_sequence_alone(tiny, engine_cache, name, draft_name):
    _, _, target = tiny
    e = engine(name, engine_cache)
    runner = e.wrap(target.model)
    draft = batch_draft(tiny, draft_name)
    e.wrap_draft(draft)
    prompts = two_prompts(tiny)
    alone = [generate_baseline(target.model, p, 40, 0.0, torch.Generator().manual_seed(0)).tokens for p in prompts]
    assert generate_baseline_batch(runner, prompts, 40, 0.0, stream_generators(0, B)).tokens == alone
    for k in (1, 4):
        g = generate_speculative_batch(runner, draft, prompts, 40, k, 0.0, stream_generators(0, B))
        assert g.tokens == alone, k
        assert g.target_passes == max(g.passes) and all(c >= 40 for c in g.chars)
    assert not any(r.fallback for r in e.runners)
