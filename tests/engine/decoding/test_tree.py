"""Tree verification (src/engine/decoding/tree.py) emits exactly the target's distribution, at every
position 1..depth+1, and its one-pass tree forward keeps the cache right.

Method (the house method of tests/engine/decoding/test_exactness.py): B independent tree steps from a fixed
prompt, each drafted by the production builder `build_tree` (children without replacement from
the draft's `next_probs`) and accepted by the production `tree_accept`. The target's
distributions at the tree's nodes (what the verify pass would give) come from full forwards,
cache set aside, so these tests are about the sampling rule; `test_tree_pass_equals_full_forwards`
and `test_loop_verify_passes_equal_full_forwards` tie the one-pass tree forward (mask, scratch
slots, the accepted path's copy) to full forwards. For every emitted position m we know the
target's exact distribution given the emitted prefix (a full forward), so a chi-square test with
per-draw expected distributions (tests/chisquare.py) compares observed and expected counts per
position, the bonus position depth+1 included.

False-failure rate: each position test rejects at p < ALPHA = 1e-4; this file runs at most 45
of them, so a correct sampler fails it with probability < 0.45% for a random generator seed (the
seeds are fixed: the outcome is reproducible). The two negative controls (a path kept by
independent per-node tests without residuals; a residual that forgets the earlier siblings'
q) must be rejected by the same test at p < 1e-6.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch

from src.engine.decoding.decode import generate_baseline, prefill
from src.engine.sampling import draw, probs_from_logits, residual_weights, uniforms
from src.engine.decoding.tree import (TreeMasks, _normalized, build_tree, commit_path, generate_tree, max_nodes,
                             tree_accept, tree_verify)
from tests.engine.decoding.test_exactness import ALPHA, DRAFT_NAMES, by_speed, full_probs, position_p_values

B = 6000
SHAPE = (4, 2, 2, 1)   # the shape of conf/verify/tree.yaml: 44 nodes
# every draft's test: depth 3 with siblings at two depths; its rows are needed at depths 0-2
# only, so a model draft's next_probs runs once per distinct prefix of <= 2 chars (MemoDraft)
DRAFT_SHAPE = (3, 2, 1)
CONTROL_T = 1.5        # the negative controls' temperature (see test_negative_controls_are_rejected)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many small forwards: one torch thread is faster on a shared machine (restored after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class MemoDraft:
    """A draft's next_probs memoized on the context. next_probs is a pure function of the
    context, so the rows (and the builder's law) are the draft's own; a model draft then runs one
    forward per distinct prefix instead of one per node of every tree."""

    def __init__(self, draft):
        self.draft, self.rows = draft, {}

    def next_probs(self, context, temperature):
        key = (tuple(context), temperature)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = self.draft.next_probs(context, temperature)
        return row


def node_paths(tree) -> list[list[int]]:
    """The chars from the root to each node (breadth-first order: parents come first)."""
    paths = [[]]
    for i in range(1, len(tree.tokens)):
        paths.append(paths[tree.parent[i]] + [tree.tokens[i]])
    return paths


def node_probs(target, prefix: list[int], trees, temperature, forward=None) -> list[list[list[float]]]:
    """Per tree, the target's distribution after each node (1+N rows of V floats), from full
    forwards (`forward`: (B, T) ids -> (B, T, V) probs; default full_probs) over prefix + the
    node's path: one batch per distinct path length."""
    forward = forward or (lambda idx: full_probs(target, idx, temperature))
    by_len: dict[int, dict[tuple, int]] = {}
    for tree in trees:
        for path in node_paths(tree):
            by_len.setdefault(len(path), {}).setdefault(tuple(path), 0)
    rows = {}
    for d, paths in by_len.items():
        keys = list(paths)
        for key, row in zip(keys, forward(torch.tensor([prefix + list(key) for key in keys]))[:, -1].tolist()):
            rows[key] = row
    return [[rows[tuple(path)] for path in node_paths(tree)] for tree in trees]


def simulate_tree_steps(target, draft, prompt, widths, temperature, gen, accept=tree_accept, n=B):
    """n independent tree steps from `prompt` (B, P ids): production builder and `accept`.
    Returns (chars (n, D+1), emitted (n, D+1) bool, p (n, D+1, V)): the target's exact
    distribution at each position given the prompt and the chars emitted before it."""
    D = len(widths)
    prefix = prompt.tolist()
    memo = MemoDraft(draft)
    trees = [build_tree(memo, prefix, widths, temperature, gen) for _ in range(n)]
    P = node_probs(target, prefix, trees, temperature)
    chars = torch.zeros(n, D + 1, dtype=torch.long)
    emitted = torch.zeros(n, D + 1, dtype=torch.bool)
    for b, tree in enumerate(trees):
        path, nxt, _, _ = accept(P[b], tree, uniforms(tree.n_nodes + 1, gen))
        out = [tree.tokens[i] for i in path] + [nxt]
        chars[b, :len(out)] = torch.tensor(out)
        emitted[b, :len(out)] = True
    L = len(prefix)
    p_emitted = full_probs(target, torch.cat([prompt.expand(n, L), chars], 1), temperature)[:, L - 1:L + D]
    return chars, emitted, p_emitted


def assert_exact(chars, emitted, p_exact, depth, label, bonus_required=True):
    results = position_p_values(chars, emitted, p_exact)
    assert results[0][0] == 1 and len(results) >= min(depth + 1, 3), label
    if bonus_required:
        assert results[-1][0] == depth + 1, f"{label}: the bonus position was reached too rarely to test"
    for m, pv in results:
        assert pv > ALPHA, f"{label}: position {m} deviates from the target (p = {pv:.2e})"


def broken_no_residual_longest_path(P, tree, u, track_overlap=False):
    """NEGATIVE CONTROL (a): each node passes an independent min(1, p/q) test (p the target's
    row at its parent, q the parent's draft row, no residual); the longest path of passing nodes
    is kept (the first such in breadth-first order), then one char from the target's p at its end."""
    n = tree.n_nodes
    ok, best = [True] + [False] * n, 0
    for i in range(1, n + 1):
        par, x = tree.parent[i], tree.tokens[i]
        ok[i] = ok[par] and u[i - 1] * tree.rows[par][x] < P[par][x]
        if ok[i] and tree.depth[i] > tree.depth[best]:
            best = i
    path, i = [], best
    while i:
        path.append(i)
        i = tree.parent[i]
    return path[::-1], draw(P[best], u[n]), 0, 0.0


def broken_forgets_earlier_siblings(P, tree, u, track_overlap=False):
    """NEGATIVE CONTROL (b): `tree_accept` whose residual forgets the earlier siblings: after a
    rejection r = normalize(max(0, p - q_j)) from the target's p at the node, subtracting only
    the latest sibling's q_j (q_j itself is right: the row without the earlier siblings)."""
    node, r, path, ui = 0, P[0], [], 0
    while True:
        kids = tree.children[node]
        if not kids:
            return path, draw(P[node], u[ui]), 0, 0.0
        q, w = tree.rows[node], list(tree.rows[node])
        for c in kids:
            x, z = tree.tokens[c], tree.mass[c]
            if u[ui] * q[x] < r[x] * z:
                ui += 1
                path.append(c)
                node, r = c, P[c]
                break
            ui += 1
            r = _normalized(residual_weights(P[node], [a / z for a in w]))   # the bug: P[node], not r
            w[x] = 0.0
        else:
            return path, draw(r, u[ui]), 0, 0.0


@pytest.mark.parametrize("name", by_speed(DRAFT_NAMES))
def test_every_position_has_the_target_distribution(tiny, drafts, name):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    chars, emitted, p_exact = simulate_tree_steps(target.model, drafts[name], prompt, DRAFT_SHAPE, 1.0,
                                                  torch.Generator().manual_seed(21))
    assert_exact(chars, emitted, p_exact, len(DRAFT_SHAPE), f"{name} tree {DRAFT_SHAPE}")


@pytest.mark.slow
@pytest.mark.parametrize("widths,temperature", [(SHAPE, 1.0), ((2, 2, 2), 1.0), ((1, 1, 1, 1), 1.0),
                                                ((6,), 1.0), (SHAPE, 0.7), (SHAPE, CONTROL_T)])
def test_bigram_shapes_and_temperature(tiny, drafts, widths, temperature):
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    chars, emitted, p_exact = simulate_tree_steps(target.model, drafts["bigram"], prompt, widths, temperature,
                                                  torch.Generator().manual_seed(31 + len(widths)))
    assert_exact(chars, emitted, p_exact, len(widths), f"bigram tree {widths} T={temperature}")


@pytest.mark.slow
def test_draft_with_zeros_where_target_has_mass_stays_exact(tiny, zeroed):
    """The residual must emit chars the draft never proposes (q = 0, p > 0)."""
    _, _, target = tiny
    draft, zero_ids, prompt = zeroed
    chars, emitted, p_exact = simulate_tree_steps(target.model, draft, prompt, SHAPE, 1.0,
                                                  torch.Generator().manual_seed(41), n=4000)
    assert torch.isin(chars[emitted], torch.tensor(zero_ids)).any()
    assert_exact(chars, emitted, p_exact, len(SHAPE), "zeroed draft", bonus_required=False)


@pytest.mark.slow
@pytest.mark.parametrize("broken", [broken_no_residual_longest_path, broken_forgets_earlier_siblings])
def test_negative_controls_are_rejected(tiny, drafts, broken):
    """At CONTROL_T the target is flatter, so later siblings are tried often enough for (b)'s
    bias to show at p < 1e-6 (at T=1 on this peaked tiny target it sits near 1e-6); the
    production rule passes the same test at the same settings (test_bigram_shapes_and_temperature)."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    chars, emitted, p_exact = simulate_tree_steps(target.model, drafts["bigram"], prompt, SHAPE, CONTROL_T,
                                                  torch.Generator().manual_seed(51), accept=broken)
    p_values = dict(position_p_values(chars, emitted, p_exact))
    assert min(p_values.values()) < 1e-6, f"{broken.__name__} was not caught: {p_values}"


@pytest.mark.parametrize("name", DRAFT_NAMES)
def test_greedy_tree_equals_greedy_baseline(tiny, drafts, name):
    """At temperature 0 the draft's rows are one-hot: sampling without replacement finds one
    char with mass, so every node has exactly one child and the tree is the greedy chain."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    base = generate_baseline(target.model, prompt, 100, 0.0, torch.Generator().manual_seed(0))
    g = generate_tree(target.model, drafts[name], prompt, 100, SHAPE, 0.0, torch.Generator().manual_seed(0))
    assert g.tokens == base.tokens
    assert g.proposed == g.target_passes * len(SHAPE)            # one child per node
    assert g.chars_emitted == g.target_passes + g.accepted


def test_tree_pass_equals_full_forwards(tiny, drafts):
    """One tree pass gives, at every node, the target's logits after prefix + the node's path;
    after `commit_path` copies the accepted path into slots L..L+n-1, later passes (tree and
    chain) see a contiguous prefix: their logits equal full forwards too. Three passes in a
    row, keeping a deep path (copied from scratch slots), no path, and a middle one."""
    cfg, _, target = tiny
    model, V = target.model, target.tokenizer.vocab_size
    with model.cache_set_aside():
        ref = copy.deepcopy(model)        # full forwards without touching the cache under test

    def full(idx):                        # (B, T) -> (B, T, V) logits
        return ref(idx)
    seq = target.tokenizer.encode(cfg.prompt).tolist()
    positions = prefill(model, seq, extra=max_nodes(SHAPE))
    masks, gen = TreeMasks(positions.device), torch.Generator().manual_seed(61)
    with torch.no_grad():
        for pick in ("last", "none", "middle"):
            L = len(seq)
            tree = build_tree(drafts["bigram"], seq, SHAPE, 1.0, gen)
            got = tree_verify(model, tree, L, positions, masks, 1.0)     # (1+N, V)
            want = node_probs(model, seq, [tree], 1.0, lambda idx: probs_from_logits(full(idx), 1.0))[0]
            torch.testing.assert_close(got, torch.tensor(want), atol=1e-5, rtol=1e-4)
            end = {"last": tree.n_nodes, "none": 0, "middle": tree.children[tree.children[0][-1]][0]}[pick]
            path, i = [], end
            while i:
                path.append(i)
                i = tree.parent[i]
            path = path[::-1]
            assert pick == "none" or path != list(range(1, len(path) + 1))   # a real copy
            commit_path(model, path, L, positions)
            seq = seq + [tree.tokens[i] for i in path] + [(seq[-1] + 1) % V]
        # a chain verify pass of 4 chars after the three tree passes
        L, more = len(seq), [3 % V, 5 % V, 7 % V]
        logits = model(torch.tensor([seq[-1:] + more]), positions[L - 1:L + 3])[0]
        torch.testing.assert_close(logits, full(torch.tensor([seq + more]))[0, L - 1:], atol=1e-5, rtol=1e-4)


def test_loop_verify_passes_equal_full_forwards(tiny, drafts, monkeypatch):
    """Inside generate_tree at temperature 1 (paths copied from scratch slots), every pass's
    target rows equal full forwards over the committed chars + each node's path."""
    import src.engine.decoding.tree as tree_mod
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt).tolist()
    calls = []

    def recording_accept(P, tree, u, track_overlap=False):
        out = tree_accept(P, tree, u, track_overlap)
        calls.append((P, tree, out))
        return out
    monkeypatch.setattr(tree_mod, "tree_accept", recording_accept)
    g = generate_tree(target.model, drafts["bigram"], prompt, 60, SHAPE, 1.0, torch.Generator().manual_seed(71))
    seq, copied = list(prompt), 0
    for P, tree, (path, nxt, _, _) in calls:
        want = node_probs(target.model, seq, [tree], 1.0)[0]
        torch.testing.assert_close(torch.tensor(P), torch.tensor(want), atol=1e-5, rtol=1e-4)
        copied += path != list(range(1, len(path) + 1))
        seq += [tree.tokens[i] for i in path] + [nxt]
    assert seq[len(prompt):len(prompt) + 60] == g.tokens and len(calls) == g.target_passes
    assert copied >= 3   # the copy into place was exercised


def test_counters_and_analytic_acceptance(tiny, drafts):
    """Each acceptance test of a tree succeeds with probability sum_x min(r, q_j) given the
    history, so accepted - overlap_sum is a sum of martingale differences with variance
    sum beta (1 - beta) <= T beta_bar (1 - beta_bar) (Jensen): |z| < 4 fails a correct sampler
    with probability < 1e-4. Same seed, same chars and counters."""
    cfg, _, target = tiny
    prompt = target.tokenizer.encode(cfg.prompt)
    accepted = tested = 0
    overlap_sum = 0.0
    for seed in range(16):
        g = generate_tree(target.model, drafts["bigram"], prompt, 100, (3, 2), 1.0, torch.Generator().manual_seed(seed))
        assert g.chars_emitted == g.target_passes + g.accepted and g.proposed == 9 * g.target_passes
        assert g.accepted_at[0] >= g.accepted_at[1] and sum(g.accepted_at) == g.accepted
        accepted, tested, overlap_sum = accepted + g.accepted, tested + g.tested, overlap_sum + g.overlap_sum
    beta = overlap_sum / tested
    z = (accepted - overlap_sum) / math.sqrt(tested * beta * (1 - beta))
    assert tested >= 1000
    assert abs(z) < 4, f"counted {accepted / tested:.4f} vs analytic {beta:.4f} (z = {z:.2f})"
    runs = [generate_tree(target.model, drafts["bigram"], prompt, 80, SHAPE, 1.0, torch.Generator().manual_seed(s))
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0].tokens != runs[2].tokens


@pytest.mark.parametrize("name", DRAFT_NAMES)
def test_next_probs_is_probs(tiny, drafts, name):
    """The tree's rows (next_probs) are the draft's probs after the same context."""
    cfg, _, target = tiny
    seq = target.tokenizer.encode(cfg.prompt).tolist() + [1, 2]
    for T in (1.0, 0.7):
        row = torch.tensor(drafts[name].next_probs(seq, T))
        torch.testing.assert_close(row, drafts[name].probs(torch.tensor([seq]), T)[0, -1], atol=1e-6, rtol=1e-5)
