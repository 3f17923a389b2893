"""Tree verification: draft a tree of candidates, verify all of it in ONE target pass, accept
by recursive rejection sampling (SpecInfer, Sequoia; without replacement as in Recursive
Speculative Decoding). The chain of `decode.generate_speculative` is the tree of widths [1]*k.

Shape. `widths[d]` is the number of candidates drawn under each node of depth d (the root, at
depth 0, is the last committed char), so the depth is len(widths) and a full tree has
sum_d prod(widths[:d+1]) nodes. A node's children are drawn WITHOUT replacement from the
draft's distribution there (`Draft.next_probs`): child j from q_j = the row with the earlier
siblings' chars removed, renormalized. A row with fewer than w chars of positive mass gives
fewer children; at temperature 0 the row is one-hot, so every node has one child and the tree
is the greedy chain (which is what makes the tree loop equal the greedy baseline).

Verification. Nodes are numbered in breadth-first order, the root 0. The pass feeds
[root, node 1..N]; node i gets position L-1+depth(i) and cache slot L-1+i (scratch slots after
the committed prefix 0..L-2; nodes of one depth share a position, never a slot), and may
attend to the committed prefix and its own ancestors only. The accepted path's keys/values
are then copied to slots L..L+n-1, so the cache holds a contiguous prefix again.

Acceptance (`tree_accept`). At a node with residual r (the target's p there): try its children
in order; accept child j (char x) with probability min(1, r(x) / q_j(x)) and descend (r becomes
the target's p at the child); on rejection r <- normalize(max(0, r - q_j)) and try the next
sibling. When every child fails, emit a sample of r and stop; after an accepted leaf emit a
bonus char from the target's p at the leaf. Each emitted char is distributed as the target's.

The per-pass work runs on Python lists after one `.tolist()` per tensor, as in sampling.py.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate

import torch

from .decode import Generation, check_fits, id_list, prefill
from ..drafts.base import Draft
from ..models.model import Transformer
from ..sampling import UniformBuffer, draw, probs_from_logits, residual_weights, uniforms


def check_widths(widths, name: str = "tree widths") -> tuple[int, ...]:
    """The tree shape as a tuple of ints >= 1; ValueError (one line, naming `name`) otherwise."""
    try:
        shape = tuple(widths)
    except TypeError:
        shape = None
    if not shape or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in shape):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {widths!r}")
    return shape


def max_nodes(widths) -> int:
    """Nodes of the full tree (the root not counted): sum over depths of the product of widths."""
    total, level = 0, 1
    for w in widths:
        level *= w
        total += level
    return total


@dataclass
class Tree:
    """One pass's drafted tree; index 0 is the root (the last committed char), 1..N the
    nodes in breadth-first order. All lists have length 1+N."""
    tokens: list[int]                 # char of each node
    parent: list[int]                 # parent's index (-1 for the root)
    depth: list[int]                  # 0 for the root
    children: list[list[int]]         # child indices in the order they were drawn
    rows: list[list[float] | None]    # draft row q (V floats) at each node that has children
    mass: list[float]                 # node i: the mass left in its parent's row when i was drawn,
                                      # so q_j = (row with earlier siblings zeroed) / mass[i]

    @property
    def n_nodes(self) -> int:
        return len(self.tokens) - 1

    @property
    def internal(self) -> int:
        """Nodes whose row was asked for (the draft's next_probs calls)."""
        return sum(r is not None for r in self.rows)


def build_tree(draft: Draft, seq: list[int], widths, temperature: float, gen: torch.Generator) -> Tree:
    """Draft a tree after the committed chars `seq` (widths as `check_widths` returns)."""
    u = uniforms(max_nodes(widths), gen)   # one per drawn child; unused ones are skipped
    tokens, parent, depth, children = [seq[-1]], [-1], [0], [[]]
    rows: list = [None]
    mass = [0.0]
    paths = [[]]                           # chars from the root to each node
    frontier, ui = [0], 0
    for d, w in enumerate(widths):
        level = []
        for node in frontier:
            q = draft.next_probs(seq + paths[node], temperature)   # (V,) floats
            rows[node] = q
            weights = list(q)
            for _ in range(w):
                cdf = list(accumulate(weights))
                total = cdf[-1]
                if total <= 0.0:           # no char with mass left: fewer children
                    break
                # u < 1 so u * total < total: the char found has positive weight (see sampling.draw)
                x = bisect.bisect_right(cdf, u[ui] * total)
                ui += 1
                weights[x] = 0.0           # without replacement
                i = len(tokens)
                tokens.append(x)
                parent.append(node)
                depth.append(d + 1)
                children.append([])
                rows.append(None)
                mass.append(total)
                paths.append(paths[node] + [x])
                children[node].append(i)
                level.append(i)
        frontier = level
    return Tree(tokens, parent, depth, children, rows, mass)


def _normalized(w: list[float]) -> list[float]:
    s = sum(w)
    return [a / s for a in w]


def tree_accept(P: list[list[float]], tree: Tree, u: list[float], track_overlap: bool = False):
    """Recursive rejection sampling over one verified tree.

    P: 1+N rows of V floats, P[i] the target's distribution of the char after node i.
    u: at least N+1 uniforms (one per acceptance test, one for the final draw).
    Returns (path: accepted node indices root-down, next_char, tested, overlap): the sequence
    keeps the path's chars and then next_char (a residual sample, or the bonus after a leaf);
    tested counts acceptance tests; overlap sums sum_x min(r, q_j) over them (the exact
    acceptance probability of each test, when track_overlap)."""
    node, r, path, tested, ov, ui = 0, P[0], [], 0, 0.0, 0
    tokens, rows, mass = tree.tokens, tree.rows, tree.mass
    while True:
        kids = tree.children[node]
        if not kids:                                    # an accepted leaf: bonus from p at it
            return path, draw(P[node], u[ui]), tested, ov
        q = rows[node]
        w = None                                        # q with the rejected siblings zeroed
        for c in kids:
            x, z = tokens[c], mass[c]
            tested += 1
            if track_overlap:
                qj = [a / z for a in (q if w is None else w)]
                ov += sum(a if a < b else b for a, b in zip(r, qj))
            # u < r(x) / q_j(x) with q_j(x) = q(x) / z, without dividing
            if u[ui] * q[x] < r[x] * z:
                ui += 1
                path.append(c)
                node, r = c, P[c]
                break
            ui += 1
            if w is None:
                w = list(q)
            qj = [a / z for a in w]
            r = _normalized(residual_weights(r, qj))   # all-zero residual: r unchanged (p == q_j)
            w[x] = 0.0
        else:                                           # every child rejected
            return path, draw(r, u[ui]), tested, ov


class TreeMasks:
    """Per tree structure (its parent list), cached: node depths (1+N,) and the ancestor
    matrix anc (1+N, 1+N), anc[i, j] = node j is node i or one of its ancestors. The shape is
    fixed, so the structure almost always repeats and each pass costs a dict lookup."""

    def __init__(self, device):
        self.device = device
        self._cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, tree: Tree) -> tuple[torch.Tensor, torch.Tensor]:
        key = tuple(tree.parent)
        hit = self._cache.get(key)
        if hit is None:
            n = len(tree.parent)
            anc = [[False] * n for _ in range(n)]
            for i in range(n):
                if i:
                    anc[i] = list(anc[tree.parent[i]])  # parents come first in breadth-first order
                anc[i][i] = True
            hit = (torch.tensor(tree.depth, device=self.device), torch.tensor(anc, device=self.device))
            self._cache[key] = hit
        return hit


def tree_inputs(tree: Tree, L: int, positions: torch.Tensor, masks: TreeMasks):
    """The verify pass's inputs for a tree drafted after L committed chars:
    idx (1, 1+N) chars, pos (1+N,) positions L-1+depth, slots (1+N,) = L-1..L-1+N and the
    mask (1+N, S): every input sees the committed slots 0..L-2, then its ancestors and itself."""
    depth, anc = masks.get(tree)
    n = len(tree.tokens)
    idx = torch.tensor([tree.tokens], device=positions.device)
    mask = torch.zeros(n, positions.shape[0], dtype=torch.bool, device=positions.device)
    mask[:, :L - 1] = True
    mask[:, L - 1:L - 1 + n] = anc
    return idx, depth + (L - 1), positions[L - 1:L - 1 + n], mask


def tree_verify(target: Transformer, tree: Tree, L: int, positions: torch.Tensor, masks: TreeMasks,
                temperature: float) -> torch.Tensor:
    """One target pass over the whole tree: (1+N, V) probabilities, row i after node i."""
    idx, pos, slots, mask = tree_inputs(tree, L, positions, masks)
    return probs_from_logits(target(idx, pos, slots, mask)[0], temperature)


def commit_path(target: Transformer, path: list[int], L: int, positions: torch.Tensor) -> None:
    """Copy the accepted nodes' keys/values from their scratch slots L-1+i to slots L..L+n-1
    (nothing to do where they are in place already, as in a chain)."""
    n = len(path)
    if n and path != list(range(1, n + 1)):
        target.move_cache(positions[[L - 1 + i for i in path]], positions[L:L + n])


@torch.no_grad()
def generate_tree(target: Transformer, draft: Draft, prompt, n_chars: int, widths, temperature: float,
                  gen: torch.Generator, track_overlap: bool = True) -> Generation:
    """Tree speculative sampling until n_chars are emitted; the output is truncated to n_chars.

    Counters: proposed = tree nodes drafted, accepted = accepted path lengths, tested =
    acceptance tests run (each child tried), accepted_at[d] = passes whose path reached depth
    d+1, draft_calls = the draft's next_probs calls (nodes with children), overlap_sum = the sum
    over tests of their exact acceptance probability (with track_overlap).
    """
    shape = check_widths(widths)
    D, N = len(shape), max_nodes(shape)
    seq = id_list(prompt)
    P = len(seq)
    check_fits(target, P, n_chars, D)
    positions = prefill(target, seq, extra=N)    # scratch slots for the largest tree
    masks = TreeMasks(positions.device)
    draft.reset()
    u = UniformBuffer(gen)  # the acceptance tests' uniforms; build_tree draws from gen itself
    g = Generation([], 0, accepted_at=[0] * D)
    while len(seq) - P < n_chars:
        L = len(seq)
        tree = build_tree(draft, seq, shape, temperature, gen)
        p = tree_verify(target, tree, L, positions, masks, temperature)           # (1+N, V)
        path, nxt, tested, ov = tree_accept(p.tolist(), tree, u.take(tree.n_nodes + 1), track_overlap)
        commit_path(target, path, L, positions)
        n = len(path)
        seq += [tree.tokens[i] for i in path]
        seq.append(nxt)
        draft.rewind(L + n)
        g.target_passes += 1
        g.draft_calls += tree.internal
        g.proposed += tree.n_nodes
        g.accepted += n
        g.tested += tested
        g.overlap_sum += ov
        for d in range(n):
            g.accepted_at[d] += 1
    g.chars_emitted = len(seq) - P
    g.tokens = seq[P:P + n_chars]
    return g
