"""measure_cost's proposal timed as the loop runs it (`in_loop`): after a verify pass, catching up
one char or two, mixed by the share of full accepts. The arithmetic on planted rounds (exact), and
on the tiny model which calls the blocks make, in which order; a table draft's cold replay with a
verify pass before each proposal. No wall-clock time is asserted."""
from __future__ import annotations

import statistics

import pytest

import torch

from src.engine.measuring import measure as measure_mod
from src.engine.measuring.measure import measure_batch_cost, measure_cost, replay_draft_costs

from tests.conftest import PROMPT

K = 4


def planted_rounds(monkeypatch, per_call: dict):
    """adaptive_rounds returns `per_call` (seconds per call, per round) whatever the blocks."""
    def fake(blocks, rounds, enough, max_rounds, max_seconds, device):
        assert set(blocks) == set(per_call)        # the blocks measure_cost asked for
        return {name: list(v) for name, v in per_call.items()}, measure_mod.FIXED
    monkeypatch.setattr(measure_mod, "adaptive_rounds", fake)


def test_the_in_loop_proposal_mixes_the_two_catch_ups_by_the_share_per_round_less_the_verify_pass(monkeypatch):
    """Per round ((1 - s) (v + p1) + s (v + p2) - v) / k, then the median over rounds (a round at one
    machine speed, as a pair). Planted so that the share ignored or swapped, the verify pass not
    subtracted, the median taken per block first, or the lone proposal used all give other numbers."""
    v = [1000e-6, 3000e-6, 1000e-6]                          # round 1 slow
    one = [1400e-6, 3400e-6, 3400e-6]                        # p1 = 400, 400, 2400 us (a burst in round 2)
    two = [1600e-6, 3600e-6, 1600e-6]                        # p2 = 600 us
    lone = [200e-6] * 3                                      # the proposal alone: 50 us a char
    planted_rounds(monkeypatch, {"target": [500e-6] * 3, "verify": v, "draft": lone,
                                 "verify, draft 1": one, "verify, draft 2": two})
    blocks = {name: (None, 1) for name in ("target", "verify", "draft", "verify, draft 1", "verify, draft 2")}
    m = measure_mod.component_times(blocks, K, {}, 3, None, 0.95, None, None, "cpu", keep_rounds=True, in_loop=0.25)
    # rounds: (0.75 * 400 + 0.25 * 600) / 4 = 112.5, 112.5, (0.75 * 2400 + 150) / 4 = 487.5 -> median 112.5;
    # medians per block first would give (0.75 * 3400 + 0.25 * 1600 - 1000) / 4 = 487.5
    assert m["draft_char_us_in_loop"] == pytest.approx(112.5, rel=1e-9)
    assert m["rounds_us"]["draft in loop"] == pytest.approx([112.5, 112.5, 487.5], rel=1e-9)
    assert m["draft_char_us"] == pytest.approx(50.0, rel=1e-9)        # the lone proposal, kept beside it
    assert not any(key.startswith("verify, draft") for key in (*m, *m["rounds_us"]))
    # a round whose verify pass ran slower than the pair (noise larger than a cheap proposal) reads 0, not < 0
    planted_rounds(monkeypatch, {"target": [500e-6] * 3, "verify": [1000e-6, 1500e-6, 1000e-6], "draft": lone,
                                 "verify, draft 1": [1040e-6, 1000e-6, 1040e-6],
                                 "verify, draft 2": [1040e-6, 1000e-6, 1040e-6]})
    m = measure_mod.component_times(blocks, K, {}, 3, None, 0.95, None, None, "cpu", keep_rounds=True, in_loop=0.25)
    assert m["rounds_us"]["draft in loop"] == pytest.approx([10.0, 0.0, 10.0], rel=1e-9)
    # a batch's block (measure_batch_cost): only the two-char catch-up, share 1: (p2 - v) / k per round
    planted_rounds(monkeypatch, {"target": [500e-6] * 3, "verify": v, "draft": lone, "verify, draft 2": two})
    batch = {name: (None, 1) for name in ("target", "verify", "draft", "verify, draft 2")}
    m = measure_mod.component_times(batch, K, {}, 3, None, 0.95, None, None, "cpu", keep_rounds=True, in_loop=1.0)
    assert m["rounds_us"]["draft in loop"] == pytest.approx([150.0, 150.0, 150.0], rel=1e-9)
    # without a share: no in-loop time
    planted_rounds(monkeypatch, {"target": [500e-6] * 3, "verify": v, "draft": lone})
    plain = measure_mod.component_times({n: (None, 1) for n in ("target", "verify", "draft")}, K, {}, 3, None, 0.95,
                                        None, None, "cpu", keep_rounds=True)
    assert "draft_char_us_in_loop" not in plain and "draft in loop" not in plain["rounds_us"]


class Log:
    """Forward hooks on the target and on the draft's model: (who, input width) per call, in order."""

    def __init__(self, target, draft_model, dim=1):
        self.calls: list[tuple[str, int]] = []
        self.hooks = [m.register_forward_pre_hook(lambda mod, args, who=who: self.calls.append((who, args[0].shape[dim])))
                      for who, m in (("target", target), ("draft", draft_model))]

    def remove(self):
        for h in self.hooks:
            h.remove()


def calls_of(target, draft, prompt, **options):
    log = Log(target.model, draft.model)
    try:
        m = measure_cost(target.model, draft, prompt, K, 1.0, K, "cpu", rounds=2, **options)
    finally:
        log.remove()
    return m, log.calls


def test_on_the_tiny_model_the_loops_order_is_timed_a_verify_pass_then_a_proposal_catching_up_one_or_two(tiny,
                                                                                                         drafts):
    """Each block calls its fn once untimed, then once a round (reps // k = 1 call): 3 calls of each."""
    _, _, target = tiny
    draft = drafts["int8"]
    prompt = target.tokenizer.encode(PROMPT).tolist()
    m, calls = calls_of(target, draft, prompt, in_loop=0.5)
    _, plain = calls_of(target, draft, prompt)
    assert m["draft_char_us_in_loop"] > 0
    assert ("draft", 2) not in plain                    # a lone proposal catches up one char
    twos = [i for i, c in enumerate(calls) if c == ("draft", 2)]
    assert len(twos) == 3
    assert all(calls[i - 1] == ("target", K + 1) for i in twos)          # right after a verify pass
    assert all(calls[i + 1:i + K] == [("draft", 1)] * (K - 1) for i in twos)   # then k - 1 draws fed
    after_verify = [i for i, c in enumerate(calls) if c == ("draft", 1) and calls[i - 1] == ("target", K + 1)]
    assert len(after_verify) == 3                       # the block catching up one char (the rotated rounds
    #                                                     never put the lone proposal's block after the verify block)


def test_at_a_batch_the_in_loop_block_is_a_verify_pass_then_the_batchs_proposal(tiny, drafts):
    """measure_batch_cost(in_loop=True), int8 at B = 3: each in-loop call is a (3, k+1) verify pass
    followed at once by the batch proposal (every row catching up two chars, then k - 1 draws fed);
    its time less the verify pass is the in-loop td, the lone batch proposal kept as draft_char_us."""
    _, corpus, target = tiny
    draft = drafts["int8"]
    prompt = target.tokenizer.encode(PROMPT).tolist()
    prompts = [prompt] * 3

    def run(**options):
        log, shape = Log(target.model, draft.model), Log(target.model, draft.model, dim=0)
        try:
            m = measure_batch_cost(target.model, draft, prompts, K, 1.0, K, "cpu", rounds=2, keep_rounds=True,
                                   **options)
        finally:
            log.remove()
            shape.remove()
        assert all(rows == 3 for _, rows in shape.calls)      # every pass over the batch's 3 rows
        return m, log.calls
    m, calls = run(in_loop=True)
    plain, plain_calls = run()
    assert "draft_char_us_in_loop" not in plain and "draft in loop" not in plain["rounds_us"]
    assert m["draft_char_us_in_loop"] == pytest.approx(statistics.median(m["rounds_us"]["draft in loop"]), rel=1e-12)
    verify = ("target", K + 1)
    after = [i for i, c in enumerate(calls) if c == verify and calls[i + 1:i + 1 + K] == [("draft", 2)] + [("draft", 1)] * (K - 1)]
    plain_after = [i for i, c in enumerate(plain_calls) if c == verify and plain_calls[i + 1] == ("draft", 2)]
    assert calls.count(verify) == plain_calls.count(verify) + 3 and len(after) == len(plain_after) + 3


def test_in_loop_is_refused_for_a_tree_and_a_policys_lengths(tiny, drafts):
    _, _, target = tiny
    prompt = target.tokenizer.encode(PROMPT).tolist()
    with pytest.raises(ValueError, match="in_loop"):
        measure_cost(target.model, drafts["int8"], prompt, 2, 1.0, 2, "cpu", rounds=1, tree_widths=(2, 1), in_loop=0.5)
    with pytest.raises(ValueError, match="in_loop"):
        measure_cost(target.model, drafts["int8"], prompt, 2, 1.0, 2, "cpu", rounds=1, drafted={1: 0.5, 2: 0.5},
                     in_loop=0.5)


def test_a_cold_replay_with_before_runs_it_right_before_every_draft_pass_and_never_times_it():
    """replay_draft_costs(before=...): the loop's order, a verify pass then a proposal, at every pass
    of every sequence; the timed seconds are the draft passes' only (a before that sleeps would
    otherwise show: here the clock is read around the draft pass alone, checked by the events)."""
    events = []

    class Stub:
        def reset(self):
            events.append("reset")

    def draft_pass(prefix):
        events.append(("draft", len(prefix)))
        return 2
    seq = torch.zeros((2, 5 + 8), dtype=torch.long)          # 2 sequences, P = 5, n = 8
    out = replay_draft_costs(Stub(), seq, 8, 4.0, draft_pass, rounds=1, before=lambda: events.append("verify"))
    assert len(out) == 1 and out[0] >= 0
    per_sequence = ["reset", "verify", ("draft", 5), "verify", ("draft", 9)]   # a pass every 4 chars
    assert events == per_sequence * 2 + ["reset"]
    events.clear()
    replay_draft_costs(Stub(), seq, 8, 4.0, draft_pass, rounds=1)
    assert "verify" not in events
    # a batch of B: one verify pass before every B proposals, counted across the sequences
    events.clear()
    replay_draft_costs(Stub(), seq, 8, 4.0, draft_pass, rounds=1, before=lambda: events.append("verify"), every=3)
    assert events == ["reset", "verify", ("draft", 5), ("draft", 9), "reset", ("draft", 5), "verify", ("draft", 9),
                      "reset"]
