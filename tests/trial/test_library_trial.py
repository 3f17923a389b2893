"""A trial on transformers' loop (engine=transformers), end to end on the tiny model: the trial's
counters are the library loop's own, exactly (a LibraryLoop run directly with the same seed gives
the same log), the costs are the library's, and the policies reach transformers' own settings."""
from __future__ import annotations

import pytest

from src.engine.huggingface.library_loop import LibraryLoop
from src.trial.load import build_draft, load_target
from src.trial.spec import trial_spec
from src.trial.trial import run_trial
from tests.conftest import compose_cfg

K = 3


def library_spec(tiny, *overrides):
    cfg, _, _ = tiny
    return trial_spec(compose_cfg(cfg.data.path, cfg.data.cache_dir, "engine=transformers", f"k={K}",
                                  "timing.target_width=null", *overrides))


@pytest.mark.parametrize("draft", ["int8", "prompt_lookup"])
def test_a_library_trial_logs_the_library_loops_own_counters(tiny, draft):
    spec = library_spec(tiny, f"draft={draft}")
    result = run_trial(spec, progress=False)
    m = result.metrics
    corpus, target = load_target(spec.target, progress=False)
    d = build_draft(spec.draft, spec.target, target, corpus)
    prompt = target.tokenizer.encode(spec.prompt).tolist()
    loop = (LibraryLoop(target.model, K, 1.0, assistant=d.model) if draft == "int8"
            else LibraryLoop(target.model, K, 1.0, lookup_ngram=d.max_matching_ngram_size))
    g = loop.counted(loop.speculative, prompt, spec.n_chars, spec.seed)
    assert result.text == target.tokenizer.decode(g.tokens)
    assert (m["target_passes"], m["proposed"], m["accepted"]) == (g.target_passes, g.proposed, g.accepted)
    assert m["library_baseline_passes"] == spec.n_chars == m["baseline_passes"]
    assert m["chars_per_pass"] == spec.n_chars / g.target_passes
    assert m["assistant_forwards"] == (g.proposed if draft == "int8" else 0)
    for key in ("target_pass_us", "verify_pass_us", "draft_char_us", "base_pass_us", "c", "speedup_median"):
        assert m[key] > 0, key
    assert result.info["engine"] == "transformers" and result.info["draft"] == draft
    if draft == "prompt_lookup":   # passes draft 0..k tokens: their shares and the verify cost per width
        assert sum(m[f"drafted_len_{j}"] for j in range(K + 1)) == pytest.approx(1.0)
        assert any(key.startswith("verify_us_width_") for key in m)


@pytest.mark.parametrize("policy,schedule,threshold", [("fixed", "constant", 0.0), ("heuristic", "heuristic", 0.0),
                                                        ("confidence", "constant", 0.4)])
def test_policies_map_to_transformers_settings(tiny, policy, schedule, threshold):
    """The assistant's generation config, where transformers reads the draft length and the stop
    rule, holds the trial's k and the policy's schedule and threshold at every run."""
    from src.trial.library_trial import library_loop
    spec = library_spec(tiny, "draft=int8", f"policy={policy}")
    corpus, target = load_target(spec.target, progress=False)
    loop = library_loop(spec, target.model, build_draft(spec.draft, spec.target, target, corpus))
    loop.assistant.generation_config.num_assistant_tokens = 99     # a previous run's leftovers
    loop.draft_kwargs()
    gc = loop.assistant.generation_config
    assert (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule) == (K, schedule)
    assert gc.assistant_confidence_threshold == threshold


def test_a_library_trial_runs_a_workload_prompt_by_prompt(tiny, tmp_path):
    """Two prompts of two categories through transformers' loop: each prompt's counters are the
    library loop's own on that prompt (its own length), pooled into the trial's and its categories'."""
    import json
    path = tmp_path / "two.jsonl"
    path.write_text(json.dumps({"prompt": "the cat ", "category": "a", "n_chars": 30}) + "\n"
                    + json.dumps({"prompt": "The dog ran ", "category": "b", "n_chars": 20}) + "\n")
    spec = library_spec(tiny, "draft=prompt_lookup", "workload=file", f"workload.path={path}")
    result = run_trial(spec, progress=False)
    corpus, target = load_target(spec.target, progress=False)
    d = build_draft(spec.draft, spec.target, target, corpus)
    loop = LibraryLoop(target.model, K, 1.0, lookup_ngram=d.max_matching_ngram_size)
    gs = [loop.counted(loop.speculative, target.tokenizer.encode(p).tolist(), n, spec.seed)
          for p, n in (("the cat ", 30), ("The dog ran ", 20))]
    assert [(p["target_passes"], p["accepted"]) for p in result.prompts] == [(g.target_passes, g.accepted) for g in gs]
    m = result.metrics
    assert m["target_passes"] == sum(g.target_passes for g in gs) == m["target_passes.a"] + m["target_passes.b"]
    assert m["library_baseline_passes"] == m["baseline_passes"] == 50 and len(result.timing.prompt_baseline_s) == 2
