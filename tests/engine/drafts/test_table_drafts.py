"""The table drafts (src/engine/drafts/ngram.py, distilled.py, table.py): the n-gram table against
a plain-Python modified Kneser-Ney, the distilled table against the target itself, the two lookup
paths (batched tensors, memoized Python rows) against each other, and the on-disk cache.

Their sampling exactness is checked with every other draft in tests/engine/decoding/test_exactness.py and
tests/engine/decoding/test_decode.py (both run over every file in conf/draft/)."""
from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path

import pytest
import torch

from src.engine.drafts import DistilledDraft, NgramDraft
from src.engine.drafts.distilled import target_probs, window_starts
from src.engine.drafts.table import MixtureRow
from src.engine.errors import SpecsweepError
from src.engine.sampling import probs_from_logits
from src.trial.load import train_ids_of
from src.trial.spec import trial_spec
from tests.chisquare import varying_multinomial_test
from tests.conftest import compose_cfg
from tests.conftest import draft_for
from tests.conftest import draft_options


@pytest.fixture(scope="module")
def train_ids(tiny):
    cfg, corpus, target = tiny
    return train_ids_of(trial_spec(cfg).target, target, corpus)


def reference_kn(ids: list[int], order: int, V: int, continuation: bool = True):
    """Interpolated modified Kneser-Ney written out plainly: P(w | h) for a context tuple h.
    continuation=False (a NEGATIVE CONTROL) uses raw counts at every level."""
    grams = {m: Counter(tuple(ids[i:i + m]) for i in range(len(ids) - m + 1)) for m in range(1, order + 2)}
    levels = {}
    for j in range(order + 1):                     # context length j
        if j == order or not continuation:
            levels[j] = grams[j + 1]
        else:
            levels[j] = Counter(g[1:] for g in grams[j + 2])
    disc = {}
    for j, c in levels.items():
        n = [sum(1 for v in c.values() if v == r) for r in (1, 2, 3, 4)]
        y = n[0] / (n[0] + 2 * n[1]) if n[0] + n[1] else 0.5     # undefined estimates: the fallbacks of ngram.py
        raw = (1 - 2 * y * n[1] / n[0] if n[0] else 0.5, 2 - 3 * y * n[2] / n[1] if n[1] else 1.0,
               3 - 4 * y * n[3] / n[2] if n[2] else 1.5)
        disc[j] = [min(max(d, 0.05), r) for r, d in zip((1, 2, 3), raw)]
    by_context = {j: {} for j in levels}
    for j, c in levels.items():
        for g, v in c.items():
            by_context[j].setdefault(g[:-1], {})[g[-1]] = v

    def D(j, v):
        return disc[j][min(v, 3) - 1]

    @functools.lru_cache(maxsize=None)   # a context's sums, once (a row of 50,257 entries asks each of them)
    def sums(h: tuple) -> tuple[int, float]:
        seen = by_context[len(h)][h]
        return sum(seen.values()), sum(D(len(h), v) for v in seen.values())

    def prob(h: tuple, w: int) -> float:
        if h is None:
            return 1.0 / V
        lower = h[1:] if h else None
        seen = by_context[len(h)].get(h)
        if not seen:
            return prob(lower, w)
        total, gamma = sums(h)
        v = seen.get(w, 0)
        own = max(v - D(len(h), v), 0) / total if v else 0.0
        return own + gamma / total * prob(lower, w)
    return prob


# ---- n-gram -----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [1, 3])
def test_ngram_rows_are_modified_kneser_ney(tiny, train_ids, order):
    """Every row (seen contexts, unseen ones, the sequence start) equals the plain formula; the
    negative control (raw counts at the lower levels) is told apart by the same comparison."""
    _, _, target = tiny
    V = target.tokenizer.vocab_size
    text_ids = train_ids[:3000]
    draft = NgramDraft(target.model, text_ids, **draft_options("ngram", order=order))
    gen = torch.Generator().manual_seed(0)
    idx = torch.cat([text_ids[:40].view(2, 20), torch.randint(0, V, (2, 20), generator=gen)])  # (4, 20)
    q = draft.probs(idx, 1.0)                                                   # (4, 20, V)
    ids = text_ids.tolist()
    for continuation, should_match in ((True, True), (False, False)):
        prob = reference_kn(ids, order, V, continuation)
        expected = torch.tensor([[[prob(tuple(row[max(0, t + 1 - order):t + 1]), w) for w in range(V)]
                                  for t in range(idx.shape[1])] for row in idx.tolist()])
        gap = (expected - q.double()).abs().max().item()
        assert (gap < 1e-6) == should_match, (continuation, gap)


@pytest.mark.slow
def test_ngram_over_a_subword_vocabulary_is_kneser_ney_without_a_row_per_context():
    """At GPT-2's 50,257 tokens: ids drawn from 400 tokens spread over the whole vocabulary (half
    of them above 32,767, where int16 ids would wrap) give rows equal to the plain formula at a
    seen context, its one-token suffix and an unseen one (every one of the V entries); the table holds the entries met,
    not a row per context, and the memos of dense rows stay within dense_memo_limit while
    `next_probs` and `propose` walk 300 contexts."""
    from src.engine.drafts.table import dense_memo_limit
    V = 50257
    gen = torch.Generator().manual_seed(0)
    tokens = torch.cat([torch.randint(0, 32768, (200,), generator=gen), torch.randint(32768, V, (200,), generator=gen)])
    ids = tokens[torch.multinomial(1.0 / torch.arange(1, 401).double(), 6000, replacement=True, generator=gen)]
    shape = type("M", (), {"cfg": type("C", (), {"vocab_size": V, "block_size": 1024})})()
    draft = NgramDraft(shape, ids, order=2)
    assert draft.describe()["table_bytes"] < 2 ** 20                    # not V floats per context (2 GB here)
    prob = reference_kn(ids.tolist(), 2, V)
    seen = ids[100:102].tolist()
    for context in (seen, seen[1:], [int(tokens[0]), V - 1]):
        q = torch.tensor(draft.next_probs(context, 1.0), dtype=torch.float64)
        want = torch.tensor([prob(tuple(context[-2:]), w) for w in range(V)], dtype=torch.float64)
        assert (q - want).abs().max().item() < 1e-7, context
    for i in range(300):
        context = ids[i:i + 3].tolist()
        draft.next_probs(context, 0.7)
        draft.propose(context, 4, 1.0, torch.Generator().manual_seed(i))
    assert 0 < draft.memo_size(0.7) <= dense_memo_limit(V) == 20 and len(draft._base_rows) <= 20
    ctx = ids[:40].tolist()
    drafts, q = draft.propose(ctx, 4, 1.0, torch.Generator().manual_seed(1))
    assert all(0 <= d < V for d in drafts) and all(len(row) == V for row in q)


def test_ngram_rows_are_distributions_with_mass_everywhere(tiny, drafts, gen):
    _, _, target = tiny
    V = target.tokenizer.vocab_size
    idx = torch.randint(0, V, (16, 24), generator=gen)   # mostly unseen contexts: back off to shorter ones
    for T in (1.0, 0.7):
        q = drafts["ngram"].probs(idx, T)
        torch.testing.assert_close(q.sum(-1), torch.ones(16, 24), atol=1e-6, rtol=0)
        assert (q > 0).all()


def test_ngram_frequent_context_reproduces_its_counts_and_unseen_backs_off(tiny, train_ids):
    _, _, target = tiny
    V = target.tokenizer.vocab_size
    draft = NgramDraft(target.model, train_ids, **draft_options("ngram", order=2))
    ids = train_ids.tolist()
    follows = Counter((ids[i], ids[i + 1], ids[i + 2]) for i in range(len(ids) - 2))
    contexts = Counter((a, b) for a, b, _ in follows.elements())
    (a, b), n = contexts.most_common(1)[0]
    assert n > 1000
    empirical = torch.tensor([follows[(a, b, w)] / n for w in range(V)])
    q = torch.tensor(draft.next_probs([a, b], 1.0))
    assert 0.5 * (q - empirical).abs().sum() < 0.01                # discounts take < 1% of a frequent context
    # a context never seen backs off to its longest seen suffix, exactly
    unseen = next((x, b) for x in range(V) if contexts[(x, b)] == 0)
    assert draft.next_probs(list(unseen), 1.0) == draft.next_probs([b], 1.0)
    assert draft.next_probs([a, b], 1.0) != draft.next_probs([b], 1.0)


# ---- distilled --------------------------------------------------------------------------------

def causal_probs(model, ids: list[int]) -> torch.Tensor:
    """The target's T=1 distribution after the last of `ids`, from one plain forward."""
    with torch.no_grad(), model.cache_set_aside():
        return probs_from_logits(model(torch.tensor([ids]))[0, -1], 1.0)


def test_windows_cover_every_position_once_with_left_context():
    for n, length in ((128, 128), (1000, 128), (1001, 128), (300, 256)):
        left = length // 8
        starts = window_starts(n, length, left)
        covered, done = [], 0
        for s in starts:
            assert s == 0 or done >= s + left                   # every contributed position has `left` before it
            covered += list(range(done, s + length))
            done = s + length
        assert covered == list(range(n))


def test_distilled_probs_are_the_targets_in_every_window(tiny, train_ids):
    _, _, target = tiny
    ids = train_ids[:700]
    p = target_probs(target.model, ids, batch=3)
    L = target.model.cfg.block_size
    starts = window_starts(len(ids), L, L // 8)
    for t in (0, 5, L - 1, L, 300, 699):
        s = max(x for x in starts if x <= max(0, t - L // 8)) if t >= L else 0
        torch.testing.assert_close(p[t], causal_probs(target.model, ids[s:t + 1].tolist()), atol=1e-6, rtol=1e-5)


def singleton_position(ids: list[int], order: int, below: int) -> int:
    """A position t < below whose last `order` chars occur exactly once in ids (as a context)."""
    counts = Counter(tuple(ids[t - order + 1:t + 1]) for t in range(order - 1, len(ids)))
    return next(t for t in range(order - 1, below) if counts[tuple(ids[t - order + 1:t + 1])] == 1)


def test_distilled_context_seen_once_is_the_targets_distribution(tiny, train_ids):
    _, _, target = tiny
    V, order, eps = target.tokenizer.vocab_size, 6, 1e-4
    ids = train_ids[:4000]
    t = singleton_position(ids.tolist(), order, target.model.cfg.block_size)   # in the first window
    p = causal_probs(target.model, ids[:t + 1].tolist()).double()
    longest = DistilledDraft(target.model, ids, **draft_options("distilled", order=order, distill_chars=4000,
                             backoff="longest", min_count=1, prune=0.0, floor=eps))
    q = torch.tensor(longest.next_probs(ids[:t + 1].tolist(), 1.0), dtype=torch.float64)
    torch.testing.assert_close(q, (1 - eps) * p + eps / V, atol=1e-6, rtol=1e-5)
    # interpolate: (p + beta * the suffix's row) / (1 + beta), before the floor
    beta = 2.0
    interp = DistilledDraft(target.model, ids, **draft_options("distilled", order=order, distill_chars=4000,
                            backoff="interpolate", beta=beta, prune=0.0, floor=eps))
    ctx = ids[t - order + 1:t + 1].tolist()
    code, n = interp._code(ctx)
    suffix = torch.tensor(interp._base_row(*interp._code(ctx[1:])), dtype=torch.float64)
    row = torch.tensor(interp._base_row(code, n), dtype=torch.float64)
    torch.testing.assert_close(row, (p + beta * suffix) / (1 + beta), atol=1e-6, rtol=1e-5)


# ---- both: lookup paths, hot loop, cache, bad input -------------------------------------------

@pytest.mark.parametrize("name", ["ngram", "distilled"])
def test_python_rows_are_the_batched_rows(tiny, drafts, train_ids, name):
    """`propose`/`next_probs` (memoized Python rows) and `probs`/`sample_chain` (batched tensors)
    compute the same rows: bit for bit at T = 1 and 0, to the last bit at T = 0.7."""
    draft = drafts[name]
    idx = train_ids[2000:2240].view(4, 60)
    ctx = draft._contexts(idx).reshape(-1, draft.order)
    for T, tol in ((1.0, 0.0), (0.0, 0.0), (0.7, 1e-15)):
        batched = draft._finish(draft._rows64(ctx), T).view(4, 60, -1)
        python = torch.tensor([[draft.next_probs(row[:t + 1], T) for t in range(60)] for row in idx.tolist()],
                              dtype=torch.float64)
        assert (python - batched).abs().max().item() <= tol, T
        torch.testing.assert_close(draft.probs(idx, T), batched.float(), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["ngram", "distilled"])
def test_hot_loop_builds_each_row_once(tiny, drafts, name):
    """A second identical proposal is lookups only: no row is built again."""
    cfg, _, target = tiny
    draft = drafts[name]
    seq = target.tokenizer.encode(cfg.prompt).tolist()
    for T in (1.0, 0.7):                       # the mixture path (T = 1) and the dense rows
        draft.clear_memos()
        first = draft.propose(seq, 8, T, torch.Generator().manual_seed(3))
        built = draft.memo_size(T)
        assert 1 <= built <= 8
        again = draft.propose(seq, 8, T, torch.Generator().manual_seed(3))
        assert again == first and draft.memo_size(T) == built
        assert all(len(row) == target.tokenizer.vocab_size for row in first[1])


def context_lists(train_ids, n: int, length: int) -> list[list[int]]:
    """n contexts of `length` chars from the training split, spread over it, plus its shorter
    prefixes' worth of starts (a context shorter than the order backs off from the start)."""
    step = (len(train_ids) - length) // n
    ids = train_ids.tolist()
    return [ids[i * step:i * step + length] for i in range(n)] + [ids[:m] for m in range(1, 4)]


@pytest.mark.parametrize("name", ["ngram", "distilled"])
def test_mixture_rows_are_the_dense_rows(tiny, drafts, train_ids, name):
    """At T = 1 `propose` hands over MixtureRows: per char and as a whole they are the dense rows
    of `next_probs` up to float rounding (the normalizer is summed in another order); they sum to 1."""
    draft = drafts[name]
    draft.clear_memos()
    chars, ptr = draft.chars.long(), draft.ptr
    first_of_context = torch.zeros(len(chars), dtype=torch.bool)
    first_of_context[ptr[:-1][ptr[:-1] < len(chars)]] = True
    assert ((chars[1:] > chars[:-1]) | first_of_context[1:]).all()   # ascending within a context (bisected)
    for ctx in context_lists(train_ids, 40, draft.order + 2):
        code, n = draft._code(ctx)
        mix = draft._mixture(code, n)
        dense = torch.tensor(draft.next_probs(ctx, 1.0), dtype=torch.float64)
        per_char = torch.tensor([mix[x] for x in range(len(mix))], dtype=torch.float64)
        whole = torch.tensor(list(mix), dtype=torch.float64)
        assert (per_char - dense).abs().max().item() < 1e-14
        assert (whole - per_char).abs().max().item() == 0           # the same sums in the same order
        assert abs(whole.sum().item() - 1) < 1e-12 and mix[-1] == mix[len(mix) - 1]


class OnlyTheLongestPart(MixtureRow):
    """NEGATIVE CONTROL: a row that draws from the longest suffix's entries alone, as if the
    backoff parts and the uniform part had no mass (the q it reports is still the full mixture)."""
    def sample(self, u: float) -> int:
        return self.parts[0][1].draw(u * self.parts[0][1].mass)


def draws_p_value(draft, ctx: list[int], n: int, seed: int, sampler=None) -> float:
    """Draw n first chars through `propose` (k = 1, T = 1) after `ctx`; the p-value of a chi-square
    test of their counts against the q that propose reports (tests/chisquare.py)."""
    gen = torch.Generator().manual_seed(seed)
    draft.clear_memos()
    code, length = draft._code(ctx)
    if sampler is not None:                   # the control's row in place of the memoized one
        mix = draft._mixture(code, length)
        draft._mixtures[code] = sampler(mix.parts, mix.uniform, mix.size)
    chars, q = [], None
    for _ in range(n):
        d, rows = draft.propose(ctx, 1, 1.0, gen)
        chars.append(d[0])
        q = rows[0]
    probs = torch.tensor(list(q), dtype=torch.float64).expand(n, -1)
    return varying_multinomial_test(torch.tensor(chars), probs)[2]


@pytest.mark.parametrize("name", ["ngram", "distilled"])
def test_propose_draws_follow_the_mixture_q(tiny, drafts, train_ids, name):
    """The chars `propose` draws at T = 1 follow the q it hands the verifier: a chi-square test per
    context (4 contexts per draft, each rejecting a correct sampler with probability 1e-4: a false
    failure rate under 1e-3 for this test). For the n-gram draft, whose contexts back off with real
    mass, the negative control (draws from the longest suffix only) must be caught at p < 1e-6."""
    draft = drafts[name]
    contexts = context_lists(train_ids, 4, draft.order)[:4]
    for i, ctx in enumerate(contexts):
        assert draws_p_value(draft, ctx, 20000, seed=i) > 1e-4, ctx
    if name == "ngram":
        backoff_mass = [1 - draft._mixture(*draft._code(ctx)).parts[0][0] * draft._mixture(
            *draft._code(ctx)).parts[0][1].mass / draft._mixture(*draft._code(ctx)).total for ctx in contexts]
        ctx = contexts[max(range(len(contexts)), key=backoff_mass.__getitem__)]
        assert max(backoff_mass) > 0.05     # the control has something to miss
        assert draws_p_value(draft, ctx, 20000, seed=9, sampler=OnlyTheLongestPart) < 1e-6


def test_table_cache_round_trip(tiny, train_ids, tmp_path):
    _, _, target = tiny
    kw = dict(draft_options("distilled", distill_chars=3000), cache_dir=tmp_path)
    kw.pop("order")
    threads = torch.get_num_threads()
    first = DistilledDraft(target.model, train_ids, order=3, target_key="aaaa", **kw)
    assert torch.get_num_threads() == threads                     # the build's all-cores setting is undone
    assert not first.cached and first.cache_file.is_file() and "aaaa" in first.cache_file.name
    again = DistilledDraft(target.model, train_ids, order=3, target_key="aaaa", **kw)
    assert again.cached and again.cache_file == first.cache_file
    for key, t in first.table.items():
        assert torch.equal(t, again.table[key]), key
    idx = train_ids[:64].view(2, 32)
    assert torch.equal(first.probs(idx, 1.0), again.probs(idx, 1.0))
    other_target = DistilledDraft(target.model, train_ids, order=3, target_key="bbbb", **kw)
    other_order = DistilledDraft(target.model, train_ids, order=4, target_key="aaaa", **kw)
    other_data = DistilledDraft(target.model, train_ids[1:], order=3, target_key="aaaa", **kw)
    files = {d.cache_file for d in (first, other_target, other_order, other_data)}
    assert len(files) == 4 and not any(d.cached for d in (other_target, other_order, other_data))
    first.cache_file.write_bytes(b"not a table")                  # a damaged file is built again
    rebuilt = DistilledDraft(target.model, train_ids, order=3, target_key="aaaa", **kw)
    assert not rebuilt.cached and torch.equal(rebuilt.table["vals"], first.table["vals"])
    assert DistilledDraft(target.model, train_ids, order=3, target_key="aaaa", **kw).cached


def test_distilled_over_the_whole_split_is_every_training_char(tiny, train_ids):
    """distill_chars=null distils the whole split it is given: the table of distill_chars=len(ids),
    and not that of one char fewer."""
    _, _, target = tiny
    ids = train_ids[:3000]
    kw = draft_options("distilled", order=3)
    whole = DistilledDraft(target.model, ids, **{**kw, "distill_chars": None})
    counted = DistilledDraft(target.model, ids, **{**kw, "distill_chars": len(ids)})
    shorter = DistilledDraft(target.model, ids, **{**kw, "distill_chars": len(ids) - 1})
    assert whole.table.keys() == counted.table.keys()
    for key, t in whole.table.items():
        assert torch.equal(t, counted.table[key]), key
    assert any(t.shape != shorter.table[key].shape or not torch.equal(t, shorter.table[key])
               for key, t in whole.table.items())
    assert whole.describe()["distill_chars"] == "all"


def test_build_draft_gives_table_drafts_the_cache(tiny, drafts):
    cfg, corpus, target = tiny
    for name in ("ngram", "distilled"):
        d = drafts[name]
        assert d.cache_file.parent == Path(cfg.data.cache_dir) / "drafts" and target.key in d.cache_file.name
        again = draft_for(compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}"), target, corpus)
        assert again.cached and again.describe()["table_bytes"] == d.describe()["table_bytes"]
        facts = again.describe()
        assert facts["contexts"] == sum(map(int, facts["contexts_by_length"].split("/")))
    assert not hasattr(drafts["bigram"], "cache_file")             # drafts without the arguments get none


@pytest.mark.parametrize("override,message", [
    ("draft.order=0", "order must be an integer >= 1"),
    ("draft.order=40", "too long for a vocabulary"),
    ("draft.backoff=nearest", "backoff must be one of"),
    ("draft.floor=0", "floor must be in (0, 1)"),
    ("draft.distill_chars=1", "distill_chars must be an integer >= 2 or null"),
])
def test_bad_table_settings_are_one_line_errors(tiny, override, message):
    cfg, corpus, target = tiny
    name = "ngram" if override.startswith("draft.order") else "distilled"
    bad = compose_cfg(cfg.data.path, cfg.data.cache_dir, f"draft={name}", override)
    with pytest.raises(SpecsweepError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        draft_for(bad, target, corpus)
    assert "\n" not in str(e.value)
