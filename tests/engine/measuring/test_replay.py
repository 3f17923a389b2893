"""The free loop (src/engine/measuring/replay.py): replaying a run's recorded proposals makes the same run.

For every shipped draft on the tiny model, at k = 1 and 4: the counter run with the recorder and
its replay emit the same chars with the same passes, proposals and acceptances, and the replay
does so every time it is run (reset starts it over). Negative control: a replay that hands back
the proposals but leaves the generator where it is (no restored state) diverges, which shows the
restored state is what keeps the acceptance tests' uniforms the same. The same for a batch
(bigram, ngram, int8 at B = 3): its replay makes the recorded batch run, and a replay leaving the
rows' uniform sources where it found them diverges. measure_cost times the free loop and the
baseline loop with the other components, and the trial logs both for chains only.
"""
from __future__ import annotations

import pytest
import torch

from src.engine.decoding.batch import generate_speculative_batch, stream_generators
from src.engine.decoding.decode import generate_baseline, generate_speculative
from src.engine.measuring.measure import measure_cost
from src.engine.measuring.replay import ProposalRecorder, ReplayDraft

from tests.conftest import PROMPT, compose_cfg
from src.trial.spec import trial_spec
from src.trial.trial import run_trial

N = 64


def counters(g):
    return g.tokens, g.target_passes, g.proposed, g.accepted, g.tested, g.accepted_at


def record(target, draft, prompt, k, seed=0):
    rec = ProposalRecorder(draft)
    g = generate_speculative(target.model, rec, prompt, N, k, 1.0, torch.Generator().manual_seed(seed))
    return rec, g


@pytest.mark.parametrize("k", [1, 4])
def test_replay_makes_the_recorded_run_for_every_draft(tiny, drafts, k):
    _, _, target = tiny
    prompt = target.tokenizer.encode(PROMPT).tolist()
    for name, draft in drafts.items():
        rec, g = record(target, draft, prompt, k)
        plain = generate_speculative(target.model, draft, prompt, N, k, 1.0, torch.Generator().manual_seed(0))
        assert counters(g) == counters(plain), name      # recording changes nothing
        assert len(rec.proposals) == g.draft_calls, name  # one proposal a pass
        free = ReplayDraft(rec)
        for _ in range(2):                                # reset starts the replay over
            again = generate_speculative(target.model, free, prompt, N, k, 1.0, torch.Generator().manual_seed(0),
                                         track_overlap=False)
            assert counters(again) == counters(g), name


def test_a_replay_builds_a_table_drafts_dense_rows_as_the_recorded_run_did(tiny, drafts, monkeypatch):
    """The acceptance test builds a table draft's dense row (MixtureRow.dense) on a rejection: the
    free loop must pay that as the loop does, so the rows it hands back are copies without it. The
    timed loop (no overlap counter) and each replay build equally many (the rows copied with their
    dense form, as a plain shallow copy of the slots does: caught)."""
    from src.engine.drafts.table import MixtureRow
    _, _, target = tiny
    prompt = target.tokenizer.encode(PROMPT).tolist()
    builds = []
    dense = MixtureRow.dense

    def counting(row):
        builds.append(row._dense is None)
        return dense(row)
    monkeypatch.setattr(MixtureRow, "dense", counting)
    rec, g = record(target, drafts["ngram"], prompt, 4)
    builds.clear()   # the timed loop's: no overlap counter (which builds a dense row at every tested position)
    generate_speculative(target.model, drafts["ngram"], prompt, N, 4, 1.0, torch.Generator().manual_seed(0),
                         track_overlap=False)
    recorded = sum(builds)
    assert recorded > 0
    free = ReplayDraft(rec)
    for _ in range(2):
        builds.clear()
        generate_speculative(target.model, free, prompt, N, 4, 1.0, torch.Generator().manual_seed(0),
                             track_overlap=False)
        assert sum(builds) == recorded


class NoStateReplay(ReplayDraft):
    """The negative control: the proposals, but the generator left where the replay found it."""

    def propose(self, seq, k, temperature, gen):
        drafts, q, _ = self.proposals[self.next]
        self.next += 1
        return drafts, q


def test_without_the_generator_state_the_replay_diverges(tiny, drafts):
    _, _, target = tiny
    prompt = target.tokenizer.encode(PROMPT).tolist()
    rec, g = record(target, drafts["bigram"], prompt, 4)
    with pytest.raises(RuntimeError, match="diverged"):  # it needs proposals the recorded run never made
        generate_speculative(target.model, ReplayDraft(rec), prompt, N, 2, 1.0, torch.Generator().manual_seed(0))
    free = NoStateReplay(rec)
    try:
        other = generate_speculative(target.model, free, prompt, N, 4, 1.0, torch.Generator().manual_seed(0))
    except IndexError:                                    # ran past the recorded proposals: diverged too
        return
    assert counters(other) != counters(g)


def test_measure_cost_times_the_free_loop_per_pass(tiny, drafts):
    _, _, target = tiny
    prompt = target.tokenizer.encode(PROMPT).tolist()
    rec, g = record(target, drafts["int8"], prompt, 2)
    free = ReplayDraft(rec)
    run = (lambda: generate_speculative(target.model, free, prompt, N, 2, 1.0, torch.Generator().manual_seed(0),
                                        track_overlap=False), g.target_passes)
    calls = []
    base = (lambda: calls.append(generate_baseline(target.model, prompt, N, 1.0, torch.Generator().manual_seed(0))), N)
    cost = measure_cost(target.model, drafts["int8"], prompt, 2, 1.0, 2, "cpu", rounds=3,
                        loops={"free": run, "base": base})
    assert {"target_pass_us", "verify_pass_us", "draft_char_us", "c", "free_pass_us", "base_pass_us"} <= set(cost)
    assert cost["free_pass_us"] > 0 and cost["base_pass_us"] > 0
    assert {"target_per_base", "verify_per_base", "draft_per_base", "free_per_base"} <= set(cost)
    assert len(calls) == 1 + 3                            # a warm-up, then one run a round
    assert "free_pass_us" not in measure_cost(target.model, drafts["int8"], prompt, 2, 1.0, 2, "cpu", rounds=1)


@pytest.mark.parametrize("overrides, logged", [((), True), (("timing.free_loop=false",), False),
                                               (("verify=tree", "verify.widths=[2,2]"), False)],
                         ids=["chain", "switched-off", "tree"])
def test_the_trial_logs_the_free_loop_for_chains(tiny, overrides, logged):
    cfg, corpus, target = tiny
    cfg = compose_cfg(cfg.data.path, cfg.data.cache_dir, "draft=bigram", "k=2", *overrides)
    result = run_trial(trial_spec(cfg), progress=False, loaded=(corpus, target))
    assert ("free_pass_us" in result.metrics) == logged and ("base_pass_us" in result.metrics) == logged


# ---- a batch: every row's uniform source restored ----------------------------------------------------
B = 3


def batch_run(target, draft, prompts, k, track_overlap=True):
    return generate_speculative_batch(target.model, draft, prompts, N, k, 1.0, stream_generators(7, B),
                                      track_overlap=track_overlap)


def batch_counters(g):
    return g.tokens, g.target_passes, g.passes, g.accepted, g.accepts


@pytest.mark.parametrize("name", ["bigram", "ngram", "int8"])
def test_a_batch_replay_makes_the_recorded_batch_run(tiny, drafts, name):
    _, corpus, target = tiny
    prompts = [target.tokenizer.encode(corpus.text[i:i + 8]).tolist() for i in range(0, 3000 * B, 3000)]
    rec = ProposalRecorder(drafts[name])
    g = batch_run(target, rec, prompts, 3)
    assert batch_counters(g) == batch_counters(batch_run(target, drafts[name], prompts, 3))   # recording changes nothing
    assert len(rec.proposals) == g.target_passes         # one batch proposal a pass
    free = ReplayDraft(rec)
    for _ in range(2):                                  # reset starts the replay over
        assert batch_counters(batch_run(target, free, prompts, 3, track_overlap=False)) == batch_counters(g)


class NoSourceReplay(ReplayDraft):
    """The negative control: the batch's proposals, its rows' uniform sources left as the replay found them."""

    def propose_batch(self, seqs, rows, k, temperature, sources):
        drafts, q, _ = self.proposals[self.next]
        self.next += 1
        return drafts, q


def test_without_the_rows_sources_restored_a_batch_replay_diverges(tiny, drafts):
    _, corpus, target = tiny
    prompts = [target.tokenizer.encode(corpus.text[i:i + 8]).tolist() for i in range(0, 3000 * B, 3000)]
    rec = ProposalRecorder(drafts["bigram"])
    g = batch_run(target, rec, prompts, 3)
    try:
        other = batch_run(target, NoSourceReplay(rec), prompts, 3)
    except (IndexError, TypeError):   # ran past the recorded proposals, or a row the recorded run had
        return                        # finished (no q recorded for it) still drafting: diverged too
    assert batch_counters(other) != batch_counters(g)
