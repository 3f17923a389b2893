"""transformers' own loop (engine=transformers, src/engine/huggingface/library_loop.py): the converter, the counters
read from inside the library, and the library's sampler tested for exactness like the tool's.

Exactness: N independent `generate` calls of k+1 new tokens from a fixed prompt, each seeded; for
every position m = 1..k+1 the exact target distribution given the emitted prefix comes from the
tool's own eager forward, and the per-draw chi-square (tests/chisquare.py) compares the emitted
tokens with it. The first pass drafts k tokens, so position k+1 is the bonus token whenever all k
were kept. False-failure rate: each p-value is checked at ALPHA = 1e-4; this file makes under 20
such checks, so a correct sampler fails it with probability < 0.2% for a random seed (the seeds
are fixed: the outcome is reproducible). Each negative control (a bug seen in the field,
reproduced by a patch) must be rejected at p < 1e-6 at one of its positions.
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, generate_speculative
from src.engine.huggingface.checkpoint import to_transformers
from src.engine.huggingface.library_loop import LibraryLoop
from src.engine.models.model import ModelConfig, Transformer
from src.paths import CONF_DIR
from tests.engine.decoding.test_exactness import ALPHA, full_probs, position_p_values

N = 1500           # generate calls per exactness test (each ~5-15 ms on the tiny models)
K = 2              # drafts per pass: positions 1..3 tested, the bonus among them
LOOKUP_PROMPT = "the cat sat on the mat. the cat "   # repeats: prompt lookup finds drafts in it


def default_shape(vocab: int) -> ModelConfig:
    """conf/model/small.yaml's shape (the default target) with a vocabulary of `vocab` chars."""
    from omegaconf import OmegaConf
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "small.yaml"))
    return ModelConfig(vocab_size=vocab, **node)


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_converted_logits_equal_the_tools_at_every_position(tiny, which):
    """Float32 tolerance 1e-5 absolute on logits of order 1-10, every position of a full window,
    through the full forward and through the cache (prefill, then one token at a time)."""
    if which == "tiny":
        model = tiny[2].model
    else:
        torch.manual_seed(0)
        model = Transformer(default_shape(84)).eval()
    hf = to_transformers(model)
    T = model.cfg.block_size
    idx = torch.randint(0, model.cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), model.cache_set_aside():
        ours = model(idx)
    theirs = hf(idx).logits
    assert ours.abs().max() > 0.5    # not a trivially small comparison
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    with torch.no_grad():            # the cached path, as generate runs it
        out = hf(idx[:1, :T - 8], use_cache=True)
        steps = [out.logits[:, -1]]
        cache = out.past_key_values
        for t in range(T - 8, T - 1):
            out = hf(idx[:1, t:t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits[:, -1])
    torch.testing.assert_close(torch.cat(steps), ours[0, T - 9:T - 1], atol=1e-5, rtol=0)


def loop_of(tiny, drafts, draft="int8", temperature=1.0, **kw) -> LibraryLoop:
    target = tiny[2].model
    if draft == "prompt_lookup":
        return LibraryLoop(target, K, temperature, lookup_ngram=2, **kw)
    return LibraryLoop(target, K, temperature, assistant=drafts[draft].model, **kw)


def test_counters_are_exact_given_the_seed(tiny, drafts):
    """The same seed gives the same chars and the same per-pass log; the log adds up: each pass
    emits its kept drafts plus one, and under the constant schedule the assistant makes one forward
    per drafted token (its catch-up rides on the first)."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    loop = loop_of(tiny, drafts, "int8")
    loop.k = 4
    a = loop.counted(loop.speculative, prompt, 60, seed=3)
    b = loop.counted(loop.speculative, prompt, 60, seed=3)
    assert (a.tokens, a.passes_log) == (b.tokens, b.passes_log)
    assert len(a.tokens) == 60 and sum(kept + 1 for _, kept in a.passes_log) == 60
    assert all(0 <= kept <= d <= 4 for d, kept in a.passes_log) and a.target_passes < 60
    assert a.assistant_forwards == a.proposed
    assert a.accepted < a.proposed    # the tiny int8 copy is not the target: some drafts are rejected
    base = loop.counted(loop.baseline, prompt, 60, seed=3)
    assert base.target_passes == 60 and base.proposed == 0


@pytest.mark.parametrize("draft", ["int8", "small_model", "prompt_lookup"])
def test_greedy_library_equals_the_tools_loop(tiny, drafts, draft):
    """At T = 0 the library's assisted run, its plain run and the tool's plain run emit the same
    chars (the converter is exact), and for a model draft the library's per-pass (drafted, kept) log
    equals the tool's own loop's on the same draft, pass for pass: an independent check of the
    counters. The last pass differs by design: transformers drafts no more than the chars still to
    generate, the tool drafts k and truncates."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(LOOKUP_PROMPT if draft == "prompt_lookup" else cfg.prompt).tolist()
    loop = loop_of(tiny, drafts, draft, temperature=0.0)
    loop.k = 4
    g = loop.counted(loop.speculative, prompt, 60, seed=0)
    ours = generate_baseline(target.model, prompt, 60, 0.0, torch.Generator().manual_seed(0))
    assert g.tokens == loop.baseline(prompt, 60, seed=0) == ours.tokens
    assert g.accepted > 0
    if draft != "prompt_lookup":
        tool = generate_speculative(target.model, drafts[draft], prompt, 60, 4, 0.0, torch.Generator().manual_seed(0))
        assert g.passes_log[:-1] == tool.passes_log[:-1] and len(g.passes_log) == len(tool.passes_log)


def library_draws(loop: LibraryLoop, prompt: list[int], seed: int, n: int = N) -> torch.Tensor:
    """(n, K+1) tokens: n seeded generate calls of K+1 new tokens each."""
    return torch.tensor([loop.speculative(prompt, K + 1, seed * 100_003 + i) for i in range(n)])


def library_p_values(tiny, loop: LibraryLoop, prompt_text: str, temperature: float, seed: int):
    model = tiny[2].model
    prompt = tiny[2].tokenizer.encode(prompt_text)
    chars = library_draws(loop, prompt.tolist(), seed)
    P = len(prompt)
    p_exact = full_probs(model, torch.cat([prompt.expand(len(chars), P), chars], 1), temperature)[:, P - 1:P + K]
    return dict(position_p_values(chars, torch.ones_like(chars, dtype=torch.bool), p_exact))


def assert_exact(p_values: dict, what: str) -> None:
    assert sorted(p_values) == list(range(1, K + 2)), p_values   # every position tested, the bonus too
    for m, pv in p_values.items():
        assert pv > ALPHA, f"{what}: position {m} deviates from the target (p = {pv:.2e})"


@pytest.mark.parametrize("temperature", [1.0, pytest.param(0.7, marks=pytest.mark.slow)])
def test_assisted_generation_emits_the_target_distribution(tiny, drafts, temperature):
    loop = loop_of(tiny, drafts, "int8", temperature)
    g = loop.counted(loop.speculative, tiny[2].tokenizer.encode(tiny[0].prompt).tolist(), K + 1, seed=0)
    assert g.passes_log[0][0] == K      # the first pass drafts K tokens: position K+1 can be the bonus
    assert_exact(library_p_values(tiny, loop, tiny[0].prompt, temperature, seed=1), f"assisted T={temperature}")


def test_prompt_lookup_emits_the_target_distribution(tiny, drafts):
    loop = loop_of(tiny, drafts, "prompt_lookup")
    g = loop.counted(loop.speculative, tiny[2].tokenizer.encode(LOOKUP_PROMPT).tolist(), K + 1, seed=0)
    assert g.proposed > 0                # the prompt's repeats give it drafts to verify
    assert_exact(library_p_values(tiny, loop, LOOKUP_PROMPT, 1.0, seed=2), "prompt lookup")


@contextlib.contextmanager
def greedy_drafting_assistant(loop: LibraryLoop):
    """NEGATIVE CONTROL (transformers 32867): the assistant drafts greedily while the target
    samples, and hands back the logits of the distribution it did not sample from."""
    original = loop.assistant.generate

    def generate(*args, **kwargs):
        kwargs["generation_config"] = copy.deepcopy(kwargs["generation_config"])
        kwargs["generation_config"].do_sample = False
        return original(*args, **kwargs)
    loop.assistant.generate = generate
    try:
        yield
    finally:
        del loop.assistant.generate


@contextlib.contextmanager
def unwarped_target(temperature: float):
    """NEGATIVE CONTROL (vLLM 10198): the verification's target probabilities without the sampling
    temperature (logits times T undo the warper's division), while the draft samples at T."""
    import transformers.generation.utils as utils
    original = utils._speculative_sampling

    def speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, **kw):
        return original(candidate_input_ids, candidate_logits, candidate_length, new_logits * temperature, **kw)
    utils._speculative_sampling = speculative_sampling
    try:
        yield
    finally:
        utils._speculative_sampling = original


@contextlib.contextmanager
def lookup_with_a_false_q(vocab: int):
    """NEGATIVE CONTROL (transformers 47932): a drafter that hands back a q it did not sample from:
    prompt lookup's deterministic drafts returned with uniform logits, so transformers runs the
    min(1, p/q) rule with q = 1/V instead of its sample-and-compare check."""
    from transformers.generation import candidate_generator as cg
    original = cg.PromptLookupCandidateGenerator.get_candidates

    def get_candidates(self, input_ids, **kw):
        ids, logits = original(self, input_ids, **kw)
        drafted = ids.shape[1] - input_ids.shape[1]
        return ids, (torch.zeros(1, drafted, vocab) if drafted else None)
    cg.PromptLookupCandidateGenerator.get_candidates = get_candidates
    try:
        yield
    finally:
        cg.PromptLookupCandidateGenerator.get_candidates = original


@pytest.mark.slow
def test_negative_control_greedy_drafting_assistant_is_rejected(tiny, drafts):
    loop = loop_of(tiny, drafts, "int8")
    with greedy_drafting_assistant(loop):
        p_values = library_p_values(tiny, loop, tiny[0].prompt, 1.0, seed=3)
    assert min(p_values.values()) < 1e-6, f"the greedy-drafting assistant was not caught: {p_values}"


@pytest.mark.slow
def test_negative_control_unwarped_target_is_rejected(tiny, drafts):
    loop = loop_of(tiny, drafts, "int8", 0.7)
    with unwarped_target(0.7):
        p_values = library_p_values(tiny, loop, tiny[0].prompt, 0.7, seed=4)
    assert min(p_values.values()) < 1e-6, f"the unwarped target was not caught: {p_values}"


@pytest.mark.slow
def test_negative_control_lookup_with_a_false_q_is_rejected(tiny, drafts):
    loop = loop_of(tiny, drafts, "prompt_lookup")
    with lookup_with_a_false_q(tiny[2].tokenizer.vocab_size):
        p_values = library_p_values(tiny, loop, LOOKUP_PROMPT, 1.0, seed=5)
    assert min(p_values.values()) < 1e-6, f"prompt lookup with a false q was not caught: {p_values}"
