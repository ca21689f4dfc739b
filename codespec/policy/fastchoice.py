"""The goodput controller's per-pass choice for a whole batch in one numba call.

`controller.pick_priced` (each request's best source, pruned) then `choose_priced` (the
batch's nodes by probability) is the reference: readable, and ~40 us a request in Python,
which on a GPU is a third of the host's part of a batch-8 pass (docs/decisions.md). `choose_all` computes the same choice, float for float: every
node's probability with the same operations in the same order, the same sort keys, the
same prefix scans; a test holds it equal to the reference on random batches. Only for a
cost model whose rows read their own keys (`CostModel.padded` False: the cuda backend,
the row decoder); `choose_all` returns None otherwise and the caller uses the reference.

    drafts = choose_all([run_a_candidates, run_b_candidates], [acceptance_a, acceptance_b], cost, contexts)
"""

from __future__ import annotations

from itertools import chain
from typing import Sequence

import numpy as np
from numba import njit

from codespec.index import Draft
from codespec.policy import controller

_BUCKET_OF = np.array(controller._BUCKET_OF, dtype=np.int64)
_LAST_BUCKET = len(controller.MATCH_BUCKETS)


def choose_all(candidates: Sequence[Sequence[Draft]], acceptances: Sequence[controller.Acceptance],
               cost: controller.CostModel, contexts: Sequence[int]) -> list[Draft] | None:
    """Each request's draft for the pass: `pick` among its candidates, then `choose`
    over the batch (module docstring); None where the reference must decide (padded)."""
    if cost.padded:
        return None
    flat = [draft for drafts in candidates for draft in drafts]
    requests = len(candidates)
    if not flat:
        return [Draft.empty("none") for _ in range(requests)]
    sizes = [len(draft) for draft in flat]
    offsets = np.zeros(len(flat) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    parents = np.fromiter(chain.from_iterable(d.parents for d in flat), dtype=np.int64, count=total)
    counts = np.fromiter(chain.from_iterable(d.counts for d in flat), dtype=np.int64, count=total)
    owner = np.array([r for r, drafts in enumerate(candidates) for _ in drafts], dtype=np.int64)
    match = np.array([d.match_len for d in flat], dtype=np.int64)
    kinds = np.array([controller.family_of(d.source) for d in flat], dtype=np.int64)
    own_accepted = np.array([a.own.accepted for a in acceptances], dtype=np.float64)
    own_trials = np.array([a.own.trials for a in acceptances], dtype=np.float64)
    shared = acceptances[0].engine  # every request's prior: the engine's one table
    assert all(a.engine is shared for a in acceptances), "requests of one engine share its table"
    a, b, c, d = cost.coefficients()
    winner = np.full(requests, -1, dtype=np.int64)
    keep = np.zeros(total, dtype=np.bool_)
    _choose_all(parents, counts, offsets, owner, match, kinds, own_accepted, own_trials,
                np.array(shared.accepted, dtype=np.float64), np.array(shared.trials, dtype=np.float64),
                _BUCKET_OF, _LAST_BUCKET, controller.FAMILY, controller.REQUEST_PRIOR_WEIGHT,
                np.array(contexts, dtype=np.int64), a, b, c, d, cost.min_rows, cost.block, winner, keep)
    out = []
    for w in winner.tolist():
        if w < 0:
            out.append(Draft.empty("none"))
        else:
            lo = int(offsets[w])
            out.append(flat[w].restricted(set(np.flatnonzero(keep[lo:lo + sizes[w]]).tolist())))
    return out


def warm_up() -> None:
    """Compile the batch choice (or load it from numba's cache) now, at start-up: on the
    2-core VM it took 4.4 s with a cold cache, 0.26 s from the cache, inside whichever
    request was the first the goodput controller priced (policy/warm.py; it types every
    argument choose_all passes)."""
    shared = controller.AcceptanceTable()
    cost = controller.CostModel.of({2: 0.02, 8: 0.03})
    drafts = [Draft.chain([1, 2], [1, 1], match_len=2, source="context"),
              Draft((3, 4, 5), (-1, -1, 0), (2, 1, 1), match_len=1, source="anchor-guess")]
    choose_all([drafts, []], [controller.Acceptance(shared), controller.Acceptance(shared)], cost, [10, 20])


@njit(cache=True, nogil=True)
def _rate(r, m, kind, own_accepted, own_trials, eng_accepted, eng_trials, bucket_of, last, family, weight):
    bucket = bucket_of[m] if 0 <= m < bucket_of.size else (last if m > 0 else 0)
    bucket += kind * family  # controller.family_of: matches, guesses, a draft model's
    prior = eng_accepted[bucket] / eng_trials[bucket] if eng_trials[bucket] else 0.0
    return (own_accepted[r, bucket] + weight * prior) / (own_trials[r, bucket] + weight)


@njit(cache=True, nogil=True)
def _goodput(rows, keys, expected, a, b, c, d, least, block):
    n = rows if rows > least else least
    seconds = a + b * n + c * keys + (d * (-(-n // block) - 1) if block else 0.0)
    return expected / (seconds if seconds > 1e-6 else 1e-6)


@njit(cache=True, nogil=True)
def _before(p1, d1, r1, i1, p2, d2, r2, i2):
    """(-p, depth, request, node) order: the reference's sort keys."""
    if p1 != p2:
        return p1 > p2
    if d1 != d2:
        return d1 < d2
    if r1 != r2:
        return r1 < r2
    return i1 < i2


@njit(cache=True, nogil=True)
def _sorted(probs, depths, owners, nodes):
    """Indices 0..n-1 ordered by (-probs, depths, owners, nodes): insertion sort (a pass
    holds tens of nodes, a request's candidates fewer)."""
    n = probs.size
    order = np.arange(n)
    for i in range(1, n):
        j = i
        while j > 0:
            x, y = order[j], order[j - 1]
            if not _before(probs[x], depths[x], owners[x], nodes[x], probs[y], depths[y], owners[y], nodes[y]):
                break
            order[j], order[j - 1] = y, x
            j -= 1
    return order


@njit(cache=True, nogil=True)
def _choose_all(parents, counts, offsets, owner, match, kind, own_accepted, own_trials, eng_accepted, eng_trials,
                bucket_of, last, family, weight, contexts, a, b, c, d, least, block, winner, keep):  # pragma: no cover
    total = parents.size
    probs = np.empty(total, dtype=np.float64)
    depths = np.empty(total, dtype=np.int64)
    for k in range(offsets.size - 1):  # every node's P(accepted): controller.node_probabilities
        lo, hi = offsets[k], offsets[k + 1]
        r, m, g = owner[k], match[k], kind[k]
        is_chain = True
        for i in range(hi - lo):
            p = parents[lo + i]
            depths[lo + i] = depths[lo + p] + 1 if p >= 0 else 1
            if p != i - 1:
                is_chain = False
        if is_chain:
            pr = 1.0
            for i in range(hi - lo):
                pr = pr * _rate(r, m + depths[lo + i] - 1, g, own_accepted, own_trials, eng_accepted, eng_trials,
                                bucket_of, last, family, weight) * 1.0
                probs[lo + i] = pr
            continue
        siblings = np.zeros(hi - lo + 1, dtype=np.int64)  # by parent + 1
        for i in range(hi - lo):
            siblings[parents[lo + i] + 1] += counts[lo + i] if counts[lo + i] > 1 else 1
        for i in range(hi - lo):
            p = parents[lo + i]
            step = _rate(r, m + depths[lo + i] - 1, g, own_accepted, own_trials, eng_accepted, eng_trials,
                         bucket_of, last, family, weight)
            share = (counts[lo + i] if counts[lo + i] > 1 else 1) / siblings[p + 1]
            probs[lo + i] = (probs[lo + p] if p >= 0 else 1.0) * step * share
    picked = np.zeros(total, dtype=np.bool_)
    requests = winner.size
    best_goodput = np.empty(requests, dtype=np.float64)
    for r in range(requests):  # controller.pick_priced: the pending token alone to start
        best_goodput[r] = _goodput(1, contexts[r] + 1, 1.0, a, b, c, d, least, block)
    best_n = np.zeros(requests, dtype=np.int64)
    orders = np.empty(total, dtype=np.int64)
    for k in range(offsets.size - 1):
        lo, hi = offsets[k], offsets[k + 1]
        r = owner[k]
        n = hi - lo
        order = _sorted(probs[lo:hi], depths[lo:hi], np.zeros(n, dtype=np.int64), np.arange(n))
        rows, keys, expected = 1, contexts[r] + 1, 1.0
        taken, best = 0, _goodput(rows, keys, expected, a, b, c, d, least, block)
        for t in range(n):
            i = lo + order[t]
            rows, keys, expected = rows + 1, keys + contexts[r] + depths[i] + 1, expected + probs[i]
            value = _goodput(rows, keys, expected, a, b, c, d, least, block)
            if value > best:
                taken, best = t + 1, value
        if taken and best > best_goodput[r]:
            best_goodput[r], winner[r], best_n[r] = best, k, taken
            orders[lo:hi] = order
    for r in range(requests):
        k = winner[r]
        if k >= 0:
            for t in range(best_n[r]):
                picked[offsets[k] + orders[offsets[k] + t]] = True
    chosen = np.nonzero(picked)[0]  # controller.choose_priced over the picked nodes
    node_of = np.empty(chosen.size, dtype=np.int64)
    owners = np.empty(chosen.size, dtype=np.int64)
    for j in range(chosen.size):
        i = chosen[j]
        k = np.searchsorted(offsets, i, side="right") - 1
        owners[j], node_of[j] = owner[k], i - offsets[k]
    order = _sorted(probs[chosen], depths[chosen], owners, node_of)
    rows, keys, expected = requests, 0, float(requests)
    for r in range(requests):
        keys += contexts[r] + 1
    taken, best = 0, _goodput(rows, keys, expected, a, b, c, d, least, block)
    for t in range(chosen.size):
        i = chosen[order[t]]
        rows, keys = rows + 1, keys + contexts[owners[order[t]]] + depths[i] + 1
        expected = expected + probs[i]
        value = _goodput(rows, keys, expected, a, b, c, d, least, block)
        if value > best:
            taken, best = t + 1, value
    for t in range(taken):
        keep[chosen[order[t]]] = True
