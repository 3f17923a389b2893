"""Draft-length policies: how many chars each pass drafts (`policy=`; k is the cap of the adaptive ones).

Why a policy keeps the output law: it reads only the draft's own information (its probability
q(d) of each char it drew) and the committed history (how many drafts earlier passes kept),
never the target's verdict on the pass being drafted. The pass's length is then fixed before the
target scores it, and the acceptance rule verifies any number of drafts exactly: given the
drafted chars, each is kept with probability min(1, p/q) and the first rejection draws from the
residual, so every emitted char has the target's law whatever the length
(tests/engine/decoding/test_policies.py checks it per position for every policy and draft; a policy that
peeks at the target's verdict is the negative control it must catch).

- `fixed`: k chars every pass (the default; the loop's counters as before policies existed).
- `heuristic`: Hugging Face assisted generation's schedule: start at `start` chars, +2 after a
  pass whose drafts were all kept, -1 otherwise, within [1, k].
- `confidence`: draft up to k chars; stop after a char whose draft probability q(d) is below
  `threshold` (that char is verified too).
- `cost`: draft up to k chars; stop when one more char no longer pays by the cost model. In units
  of a one-char target pass, a pass that drafts i chars costs T(i) = 1 + o + (b + c) i (its verify
  pass 1 + b i, b the verify pass's marginal cost per char; the loop's own work o; its drafting
  c i) and emits
  E(i) = 1 + S_1 + ... + S_i chars in expectation, S_j = P(drafts 1..j all kept). One more char
  adds S_{i+1} = S_i a chars, a its acceptance, at a price of b + c, and raises the pass's rate
  E / T iff (E + S_i a) / (T + b + c) > E / T, that is iff S_i a T(i) > (b + c) E(i). The draft's
  own estimate of each char's acceptance is a calibrated map of its q(d) (`AcceptanceMap`: the
  mean of min(1, p(d) / q(d)) over draws whose q(d) fell in the same bin, on text sampled from
  the target); S_i multiplies the estimates of the chars drafted so far and a, the next char's,
  is taken as the last drafted char's (its q is known only once it is drawn). A greedy rule: it
  stops at the first char that lowers the rate, which for estimates falling along the chain is
  the best length.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

POLICIES = ("fixed", "heuristic", "confidence", "cost")


@dataclass(frozen=True)
class AcceptanceMap:
    """a(q): the mean acceptance min(1, p(d) / q(d)) of drafted chars whose draft probability q(d)
    fell in bin [edges[i-1], edges[i]) (values[i]; bin 0 below edges[0], the last at or above edges[-1])."""
    edges: tuple[float, ...]
    values: tuple[float, ...]

    def __call__(self, qd: float) -> float:
        return self.values[bisect.bisect_right(self.edges, qd)]


class Policy:
    """`fixed`: k chars every pass. Subclasses override what they change. Per sequence: `reset(k)`;
    per pass: `length()` chars at most, `stopper()` (None, or a callable of each drawn char's
    q(d) that returns True to stop after it), then `update(drafted, kept)` with the verdict."""
    name = "fixed"

    def reset(self, k: int) -> None:
        self.k = k

    def length(self) -> int:
        return self.k

    def stopper(self):
        return None

    def update(self, drafted: int, kept: int) -> None:
        pass

    def describe(self) -> dict:
        return {}


class HeuristicPolicy(Policy):
    name = "heuristic"

    def __init__(self, start: int):
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"policy.start must be an integer >= 1, got {start!r}")
        self.start = start

    def reset(self, k: int) -> None:
        self.k, self.now = k, min(self.start, k)

    def length(self) -> int:
        return self.now

    def update(self, drafted: int, kept: int) -> None:
        self.now = min(self.k, self.now + 2) if kept == drafted else max(1, self.now - 1)


class ConfidencePolicy(Policy):
    name = "confidence"

    def __init__(self, threshold: float):
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"policy.threshold must be a number in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def stopper(self):
        t = self.threshold
        return lambda qd: qd < t


class CostPolicy(Policy):
    name = "cost"

    def __init__(self, accept: AcceptanceMap, c: float, b: float, o: float = 0.0):
        if not (c >= 0 and b >= 0 and o >= 0):
            raise ValueError(f"the cost policy needs c, b, o >= 0, got c={c!r}, b={b!r}, o={o!r}")
        self.accept, self.c, self.b, self.o = accept, float(c), float(b), float(o)

    def stopper(self):
        state = {"S": 1.0, "E": 1.0, "i": 0}
        price, base, accept = self.b + self.c, 1.0 + self.o, self.accept

        def stop(qd: float) -> bool:
            a = accept(qd)
            state["S"] *= a                    # S_i: drafts 1..i all kept
            state["E"] += state["S"]           # E(i) = 1 + S_1 + ... + S_i
            state["i"] += 1
            T = base + price * state["i"]      # T(i), in one-char passes
            return state["S"] * a * T <= price * state["E"]   # the next char (acceptance ~ a) would lower E / T
        return stop

    def describe(self) -> dict:
        return {"c": self.c, "b": self.b, "o": self.o}


def make_policy(name: str, options: dict, k: int, accept: AcceptanceMap | None = None,
                costs: dict | None = None) -> Policy:
    """The policy `name` with its conf/policy options, for cap k; the cost policy also takes its
    acceptance map and costs {c, b, o} (src/trial/policies.py measures them)."""
    if name == "fixed":
        return Policy()
    if name == "heuristic":
        return HeuristicPolicy(options["start"] if options.get("start") is not None else k)
    if name == "confidence":
        return ConfidencePolicy(options["threshold"])
    if name == "cost":
        if accept is None or costs is None:
            raise ValueError("the cost policy needs its acceptance map and its costs c, b and o")
        return CostPolicy(accept, costs["c"], costs["b"], costs["o"])
    raise ValueError(f"unknown policy {name!r} ({', '.join(POLICIES)})")
