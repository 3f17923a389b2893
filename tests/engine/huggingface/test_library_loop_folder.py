"""transformers' own loop (engine=transformers) on models from a folder (model=hf): the checkpoint's
own model is the target, another folder's the assistant; tested like the library's loop on the
tool's models (tests/engine/huggingface/test_library_loop.py).

The models: tiny random-weight checkpoints of two architectures (Llama, Qwen2; made here, no hub),
each with an assistant that is its own weights plus noise, so drafts are often kept and often not;
the Qwen2 target ships sampling settings of its own (top-k, top-p, a repetition penalty, an EOS),
which the library's loop must set aside.

Exactness: N seeded `generate` calls of K+1 new tokens; per position m = 1..K+1, the emitted
tokens against the target's exact distribution given the emitted prefix (a chi-square per
position at ALPHA = 1e-4: 2 architectures x 3 positions, so a correct sampler fails with
probability < 0.1%; the seeds are fixed). The negative control, an assistant that drafts greedily
while the target samples (transformers 32867), must be rejected at p < 1e-6 at one position.
"""
from __future__ import annotations

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, generate_speculative
from src.engine.drafts.model_draft import ModelDraft
from src.engine.huggingface.checkpoint import char_tokenizer, offline_transformers
from src.engine.huggingface.folder_model import load_checkpoint
from src.engine.huggingface.library_loop import LibraryLoop
from tests.engine.decoding.test_exactness import ALPHA, full_probs, position_p_values
from tests.engine.huggingface.test_folder_model import tiny_config
from tests.engine.huggingface.test_library_loop import greedy_drafting_assistant

N = 1000    # generate calls per exactness test
K = 2       # drafts per pass: positions 1..3 tested, the bonus among them
ARCHS = ("llama", "qwen2")
NOISE = 0.05   # the assistant's weights: the target's plus this much Gaussian noise per entry
# the Qwen2 target's generation_config.json: a truncated, penalised law and a space as its EOS; the
# library's loop must sample the full law at the trial's T for exactly n tokens regardless
OWN_SETTINGS = dict(do_sample=True, temperature=0.7, top_k=5, top_p=0.8, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def pairs(tiny, tmp_path_factory):
    """arch -> (target folder, assistant folder): the same random-weight checkpoint, and a noisy
    copy of it, each with the tiny target's char tokenizer (and one output row more, as in
    tests/engine/huggingface/test_folder_model.py: room for the special token Qwen2's tokenizer class adds)."""
    _, _, target = tiny
    t = offline_transformers()
    out = {}
    for arch in ARCHS:
        torch.manual_seed(0)
        model = t.AutoModelForCausalLM.from_config(tiny_config(arch, target.tokenizer.vocab_size + 1))
        folders = []
        for role in ("target", "assistant"):
            folder = tmp_path_factory.mktemp(f"{arch}_{role}")
            if role == "assistant":
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(NOISE * torch.randn_like(p))
            if role == "target" and arch == "qwen2":   # a checkpoint's own sampling settings, as Qwen2.5 ships
                model.generation_config = t.GenerationConfig(**OWN_SETTINGS, eos_token_id=target.tokenizer.index[" "])
            model.save_pretrained(folder)
            char_tokenizer(target.tokenizer.chars).save_pretrained(folder)
            folders.append(folder)
        out[arch] = tuple(folders)
    return out


def models(pairs, arch: str):
    target, tok = load_checkpoint(pairs[arch][0])
    assistant, _ = load_checkpoint(pairs[arch][1])
    return target, assistant, tok


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_library_run_equals_the_tools_loop_pass_for_pass(tiny, pairs, arch):
    """At T = 0 transformers' assisted run on the folder's own model emits the tool's greedy chars,
    and its per-pass (drafted, kept) log equals the tool's loop with the same assistant as its
    draft model, pass for pass (near the end they differ by design: transformers drafts no more than
    the chars left). Closing the loop gives the checkpoint its own generation config back."""
    cfg, corpus, _ = tiny
    target, assistant, tok = models(pairs, arch)
    own = target.hf.generation_config
    loop = LibraryLoop(target, 4, 0.0, assistant=assistant)
    prompt = tok.encode(cfg.prompt).tolist()
    g = loop.counted(loop.speculative, prompt, 60, seed=0)
    ours = generate_baseline(target, prompt, 60, 0.0, torch.Generator().manual_seed(0))
    assert g.tokens == loop.baseline(prompt, 60, seed=0) == ours.tokens
    draft = ModelDraft(target, tok.encode(corpus.text[:200]), model=assistant)
    tool = generate_speculative(target, draft, prompt, 60, 4, 0.0, torch.Generator().manual_seed(0))
    assert uncapped(g.passes_log, 60, 4) == uncapped(tool.passes_log, 60, 4)
    assert len(uncapped(g.passes_log, 60, 4)) > 10 and len(g.passes_log) == len(tool.passes_log)
    assert 0 < g.accepted < g.proposed     # the noisy copy is kept often, not always
    assert g.assistant_forwards == g.proposed
    loop.close()
    assert target.hf.generation_config is own


def uncapped(log: list[tuple[int, int]], n: int, k: int) -> list[tuple[int, int]]:
    """The passes that began with more than k tokens still to emit: transformers drafts k there too."""
    out, emitted = [], 0
    for drafted, kept in log:
        if n - emitted <= k:
            break
        out.append((drafted, kept))
        emitted += kept + 1
    return out


def p_values(tiny, pairs, arch: str, seed: int, broken=None) -> dict:
    cfg = tiny[0]
    target, assistant, tok = models(pairs, arch)
    loop = LibraryLoop(target, K, 1.0, assistant=assistant)
    prompt = tok.encode(cfg.prompt)
    with broken(loop) if broken else torch.no_grad():
        chars = torch.tensor([loop.speculative(prompt.tolist(), K + 1, seed * 100_003 + i) for i in range(N)])
    loop.close()
    P = len(prompt)
    p_exact = full_probs(target, torch.cat([prompt.expand(N, P), chars], 1), 1.0)[:, P - 1:P + K]
    return dict(position_p_values(chars, torch.ones_like(chars, dtype=torch.bool), p_exact))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_assisted_generation_on_a_folders_model_emits_its_distribution(tiny, pairs, arch):
    pv = p_values(tiny, pairs, arch, seed=1)
    assert sorted(pv) == list(range(1, K + 2)), pv     # every position tested, the bonus too
    for m, p in pv.items():
        assert p > ALPHA, f"{arch}: position {m} deviates from the target (p = {p:.2e})"


@pytest.mark.slow
def test_negative_control_a_greedy_drafting_assistant_is_caught(tiny, pairs):
    pv = p_values(tiny, pairs, "llama", seed=2, broken=greedy_drafting_assistant)
    assert min(pv.values()) < 1e-6, f"the greedy-drafting assistant was not caught: {pv}"
