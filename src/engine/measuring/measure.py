"""Component costs and the seed's exactness check: plain functions of a model, a draft and a prompt.

The trial (src/trial/trial.py) calls them; `make bench` and the tests call them directly.
"""
from __future__ import annotations

import math
import statistics
import time

import torch

from ..decoding.batch import prefill_batch
from ..decoding.decode import prefill
from ..drafts.base import Draft
from ..sampling import UniformBuffer, probs_from_logits, sample, speculative_accept, tvd, uniforms
from .intervals import relative_width
from .timing import FIXED, WIDTH, adaptive_rounds, interleaved_rounds, round_ratio
from ..decoding.tree import TreeMasks, build_tree, max_nodes, tree_accept, tree_inputs


def proposal(draft: Draft, prompt: list[int], k: int, temperature: float, gen: torch.Generator):
    """The timed call of a draft's cost: one k-char proposal after the prompt plus one char,
    rewound to the prompt first (`rewound_proposal`). The draft's own prefill over the prompt runs
    here, untimed (after `reset`, and for a hidden-state draft after `observe`)."""
    draft.propose(prompt, k, temperature, gen)
    return rewound_proposal(draft, prompt, k, temperature, gen)


def rewound_proposal(draft: Draft, prompt: list[int], k: int, temperature: float, gen: torch.Generator,
                     catch_up: int = 1):
    """One k-char proposal after the prompt plus `catch_up` chars, rewound to the prompt first, for a
    draft that has seen the prompt (`proposal`). A draft keeping a cache of its own
    (src/engine/drafts/model_draft.py) feeds those chars before drafting, as the loop's draft feeds
    one after a rejection (the residual) and two after a full accept (its last drafted char and the
    bonus char)."""
    P = len(prompt)
    seq = prompt + prompt[-1:] * catch_up

    def propose_k():
        draft.rewind(P)
        draft.propose(seq, k, temperature, gen)
    return propose_k


def target_passes(target, prompt: list[int], positions: torch.Tensor, k: int, device: str):
    """The target's two timed passes after `prompt`, its cache prefilled (`prefill`'s positions):
    a 1-char pass at the prompt's last position, and a (k+1)-char verify pass from there (ids: the
    last char repeated; a pass costs the same whatever the ids)."""
    P = len(prompt)
    one = torch.tensor([prompt[-1:]], device=device)             # (1, 1)
    many = torch.tensor([prompt[-1:] * (k + 1)], device=device)  # (1, k+1)
    return (torch.no_grad()(lambda: target(one, positions[P - 1:P])),
            torch.no_grad()(lambda: target(many, positions[P - 1:P + k])))


def batch_target_passes(target, prompts: list[list[int]], k: int, device: str):
    """target_passes for a batch of B prompts of one length, prefilled here (`prefill_batch`): a
    (B, 1) pass, the baseline's step, and a (B, k+1) verify pass at per-row positions, the
    speculative step's."""
    P, B = len(prompts[0]), len(prompts)
    positions = prefill_batch(target, prompts)
    last = torch.tensor([p[-1:] for p in prompts], device=device)                    # (B, 1)
    many = last.expand(B, k + 1).contiguous()                                         # (B, k+1)
    at = torch.full((B, 1), P - 1, device=device) + positions[:k + 1]                # (B, k+1) per-row positions
    return (torch.no_grad()(lambda: target(last, positions[P - 1:P])),
            torch.no_grad()(lambda: target(many, at)))


def pass_per_reference(per_call: dict[str, list[float]], loops: dict) -> list[float]:
    """Per round: the time of one speculative pass as the components add up (the free loop's pass,
    or the verify pass without one, plus one k-char proposal) over the reference pass (the
    baseline loop's, or the target pass without one). per_call: adaptive_rounds' blocks, per call."""
    proposal_s = per_call["draft"]  # one k-char proposal per call
    if "free" in loops and "base" in loops:
        spec = [x / loops["free"][1] for x in per_call["free loop"]]
        ref = [x / loops["base"][1] for x in per_call["base loop"]]
    else:
        spec, ref = per_call["verify"], per_call["target"]
    return [(s + d) / r for s, d, r in zip(spec, proposal_s, ref)]


@torch.no_grad()
def measure_cost(target, draft: Draft, prompt: list[int], k: int, temperature: float, reps: int, device: str,
                 rounds: int = 7, tree_widths=None, loops=None, width: float | None = None, level: float = 0.95,
                 max_rounds: int | None = None, max_seconds: float | None = None,
                 drafted: dict[int, float] | None = None, keep_rounds: bool = False,
                 in_loop: float | None = None) -> dict:
    """Component times in microseconds: one 1-char target pass, one (k+1)-char verify pass, and
    the draft's time per drafted char (a whole k-char proposal, its Python loop included,
    divided by k). The three are timed in `rounds` interleaved rounds (a block of `reps` calls
    of each, in rotating order; the draft's block has reps // k proposals), and each is the
    median over rounds of its block's mean per call, so a burst of load cannot hit one alone.

    tree_widths: time a tree instead (`tree_cost`): the verify pass over the tree's nodes and
    the draft's time per node.
    loops: name -> (run, passes): whole generations also timed as interleaved components, one run
    a round; `<name>_pass_us` is its time per pass. The trial times two (run_trial): `free`, the
    speculative loop with a free draft (src/engine/measuring/replay.py: the verify pass inside the loop plus
    the loop's own work, no drafting), and `base`, the baseline loop (a target pass plus its
    sampling), so that the cost model's loop times are measured in the same rounds as t1 and td.
    With a `base` loop, `<name>_per_base` gives each other component (target, verify, draft per
    char, the other loops per pass) in units of the base loop's pass, taken within each round and
    then the median over rounds (`round_ratio`): the machine's speed cancels as in a pair.
    width (chains): adaptive rounds. `rounds` is the minimum; rounds are added one at a time until
    the interval (at `level`) for the median of the per-round speculative pass over the reference
    pass (`pass_per_reference`: what the cost model's speculative time is built from) is at most
    `width` of its median wide, or max_rounds rounds or max_seconds of timed blocks are reached.
    Logged: `cost_rounds`, `cost_pass_width` (that interval's relative width) and, when adaptive,
    `cost_width_reached` (1 when it stopped on the width, 0 on a cap).
    A draft on the target's hidden state (heads) observes the prefill's last row first, so its
    proposal is the heads' forward and k draws, as in the loop.
    drafted: for a draft-length policy whose passes vary (src/engine/decoding/policy.py), the share of
    passes that drafted j chars, per j: a verify pass of each width j+1 is timed in the rounds
    (`verify_us_width_<j+1>`), and `verify_pass_us` is their mean under those shares, the verify
    cost of the loop's average pass; the draft is timed at k chars a proposal (per char, as a
    pass of any length pays it).
    keep_rounds: also return `rounds_us`, the per-round times behind the medians (`component_times`;
    not a metric: the prediction (analysis/prediction.py) resamples them for its interval).
    in_loop: the share of the loop's passes whose k drafts were all accepted (a chain of fixed k).
    Given it, the proposal is also timed as the loop runs it, right after a verify pass (whose
    weights and activations then stand in the caches the draft reads), in two more blocks of
    reps // k calls: a (k+1)-char verify pass then one proposal catching up one char, and the same
    catching up two (`rewound_proposal`); `draft_char_us_in_loop` is, per round, the two mixed by
    the share less the round's verify pass, over k (0 in a round where the verify pass's noise
    exceeds the proposal), and then the median over rounds. Its excess over `draft_char_us` is
    what drafting costs the loop beyond the proposal timed alone (the cost model's gamma)."""
    if in_loop is not None and (tree_widths is not None or drafted):
        raise ValueError("in_loop times a chain's proposal of fixed k: not a tree or a policy's lengths")
    if tree_widths is not None:
        return tree_cost(target, draft, prompt, tree_widths, temperature, reps, device, rounds, keep_rounds)
    gen = torch.Generator(device=device).manual_seed(0)
    draft.reset()
    if draft.uses_target_hidden:
        positions, h = prefill(target, prompt, return_hidden=True)
        if h is None:  # 1-char prompt: no prefill; the row of a pass on it costs the heads the same
            h = target(torch.tensor([prompt[-1:]], device=device), positions[:1], return_hidden=True)[1][0, -1]
        draft.observe(h, prompt[-1])
    else:
        positions = prefill(target, prompt)
    one_char, verify = target_passes(target, prompt, positions, k, device)
    blocks = {"target": (one_char, reps),
              "draft": (proposal(draft, prompt, k, temperature, gen), max(1, reps // k))}
    if drafted:
        for j in drafted:
            blocks[f"verify {j + 1}"] = (target_passes(target, prompt, positions, j, device)[1], reps)
    else:
        blocks["verify"] = (verify, reps)
    if in_loop is not None:
        verify = blocks["verify"][0]
        for catch_up in (1, 2):
            then_propose = rewound_proposal(draft, prompt, k, temperature, gen, catch_up)
            blocks[f"verify, draft {catch_up}"] = (lambda p=then_propose: (verify(), p()), max(1, reps // k))
    # a loop's prefill rewrites the target's cache with the same prompt keys, and the other
    # blocks' passes cost the same whatever the slots beyond it hold
    return component_times(blocks, k, loops or {}, rounds, width, level, max_rounds, max_seconds, device, drafted,
                           keep_rounds, in_loop)


def component_times(blocks: dict, k: int, loops: dict, rounds: int, width: float | None, level: float,
                    max_rounds: int | None, max_seconds: float | None, device: str,
                    drafted: dict[int, float] | None = None, keep_rounds: bool = False,
                    in_loop: float | None = None) -> dict:
    """measure_cost's rounds and statistics over its timed blocks: "target" (a 1-char pass),
    "verify" (a (k+1)-char pass; with `drafted`, "verify <w>" per width w instead, mixed per round
    by the shares of passes drafting w-1 chars), "draft" (one k-char proposal) and one "<name> loop"
    per loop. keep_rounds: out["rounds_us"] = {"target", "verify", "draft", each loop's name} -> one
    value per round in microseconds (the verify pass mixed by the shares, the draft per drafted
    char, a loop per pass), whose medians are target_pass_us, verify_pass_us, draft_char_us and
    <name>_pass_us. in_loop: the share of full accepts mixing the blocks "verify, draft 1" and
    "verify, draft 2" (a verify pass then a proposal catching up one char, or two) into
    `draft_char_us_in_loop` (measure_cost), kept as "draft in loop" in rounds_us; without a block
    "verify, draft 1" (measure_batch_cost's, share 1), the block "verify, draft 2" alone."""
    blocks = blocks | {f"{name} loop": (run, 1) for name, (run, _) in loops.items()}
    adaptive = bool(width)

    def mixed(per_call):   # the verify pass of the loop's average pass, per round
        if drafted:
            per_call = per_call | {"verify": [sum(share * per_call[f"verify {j + 1}"][r] for j, share in drafted.items())
                                              for r in range(len(per_call["target"]))]}
        return per_call

    def pass_width(per_call):
        return relative_width(pass_per_reference(mixed(per_call), loops), level)
    per_round, stop = adaptive_rounds(blocks, rounds, (lambda pc: pass_width(pc) <= width) if adaptive else None,
                                      max_rounds, max_seconds, device)
    per_round = mixed(per_round)
    stats = {"cost_rounds": len(per_round["target"])}
    if math.isfinite(w := pass_width(per_round)):  # too few rounds to say: not logged
        stats["cost_pass_width"] = w
    if stop != FIXED:
        stats["cost_width_reached"] = int(stop == WIDTH)
    per_round["draft"] = [x / k for x in per_round["draft"]]   # per drafted char
    if in_loop is not None:   # per round: the loop's mix of the two catch-ups, less the verify pass, per drafted char
        two = per_round.pop("verify, draft 2")
        after = zip(per_round.pop("verify, draft 1", two), two, per_round["verify"])   # a batch's: two only
        in_loop_round = [max(0.0, ((1 - in_loop) * one + in_loop * two - v) / k) for one, two, v in after]
    for name, (_, passes) in loops.items():                    # per pass
        per_round[name] = [x / passes for x in per_round.pop(f"{name} loop")]
    t = {name: statistics.median(x) for name, x in per_round.items()}
    out = {"target_pass_us": t["target"] * 1e6, "verify_pass_us": t["verify"] * 1e6,
           "draft_char_us": t["draft"] * 1e6, "c": t["draft"] / t["target"]}
    out |= {f"{name}_pass_us": t[name] * 1e6 for name in loops}
    out |= {f"verify_us_width_{j + 1}": t[f"verify {j + 1}"] * 1e6 for j in drafted or {}}
    out |= stats
    if in_loop is not None:
        out["draft_char_us_in_loop"] = statistics.median(in_loop_round) * 1e6
    if "base" in loops:  # every other component in units of the baseline loop's pass, within each round
        out |= {f"{name}_per_base": round_ratio(x, per_round["base"]) for name, x in per_round.items()
                if name != "base" and not name.startswith("verify ")}
    if keep_rounds:
        out["rounds_us"] = {name: [x * 1e6 for x in per_round[name]] for name in ("target", "verify", "draft", *loops)}
        if in_loop is not None:
            out["rounds_us"]["draft in loop"] = [x * 1e6 for x in in_loop_round]
    return out


@torch.no_grad()
def measure_batch_cost(target, draft: Draft, prompts: list[list[int]], k: int, temperature: float, reps: int,
                       device: str, rounds: int = 7, width: float | None = None, level: float = 0.95,
                       max_rounds: int | None = None, max_seconds: float | None = None,
                       keep_rounds: bool = False, loops=None, in_loop: bool = False) -> dict:
    """measure_cost for a batch of B sequences (src/engine/decoding/batch.py), as its loops run: a (B, 1)
    target pass (the baseline's step), a (B, k+1) verify pass at per-sequence positions (the
    speculative step's), and one k-char proposal for all B rows (`propose_batch`; its time / k is
    `draft_char_us`, per drafted position of the whole batch, so c = draft_char_us / target_pass_us
    stays the cost of drafting one char per sequence in units of the batch's one-char pass).
    Same rounds and width test as measure_cost. loops: as measure_cost's, whole batch runs timed
    as components (src/trial/probes.py times the batch's baseline loop and its free loop, replaying a
    recorded batch run: src/engine/measuring/replay.py); a trial at B > 1 times none.
    in_loop: also time the proposal as the batch loop runs it, right after a verify pass, in a block
    of reps // k calls ("verify, draft 2": a batch's draft of its own feeds every row its last two
    chars at each proposal, ModelDraft.propose_batch, so its share of two-char catch-ups is 1):
    `draft_char_us_in_loop`, per round that block less the verify pass, over k (measure_cost's)."""
    gen = torch.Generator(device=device).manual_seed(0)
    B = len(prompts)
    one_char, verify = batch_target_passes(target, prompts, k, device)
    sources = [UniformBuffer(gen) for _ in range(B)]
    rows = list(range(B))
    draft.reset()
    draft.propose_batch(prompts, rows, k, temperature, sources)   # the draft's own prefill, untimed
    seqs = [p + p[-1:] for p in prompts]

    def propose_k():
        draft.propose_batch(seqs, rows, k, temperature, sources)
    blocks = {"target": (one_char, reps), "verify": (verify, reps), "draft": (propose_k, max(1, reps // k))}
    if in_loop:
        blocks["verify, draft 2"] = (lambda: (verify(), propose_k()), max(1, reps // k))
    return component_times(blocks, k, loops or {}, rounds, width, level, max_rounds, max_seconds, device,
                           keep_rounds=keep_rounds, in_loop=1.0 if in_loop else None)


@torch.no_grad()
def cost_profile(target, draft: Draft, prompt: list[int], k: int, temperature: float, reps: int, device: str,
                 rounds: int, baseline) -> dict:
    """The draft-length policy `cost`'s costs, in units of a one-char target pass t1, from one
    measure_cost at k (fixed rounds; `baseline`: (run, chars) of the baseline loop, timed with the
    components): c = td / t1, b = (tv(k+1) / t1 - 1) / k the verify pass's marginal cost per char,
    o = the baseline loop's pass / t1 - 1 the loop's own work per pass (b, o floored at 0)."""
    m = measure_cost(target, draft, prompt, k, temperature, reps, device, rounds, loops={"base": baseline})
    t1 = m["target_pass_us"]
    return {"c": m["draft_char_us"] / t1, "b": max(0.0, (m["verify_pass_us"] / t1 - 1) / k),
            "o": max(0.0, m["base_pass_us"] / t1 - 1)}


@torch.no_grad()
def tree_cost(target, draft: Draft, prompt: list[int], widths, temperature: float, reps: int, device: str,
              rounds: int = 7, keep_rounds: bool = False) -> dict:
    """measure_cost for a tree: one 1-char target pass, one verify pass over [last char, N
    nodes] (tree mask, scratch slots: the loop's own forward, its inputs prepared untimed), and
    the draft's time per node (a whole tree built, next_probs calls and draws included, divided
    by its N nodes). N is the node count of a tree drafted after the prompt: the full shape's
    unless the draft's rows there have fewer chars with mass than a width. keep_rounds: as in
    `component_times` (the draft per node)."""
    gen = torch.Generator(device=device).manual_seed(0)
    positions = prefill(target, prompt, extra=max_nodes(widths))
    P = len(prompt)
    one = torch.tensor([prompt[-1:]], device=device)          # (1, 1)
    tree = build_tree(draft, prompt, widths, temperature, gen)
    idx, pos, slots, mask = tree_inputs(tree, P, positions, TreeMasks(positions.device))  # (1, 1+N), ...
    n = tree.n_nodes
    per_round = interleaved_rounds({"target": (lambda: target(one, positions[P - 1:P]), reps),
                                    "verify": (lambda: target(idx, pos, slots, mask), reps),
                                    "draft": (lambda: build_tree(draft, prompt, widths, temperature, gen),
                                              max(1, reps // max(1, tree.internal)))}, rounds, device)
    per_round["draft"] = [x / n for x in per_round["draft"]]   # per node
    t = {name: statistics.median(x) for name, x in per_round.items()}
    out = {"target_pass_us": t["target"] * 1e6, "verify_pass_us": t["verify"] * 1e6,
           "draft_char_us": t["draft"] * 1e6, "c": t["draft"] / t["target"], "verify_nodes": n}
    if keep_rounds:
        out["rounds_us"] = {name: [x * 1e6 for x in v] for name, v in per_round.items()}
    return out


@torch.no_grad()
def verify_pass(target, prompt: list[int], k: int, device: str):
    """A (k+1)-char verify pass after `prompt`, as measure_cost's verify block runs it (the target's
    cache prefilled with the prompt here): `replay_draft_costs`'s `before` for a chain."""
    return target_passes(target, prompt, prefill(target, prompt), k, device)[1]


@torch.no_grad()
def batch_verify_pass(target, prompts: list[list[int]], k: int, device: str):
    """A (B, k+1) verify pass after B prompts, as measure_batch_cost's verify block runs it (the
    target's cache prefilled with them here): `replay_draft_costs`'s `before` at a batch."""
    return batch_target_passes(target, prompts, k, device)[1]


def replay_draft_costs(draft: Draft, seq: torch.Tensor, n: int, step: float, draft_pass,
                       rounds: int = 3, before=None, every: int = 1) -> list[float]:
    """Microseconds per drafted char (or node) of a draft that memoizes rows (table drafts), paid
    as the loop pays it: along each sampled sequence of seq (B, P + n) ids, memos dropped at its
    start (`draft.reset()`, as at the start of every run of a trial), one pass's drafting
    `draft_pass(prefix) -> chars drafted` at every `step` chars (the expected chars per pass), so
    each context's row is built the first time the text meets it. `measure_cost` times the same
    proposal over and over (warm rows) and misses that. One value per replay, `rounds` replays.
    before: run untimed before the first draft pass and then before every `every`-th, counted
    across the sequences: every = 1 for a chain's (k+1)-char verify pass (in the loop every
    proposal follows one, whose weights and activations displace the rows from the caches), B for
    a batch's (B, k+1) one (the batch's B proposals, one per row, follow one verify pass)."""
    P = seq.shape[1] - n
    rows = seq.tolist()
    per_char = []
    for _ in range(max(1, rounds)):
        seconds, drafted, count = 0.0, 0, 0
        for r in rows:
            draft.reset()
            j, L = 0, P
            while L < P + n:
                if before is not None and count % every == 0:
                    before()
                count += 1
                t0 = time.perf_counter()
                drafted += draft_pass(r[:L])
                seconds += time.perf_counter() - t0
                j += 1
                L = P + int(j * step)
        per_char.append(seconds / max(1, drafted) * 1e6)
    draft.reset()
    return per_char


class _FixedRow:
    """A stand-in draft for a depth-1 tree: next_probs is the draft's row after the prompt."""
    def __init__(self, row):
        self.row = row

    def next_probs(self, context, temperature):
        return self.row


@torch.no_grad()
def exactness_check(target, draft: Draft, prompt: list[int], temperature: float, samples: int, seed: int,
                    tree_widths=None) -> dict:
    """The seed's check: the first char after `prompt`, `samples` times, by the speculative
    rule and directly from the target; TVD of each histogram to the exact target distribution.
    Only the first emitted char is read, so one drafted position suffices; with tree_widths,
    the root's widths[0] candidates (drawn without replacement, recursive rejection) suffice."""
    device = target.causal.device
    gen = torch.Generator(device=device).manual_seed(seed)
    positions = prefill(target, prompt)
    P = len(prompt)
    p = probs_from_logits(target(torch.tensor([prompt[-1:]], device=device), positions[P - 1:P])[0, -1],
                          temperature)                                                   # (V,)
    q = draft.probs(torch.tensor([prompt], device=device), temperature)[0, -1]           # (V,)
    V = p.numel()
    p2, q1 = torch.stack([p, p]), q.unsqueeze(0)  # (2, V), (1, V): k = 1; p2[1] is never read for the first char
    first = []
    if tree_widths is not None:
        fixed, shape, P_rows = _FixedRow(q.tolist()), (tree_widths[0],), [p.tolist()] * (1 + tree_widths[0])
        for _ in range(samples):  # P_rows[child] is only read for the bonus, never the first char
            tree = build_tree(fixed, prompt, shape, temperature, gen)
            path, nxt, _, _ = tree_accept(P_rows, tree, uniforms(tree.n_nodes + 1, gen))
            first.append(tree.tokens[path[0]] if path else nxt)
    for _ in range(samples if tree_widths is None else 0):
        d1 = sample(q, gen)
        n, nxt = speculative_accept(p2, q1, [d1], gen)
        first.append(d1 if n == 1 else nxt)
    direct = torch.multinomial(p, samples, replacement=True, generator=gen)  # the reference sampler
    return {"tvd_speculative": tvd(torch.bincount(torch.tensor(first), minlength=V), p),
            "tvd_direct": tvd(torch.bincount(direct, minlength=V), p)}
