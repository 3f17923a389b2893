"""Acceptance without timing anything: text sampled from the target and the draft's exact
acceptance on it, or the speculative loop's own passes (counters only).

- `sample_text`: sequences sampled from the target after a prompt, with the distribution each
  char was drawn from (what the loop's emitted text is distributed as: speculative sampling
  is exact).
- `mean_overlap`: the mean over those positions of sum_x min(p(x), q(x)), the exact probability
  that a draft's first char is accepted there (the per-position acceptance a of the i.i.d.
  formula).
- `chain_survival`: S_i = P(drafts 1..i of a chain are all accepted), i = 1..k, at prefixes cut
  from that text (`drawn_chains`): the chain is drawn from the draft (`Draft.sample_chain`), the
  target scores it in one forward, and `survival` turns (p, q, drafts) into S_i. A pass then emits
  1 + S_1 + ... + S_k chars on average, whatever the dependence between positions, if passes
  started at uniform positions of target text (they do not: see the next item, which
  the prediction's probes use, src/trial/probes.py; this one is the comparison).
- `loop_survival`: the same S_i, but at the prefixes where the speculative loop itself starts its
  passes (it runs the loop, counters only, and averages `survival` over its passes). Those are
  not uniform positions of target text: a pass starts right after a rejection's residual char or
  after a full accept's bonus char. On the medium target the uniform prefixes overstated the
  chars per pass by 2-7% (ngram k=8: 5.03 against 4.68 at the loop's own pass starts and 4.85
  counted over the same 669 passes).
- `chain_acceptance`: per drawn chain, each draft's chance to be kept once reached and its
  expectation before it is drawn (src/bench/policy_ceiling.py bounds what a draft-length policy
  can gain with them).
- `acceptance_map`: the draft-length policy `cost`'s estimate of a drafted char's acceptance from
  the draft's own q(d) (src/engine/decoding/policy.py), calibrated on that text.
- `tree_chars`: the same for a tree of drafts (src/engine/decoding/tree.py): trees drawn at prefixes of that
  text, each verified in one target pass, and `expected_accepted` (the mean accepted path length
  of recursive rejection sampling over one drawn tree, exact given the tree).
"""
from __future__ import annotations

import torch

from ..decoding.decode import generate_speculative, prefill
from ..decoding.policy import AcceptanceMap
from ..sampling import kept_probs, overlap, probs_from_logits, residual_weights, survival
from ..decoding.tree import TreeMasks, build_tree, max_nodes, tree_verify


@torch.no_grad()
def sample_text(model, prompt: list[int], n_seqs: int, n_chars: int, seed: int, temperature: float = 1.0):
    """n_seqs sequences of n_chars sampled from the target at `temperature` after `prompt`, batched.
    Returns (ids (n_seqs, P + n_chars), p (n_seqs, n_chars, V)): p[:, t] is the distribution
    char P + t was drawn from (one-hot at temperature 0)."""
    gen = torch.Generator().manual_seed(seed)
    P = len(prompt)
    seq = torch.tensor([prompt] * n_seqs)
    ps = []
    with model.cache_set_aside():
        model.setup_cache(n_seqs)
        pos = torch.arange(model.cfg.block_size)
        if P > 1:
            model(seq[:, :-1], pos[:P - 1])
        for L in range(P, P + n_chars):
            p = probs_from_logits(model(seq[:, -1:], pos[L - 1:L])[:, -1], temperature)   # (n_seqs, V)
            seq = torch.cat([seq, torch.multinomial(p, 1, generator=gen)], 1)
            ps.append(p)
    return seq, torch.stack(ps, 1)


@torch.no_grad()
def acceptance_map(target, draft, prompt: list[int], temperature: float, n_seqs: int, n_chars: int, seed: int,
                   bins: int) -> AcceptanceMap:
    """a(q): the mean acceptance min(1, p(d) / q(d)) of a char d the draft draws, given its own
    probability q(d), in `bins` quantile bins of q(d). Calibrated on `n_seqs` sequences of
    `n_chars` sampled from the target (`sample_text`, seed `seed`): at each position the draft's
    row q after the sampled prefix (`probs`), one char d ~ q (seed + 1), and p the target's row
    there. A bin no draw fell in (tied edges) takes the mean over all draws."""
    seq, p = sample_text(target, prompt, n_seqs, n_chars, seed, temperature)        # (B, P + n), (B, n, V)
    P = seq.shape[1] - n_chars
    q = draft.probs(seq, temperature)[:, P - 1:P - 1 + n_chars].reshape(-1, p.shape[-1]).double()  # (B n, V)
    d = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed + 1))   # (B n, 1)
    qd = q.gather(-1, d)[:, 0]                                                       # (B n,)
    r = (p.reshape(-1, p.shape[-1]).double().gather(-1, d)[:, 0] / qd).clamp(max=1.0)
    edges = torch.unique(torch.quantile(qd, torch.arange(1, bins, dtype=torch.float64) / bins))   # ascending
    which = torch.bucketize(qd, edges, right=True)          # bin i: edges[i-1] <= q(d) < edges[i], as bisect_right
    values = [float(r[which == i].mean()) if (which == i).any() else float(r.mean()) for i in range(len(edges) + 1)]
    return AcceptanceMap(tuple(edges.tolist()), tuple(values))


@torch.no_grad()
def mean_overlap(draft, seq: torch.Tensor, p: torch.Tensor, temperature: float = 1.0) -> float:
    """Mean sum_x min(p, q) over the sampled positions: seq (B, P + n), p (B, n, V) from `sample_text`."""
    n = p.shape[1]
    P = seq.shape[1] - n
    q = draft.probs(seq, temperature)[:, P - 1:P - 1 + n]                             # (B, n, V)
    return overlap(p, q).mean().item()


@torch.no_grad()
def drawn_chains(target, draft, seq: torch.Tensor, n: int, k: int, temperature: float, seed: int, every: int):
    """Yields (p, q, drafts) per prefix cut from the sampled text seq (B, P + n): every `every`-th
    length P, P + every, ... that leaves room for k drafts in the target's context window. At each
    cut the B prefixes draw one chain each from the draft, and the target scores prefix + chain in
    one full forward: p, q (B, k, V) the target's and the draft's distributions at the drafted
    positions (q the law each draft was drawn from), drafts (B, k) ids."""
    gen = torch.Generator().manual_seed(seed)
    P = seq.shape[1] - n
    cuts = [L for L in range(P, P + n, every) if L + k <= target.cfg.block_size]
    if not cuts:
        raise ValueError(f"no prefix of the sampled text leaves room for {k} drafts in the context window")
    with target.cache_set_aside():
        for L in cuts:
            prefix = seq[:, :L]                                                        # (B, L)
            draft.reset()
            drafts, q = draft.sample_chain(prefix, k, temperature, gen)                # (B, k), (B, k, V)
            logits = target(torch.cat([prefix, drafts], 1))[:, L - 1:L - 1 + k]        # (B, k, V)
            yield probs_from_logits(logits, temperature), q, drafts
    draft.reset()


@torch.no_grad()
def chain_survival(target, draft, seq: torch.Tensor, n: int, k: int, temperature: float, seed: int,
                   every: int = 8) -> torch.Tensor:
    """S_1..S_k (`survival`) over the chains of `drawn_chains`: (k,), the mean over cuts and chains."""
    return torch.stack([survival(p, q, d) for p, q, d in
                        drawn_chains(target, draft, seq, n, k, temperature, seed, every)]).mean(0)


@torch.no_grad()
def chain_acceptance(target, draft, seq: torch.Tensor, n: int, k: int, temperature: float, seed: int,
                     every: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, beta), each (C, k) over the C chains of `drawn_chains` (all cuts, all sequences): r the
    probability each drawn draft is kept once reached (`kept_probs`), beta = sum_x min(p, q) at its
    position, its expectation before the draft is drawn (`overlap`)."""
    rs, betas = [], []
    for p, q, d in drawn_chains(target, draft, seq, n, k, temperature, seed, every):
        rs.append(kept_probs(p, q, d))
        betas.append(overlap(p, q))
    return torch.cat(rs), torch.cat(betas)


def expected_accepted(P: list[list[float]], tree) -> float:
    """Mean number of nodes `tree_accept` accepts on a drawn tree (its uniforms averaged out).

    P: 1+N rows (row i: the target's distribution after node i). At a node with residual r, child
    j (char x, drawn from q_j) is tried only if the earlier siblings were rejected, and accepted
    with probability a_j = min(1, r(x) / q_j(x)); on rejection r <- normalize(max(0, r - q_j)), as
    `tree_accept` does. So
        E(node, r) = sum_j [prod_{i<j} (1 - a_i)] a_j (1 + E(child_j, P[child_j])),
    and a pass emits 1 + E(root, P[0]) chars on average."""
    def visit(node: int, r: list[float]) -> float:
        kids = tree.children[node]
        q, total, reach = tree.rows[node], 0.0, 1.0
        w = list(q) if kids else None                                  # q with the rejected siblings zeroed
        for c in kids:
            x, z = tree.tokens[c], tree.mass[c]
            qj = [a / z for a in w]
            a = min(1.0, r[x] / qj[x])
            total += reach * a * (1.0 + visit(c, P[c]))
            reach *= 1.0 - a
            if reach <= 0.0:
                break
            r = residual_weights(r, qj)
            s = sum(r)
            r = [v / s for v in r]
            w[x] = 0.0
        return total
    return visit(0, P[0])


def tree_chars(target, draft, seq: torch.Tensor, n: int, widths, temperature: float, seed: int,
               every: int = 8) -> tuple[float, float]:
    """(mean chars per pass, mean drafted nodes per pass) of tree verification with `widths`,
    over one tree drawn at each prefix cut from the sampled text seq (B, P + n) as in
    `chain_survival` (each sequence, every `every`-th length with room for the tree's depth): the
    prefix is cached, the tree drawn (`build_tree`), verified in one target pass (`tree_verify`)
    and scored by `expected_accepted`."""
    rows = tree_chars_rows(target, draft, seq, n, widths, temperature, seed, every)
    trees = sum(r[2] for r in rows)
    return sum(r[0] for r in rows) / trees, sum(r[1] for r in rows) / trees


@torch.no_grad()
def tree_chars_rows(target, draft, seq: torch.Tensor, n: int, widths, temperature: float, seed: int,
                    every: int = 8) -> list[tuple[float, int, int]]:
    """`tree_chars` per sequence of seq: (chars summed over its trees, nodes summed, trees)."""
    gen = torch.Generator().manual_seed(seed)
    P, depth = seq.shape[1] - n, len(widths)
    cuts = [L for L in range(P, P + n, every) if L + depth <= target.cfg.block_size]
    if not cuts:
        raise ValueError(f"no prefix of the sampled text leaves room for a depth-{depth} tree")
    masks, rows = TreeMasks(target.causal.device), []
    with target.cache_set_aside():
        for row in seq.tolist():
            chars, nodes = [], []
            for L in cuts:
                prefix = row[:L]
                positions = prefill(target, prefix, extra=max_nodes(widths))
                draft.reset()
                tree = build_tree(draft, prefix, widths, temperature, gen)
                p = tree_verify(target, tree, L, positions, masks, temperature)      # (1+N, V)
                chars.append(1.0 + expected_accepted(p.tolist(), tree))
                nodes.append(tree.n_nodes)
            rows.append((sum(chars), sum(nodes), len(chars)))
    draft.reset()
    return rows


@torch.no_grad()
def loop_survival(target, draft, prompt: list[int], n_chars: int, k: int, temperature: float,
                  seeds) -> tuple[torch.Tensor, int, int]:
    """S_1..S_k at the loop's own pass starts: one speculative generation of n_chars per seed (its
    counters, `track_survival`), each pass adding `survival` of its drawn chain. Returns (S (k,), the
    passes averaged over, the chars they emitted): S is the mean over passes, an unbiased estimate of
    P(drafts 1..i kept) per pass of the loop, with less variance than the count chars / passes."""
    total, passes, chars = torch.zeros(k, dtype=torch.float64), 0, 0
    for seed in seeds:
        g = generate_speculative(target, draft, prompt, n_chars, k, temperature,
                                 torch.Generator().manual_seed(seed), track_overlap=False, track_survival=True)
        total += torch.tensor(g.survival_sum, dtype=torch.float64)
        passes, chars = passes + g.draft_calls, chars + g.chars_emitted
    draft.reset()
    return total / passes, passes, chars
