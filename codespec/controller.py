"""Draft policies and the goodput controller: how many draft tokens each request gets.

Policies (`draft_policy`):
* `chain`: the most frequent continuation of the longest match, k tokens for a k-token
  match, up to `max_draft_tokens`;
* `tree`: a token tree of up to `max_draft_tokens` nodes (best first by count);
* `goodput`: the tree, pruned by the controller below. It may give a request nothing.

The controller maximises goodput, the expected committed tokens per second of the
next verify pass over all R active requests:

    G = (R + sum of P(node accepted) over the chosen nodes) / cost(rows),  rows = R + nodes

Each request commits its bonus token whatever happens (the R); a chosen node adds the
probability that it ends up on the accepted path. That probability is the product
along its path of per-node estimates: the draft's count ratio (how often the source
continued that way) times the request's calibrated acceptance rate (`Acceptance`).
`cost(rows)` is the measured time of a verify pass over that many packed rows
(`CostModel`: measured at start-up, updated after every pass). Since a node's
probability never exceeds its parent's, taking nodes in decreasing probability keeps
every chosen set a tree; the controller takes the prefix of that order with the best G.

Worked example: one request, cost(1) = cost(2) = 50 ms, cost(3) = 80 ms, a chain of two
nodes with P = 0.9 and 0.3: G is 1/0.05 = 20 with no draft, 1.9/0.05 = 38 with one
node, 2.2/0.08 = 27.5 with both. The controller drafts one token.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from codespec.index import Draft

DraftPolicy = Literal["chain", "tree", "goodput"]
POLICIES: tuple[str, ...] = ("chain", "tree", "goodput")
PRIOR_ACCEPTED, PRIOR_TRIALS = 2.0, 3.0  # a new request starts at rate 2/3
DECAY = 0.8  # weight of the past in the acceptance rate: adapts within a few passes
COST_EMA = 0.3  # weight of a new timing in the cost model


@dataclass
class Acceptance:
    """A request's observed acceptance: of the draft nodes it was offered where an
    acceptance could happen next (a node on the accepted path with children), how
    often one was accepted."""

    accepted: float = PRIOR_ACCEPTED
    trials: float = PRIOR_TRIALS

    @property
    def rate(self) -> float:
        return self.accepted / self.trials

    def observe(self, trials: int, accepted: int) -> None:
        self.accepted = DECAY * self.accepted + accepted
        self.trials = DECAY * self.trials + trials


@dataclass
class CostModel:
    """Seconds per verify pass as a function of packed rows; linear between measured
    points (and beyond the last two)."""

    points: dict[int, float] = field(default_factory=dict)  # rows -> seconds

    def observe(self, rows: int, seconds: float) -> None:
        old = self.points.get(rows)
        self.points[rows] = seconds if old is None else (1 - COST_EMA) * old + COST_EMA * seconds

    def cost(self, rows: int) -> float:
        if not self.points:
            return 1.0  # nothing measured: every pass costs the same
        xs = sorted(self.points)
        if rows in self.points:
            return self.points[rows]
        i = bisect.bisect_left(xs, rows)
        if i == 0:
            return self.points[xs[0]]
        lo, hi = (xs[i - 1], xs[i]) if i < len(xs) else (xs[-2], xs[-1]) if len(xs) > 1 else (xs[0], xs[0])
        if lo == hi:
            return self.points[lo]
        slope = (self.points[hi] - self.points[lo]) / (hi - lo)
        return max(self.points[lo] + slope * (rows - lo), 1e-6)

    def measure(self, run_pass: Callable[[int], float], rows: Sequence[int]) -> None:
        """Time `run_pass(n)` once per row count (after one warm-up pass)."""
        run_pass(rows[0])
        for n in rows:
            self.observe(n, run_pass(n))


def node_probabilities(draft: Draft, rate: float) -> list[float]:
    """P(node accepted) for every node of a topologically ordered draft.

    >>> d = Draft((5, 6, 7), (-1, 0, 0), (4, 3, 1), match_len=3, source="index")
    >>> [round(p, 3) for p in node_probabilities(d, rate=0.5)]
    [0.5, 0.188, 0.062]
    """
    sibling_total: dict[int, int] = {}
    for parent, count in zip(draft.parents, draft.counts):
        sibling_total[parent] = sibling_total.get(parent, 0) + max(count, 1)
    probs: list[float] = []
    for parent, count in zip(draft.parents, draft.counts):
        share = max(count, 1) / sibling_total[parent]
        probs.append((probs[parent] if parent >= 0 else 1.0) * rate * share)
    return probs


def prune(draft: Draft, keep: set[int]) -> Draft:
    """The draft restricted to `keep` (a set closed under parents), order preserved."""
    if len(keep) == len(draft):
        return draft
    kept = sorted(keep)
    new_index = {old: new for new, old in enumerate(kept)}
    return Draft(
        tuple(draft.token_ids[i] for i in kept),
        tuple(new_index[draft.parents[i]] if draft.parents[i] >= 0 else -1 for i in kept),
        tuple(draft.counts[i] for i in kept),
        draft.match_len,
        draft.source,
    )


def choose(drafts: Sequence[Draft], rates: Sequence[float], cost: CostModel) -> list[Draft]:
    """Prune each request's draft to the selection with the best expected goodput."""
    candidates = []  # (-probability, depth, request, node): parents sort before children
    for request, (draft, rate) in enumerate(zip(drafts, rates)):
        depth: list[int] = []
        for node, (parent, p) in enumerate(zip(draft.parents, node_probabilities(draft, rate))):
            depth.append(depth[parent] + 1 if parent >= 0 else 1)
            candidates.append((-p, depth[node], request, node))
    candidates.sort()
    requests = len(drafts)
    best_n, best_goodput, expected = 0, requests / cost.cost(requests), float(requests)
    for n, (neg_p, _, _, _) in enumerate(candidates, start=1):
        expected -= neg_p
        goodput = expected / cost.cost(requests + n)
        if goodput > best_goodput:
            best_n, best_goodput = n, goodput
    keep: list[set[int]] = [set() for _ in drafts]
    for _, _, request, node in candidates[:best_n]:
        keep[request].add(node)
    return [prune(draft, chosen) for draft, chosen in zip(drafts, keep)]
