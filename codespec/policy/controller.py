"""Draft policies and the goodput controller: how many draft tokens each request gets.

Policies (`draft_policy`):
* `chain`: the most frequent continuation of the longest match, k tokens for a k-token
  match, up to `max_draft_tokens`;
* `tree`: a token tree of up to `max_draft_tokens` nodes (best first by count);
* `goodput`: for each request, the best of its sources' trees (`pick`: own context,
  index, copy anchor, each priced by its calibrated acceptance), pruned by the
  controller below. It may give a request nothing.

The controller maximises goodput, the expected committed tokens per second of the
next verify pass over all R active requests:

    G = (R + sum of P(node accepted) over the chosen nodes) / cost(rows),  rows = R + nodes

Each request commits its bonus token whatever happens (the R); a chosen node adds the
probability that it ends up on the accepted path. That probability is the product
along its path of per-node estimates: the draft's count ratio (how often the source
continued that way) times the request's calibrated acceptance rate at that node's
match length (`Acceptance`: the request's own record, with every request's as prior).
`cost(rows)` is the measured time of a verify pass over that many packed rows and
the keys they attend to (`CostModel`: measured at start-up, updated after every pass). Since a node's
probability never exceeds its parent's, taking nodes in decreasing probability keeps
every chosen set a tree; the controller takes the prefix of that order with the best G.

Worked example: one request, cost(rows) = 20 ms + 15 ms per row (one row costs what
two cost: passes are padded), a chain of two nodes with P = 0.9 and 0.3: G is 1/0.05 =
20 with no draft, 1.9/0.05 = 38 with one node, 2.2/0.065 = 33.8 with both. The
controller drafts one token.
"""

from __future__ import annotations

import bisect
import functools
import statistics
from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

from codespec.index import Draft
from codespec.verify.tree import VerifyTree

DraftPolicy = Literal["chain", "tree", "goodput"]
POLICIES: tuple[str, ...] = ("chain", "tree", "goodput")
PRIOR_TRIALS = 3.0  # weight of the prior rate, in trials (observations soon outweigh it)
DECAY = 0.8  # a request's own record: weight of the past per observation (adapts fast)
ENGINE_DECAY = 0.995  # every request's record: weight of the past per observation


MATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # upper bounds of match-length buckets
REQUEST_PRIOR_WEIGHT = 4.0  # a request's own evidence outweighs the engine's after ~4 trials


# Drafts that guess rather than match get their own rates: a copy anchor's guesses and
# resumed copies (index/anchor.py) are right in most places of an edit and in few of a
# FIM completion, and pooled with matches of the same length they would mislead the
# controller on both.
# A draft model's drafts (engine/drafter.py) are a third family: they match nothing, and
# their rate at a depth is how often the small model agrees with the large one there.
GUESS_SOURCES = frozenset({"anchor", "anchor-guess"})
MODEL_SOURCE = "model"
FAMILY = len(MATCH_BUCKETS) + 1  # buckets per family (matches, guesses, a draft model's)
BUCKETS = 3 * FAMILY
# a draft model's prior rate at every depth: the 0.5B wrote 72-95 of the 1.5B's 96 tokens
# on four functions of the repository bench (whole prompt given, 2026-12-08)
MODEL_PRIOR = 0.8


def family_of(source: str) -> int:
    """0: drafts that match, 1: a copy anchor's guesses, 2: a draft model's."""
    return 2 if source == MODEL_SOURCE else 1 if source in GUESS_SOURCES else 0


def match_bucket(match_len: int, source: str = "") -> int:
    bucket = _BUCKET_OF[match_len] if 0 <= match_len <= MATCH_BUCKETS[-1] else _bucket_of(match_len)
    return bucket + FAMILY * family_of(source)


def _bucket_of(match_len: int) -> int:
    return min(bisect.bisect_left(MATCH_BUCKETS, match_len), len(MATCH_BUCKETS))


# the controller looks a bucket up for every depth of every draft it prices, each pass
_BUCKET_OF = tuple(_bucket_of(n) for n in range(MATCH_BUCKETS[-1] + 1))


def prior_rate(bucket: int) -> float:
    """Laplace's rule of succession for the shortest match of the bucket: a k-token match
    is k tokens that followed as the source did, so the next one does with probability
    (k + 1) / (k + 2). Longer matches start out more trusted (2/3 at one token, 0.95 at
    17), which lets a fresh engine draft deep on a long copy instead of learning it
    first; each bucket's observations outweigh the prior after a few trials.

    >>> [round(prior_rate(match_bucket(k)), 2) for k in (1, 2, 5, 17, 100)]
    [0.67, 0.75, 0.86, 0.95, 0.99]
    """
    if bucket >= 2 * FAMILY:
        return MODEL_PRIOR
    bucket %= FAMILY
    shortest = MATCH_BUCKETS[bucket - 1] + 1 if bucket else 1
    return (shortest + 1) / (shortest + 2)


@dataclass
class AcceptanceTable:
    """Decayed acceptance counts per match-length bucket: of the verified nodes whose
    parent was accepted (an acceptance could happen there), how often one was."""

    accepted: list[float] = field(default_factory=lambda: [PRIOR_TRIALS * prior_rate(b) for b in range(BUCKETS)])
    trials: list[float] = field(default_factory=lambda: [PRIOR_TRIALS] * BUCKETS)
    decay: float = ENGINE_DECAY

    def rate(self, bucket: int) -> float:
        return self.accepted[bucket] / self.trials[bucket] if self.trials[bucket] else 0.0

    def observe(self, bucket: int, accepted: bool) -> None:
        self.accepted[bucket] = self.decay * self.accepted[bucket] + accepted
        self.trials[bucket] = self.decay * self.trials[bucket] + 1


@dataclass
class Acceptance:
    """One request's calibrated acceptance by match length (and by whether the draft
    matched or guessed): its own decayed counts, starting from the engine's table
    (every request so far) as a prior.

    A draft from a k-token match whose first d tokens were accepted continues a
    (k + d)-token match, so longer matches, which are more reliable, get their own rate.
    """

    engine: AcceptanceTable = field(default_factory=AcceptanceTable)
    own: AcceptanceTable = field(default_factory=lambda: AcceptanceTable([0.0] * BUCKETS, [0.0] * BUCKETS, DECAY))

    def rate(self, match_len: int, source: str = "") -> float:
        b = match_bucket(match_len, source)
        prior = self.engine.rate(b)
        return (self.own.accepted[b] + REQUEST_PRIOR_WEIGHT * prior) / (self.own.trials[b] + REQUEST_PRIOR_WEIGHT)

    def observe(self, match_len: int, accepted: bool, source: str = "") -> None:
        b = match_bucket(match_len, source)
        self.engine.observe(b, accepted)
        self.own.observe(b, accepted)


KEY_SCALE = 1000.0  # attended keys enter the fit in thousands (keeps the normal equations well scaled)
# Before a calibration, the cost model trusts its own online fit once it has seen this
# many passes spanning at least this many rows (a fixed cost and a per-row cost apart).
ONLINE_PASSES = 8
ONLINE_ROW_SPREAD = 6


@dataclass
class CostModel:
    """Seconds per verify pass, `a + b * rows + c * keys + d * extra_blocks`: `rows`
    packed rows, `keys` the attended keys summed over the rows (each row attends to its
    request's context and its ancestors), `extra_blocks` the row blocks past the first
    that the linear layers multiply separately (rowblocks.py: 32 rows a block here).
    Fitted by least squares with forgetting (newer timings weigh more), so it follows
    the machine's load. Why these variables: on the default model (2 cores, bf16) a row
    costs ~1.3 ms in the linear layers plus one attention call per layer that grows with
    its context (~45 us per layer at 500 keys, ~80 us at 1,200), so a line in rows
    alone, timed at one context length, misprices requests with longer prompts
    (the batch-8 FIM runs: ~1.2k-token prompts, timed at 512); and each extra block
    re-reads every weight (~20 ms). Start-up timing at two context lengths and on both
    sides of a block boundary separates them. Single timings scatter by +-15%, so a
    fitted model decides better than interpolated points. One-row passes are padded to
    two and cost what two cost (`min_rows`; the row decoder runs them as one).

    Until it is calibrated (`measure`, or timings stored by an earlier process:
    forward/profile.py) or has seen enough passes to tell a fixed cost from a per-row one
    (`ready`), the engine does not ask it: drafts follow the chain policy's prior, k
    tokens for a k-token match."""

    forget: float = 0.98  # weight of the past per new timing
    block: int = 0  # rows per linear-layer block (0: passes are not blocked)
    # the keys a padded attention call reads for a row that sees n (the backend's, given by
    # the verifier); None: each row reads its own keys
    key_span: Callable[[int], int] | None = None
    min_rows: int = 2  # a pass of fewer rows runs (and costs) this many
    calibrated: bool = False  # fitted to start-up timings (this process's or stored ones)
    passes: int = 0  # timings observed
    rows_seen: tuple[int, int] = (1 << 30, 0)  # fewest and most rows of those timings
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * 4 for _ in range(4)])  # sum w x x^T
    _xy: list[float] = field(default_factory=lambda: [0.0] * 4)  # sum w x y
    _fitted: tuple[float, float, float, float] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, points: dict[int, float] | dict[tuple[int, int], float], block: int = 0) -> CostModel:
        """A model calibrated with {rows: seconds} or {(rows, keys): seconds}."""
        model = cls(block=block)
        model.calibrated_with([(*(at if isinstance(at, tuple) else (at, 0)), seconds) for at, seconds in points.items()])
        return model

    @property
    def padded(self) -> bool:
        """Whether attention runs padded calls: keys are counted per call."""
        return self.key_span is not None

    @property
    def measured(self) -> bool:
        return self._xx[0][0] > 0

    @property
    def ready(self) -> bool:
        """Whether its prices can steer drafting: calibrated, or fitted online to passes
        of varied sizes."""
        fewest, most = self.rows_seen
        return self.calibrated or (self.passes >= ONLINE_PASSES and most - fewest >= ONLINE_ROW_SPREAD)

    def _features(self, rows: int, keys: int) -> tuple[float, float, float, float]:
        rows = max(rows, self.min_rows)
        extra = -(-rows // self.block) - 1 if self.block else 0
        return 1.0, float(rows), keys / KEY_SCALE, float(extra)

    def observe(self, rows: int, seconds: float, keys: int = 0) -> None:
        x = self._features(rows, keys)
        self.passes += 1
        padded_rows = int(x[1])  # a one-row pass may run as two
        self.rows_seen = (min(self.rows_seen[0], padded_rows), max(self.rows_seen[1], padded_rows))
        for i in range(4):
            self._xy[i] = self.forget * self._xy[i] + x[i] * seconds
            for j in range(4):
                self._xx[i][j] = self.forget * self._xx[i][j] + x[i] * x[j]
        self._fitted = None

    def coefficients(self) -> tuple[float, float, float, float]:
        """(a, b, c, d): seconds, per row, per attended key, per extra block. Slopes are
        never negative: the largest set of variables whose fit has no negative slope
        (variables that never varied cannot be fitted) wins; the constant is always in."""
        if self._fitted is None:
            self._fitted = self._fit()
        return self._fitted

    def _fit(self) -> tuple[float, float, float, float]:
        if not self.measured:
            return 1.0, 0.0, 0.0, 0.0  # nothing measured: every pass costs the same
        subsets = [(1, 2, 3), (1, 2), (1, 3), (1,), (2, 3), (2,), (3,), ()]
        for slopes in subsets:
            used = (0, *slopes)
            solved = _solve([[self._xx[i][j] for j in used] for i in used], [self._xy[i] for i in used])
            if solved is None or any(v < 0 for v in solved[1:]):
                continue
            full = dict(zip(used, solved))
            return full[0], full.get(1, 0.0), full.get(2, 0.0) / KEY_SCALE, full.get(3, 0.0)
        return self._xy[0] / self._xx[0][0], 0.0, 0.0, 0.0

    def cost(self, rows: int, keys: int = 0) -> float:
        return self.pricer()(rows, keys)

    def pricer(self) -> Callable[[int, int], float]:
        """`cost` with the fit read once: the controller prices every candidate node of
        every request each pass."""
        a, b, c, d = self.coefficients()
        features = self._features

        def price(rows: int, keys: int = 0) -> float:
            _, n, _, extra = features(rows, keys)
            return max(a + b * n + c * keys + d * extra, 1e-6)
        return price

    def best_prefix(self, rows: int, keys: int, expected: float,
                    nodes: Sequence[tuple[float, int]]) -> tuple[int, float]:
        """How many of `nodes` ((P(accepted), keys its row reads), in the order they may
        be taken) to add to a pass of `rows` rows reading `keys` keys that commits
        `expected` tokens without them, for the best expected goodput (0: none pays); and
        that goodput."""
        price = self.pricer()
        best_n, best = 0, expected / price(rows, keys)
        for taken, (p, more) in enumerate(nodes, start=1):
            rows, keys, expected = rows + 1, keys + more, expected + p
            value = expected / price(rows, keys)
            if value > best:
                best_n, best = taken, value
        return best_n, best

    def measure(self, run_pass: Callable[[int, int], float], rows: Sequence[int], contexts: Sequence[int],
                repeat: int = 3) -> list[tuple[int, int, float]]:
        """Time `run_pass(rows, context)` per row count and context length, and observe
        the median of `repeat` timings (after a warm-up pass at the largest size); keys
        counted by `attended_keys`. Returns the (rows, keys, seconds) observed, for
        `calibrated_with` in a later process.
        Why a median: single start-up timings ran 10-25% above the steady cost (first
        touches of the KV slot's pages, allocator growth), which priced rows too high."""
        run_pass(max(rows), max(contexts))
        timings = []
        for context in contexts:
            for n in rows:
                seconds = statistics.median(run_pass(n, context) for _ in range(repeat))
                timings.append((n, self.attended_keys(context, [(n, n - 1)]), seconds))
        self.calibrated_with(timings)
        return timings

    def calibrated_with(self, timings: Sequence[tuple[int, int, float]]) -> None:
        """Observe start-up timings (rows, keys, seconds), all with the same weight."""
        forget, self.forget = self.forget, 1.0
        for rows, keys, seconds in timings:
            self.observe(rows, seconds, keys)
        self.forget = forget
        self.calibrated = self.calibrated or bool(timings)

    def attended_keys(self, context: int, chains: Sequence[tuple[int, int]]) -> int:
        """The keys a request's rows read in one pass over `context` committed tokens;
        `chains`: (rows, depth of the last row) per chain of its tree (VerifyTree.chains;
        the main path of m rows is (m, m - 1)). Lean calls read each row's own keys;
        in a padded call every row scores all of its chain's keys, padded to whole key
        blocks (the softmax work, which dominates, grows with rows x padded keys).

        >>> blocks = lambda keys: -(-keys // 512) * 512   # a padded call: whole blocks of 512 keys
        >>> CostModel().attended_keys(100, [(3, 2), (1, 2)]), CostModel(key_span=blocks).attended_keys(100, [(3, 2), (1, 2)])
        (409, 2048)
        """
        if self.key_span is not None:
            return sum(rows * self.key_span(context + last + 1) for rows, last in chains)
        return sum(rows * (context + last + 1) - rows * (rows - 1) // 2 for rows, last in chains)

    def tree_keys(self, context: int, tree: VerifyTree) -> int:
        return self.attended_keys(context, [(end - begin, tree.depths[end - 1]) for begin, end in tree.chains()])

    def draft_keys(self, context: int, draft: Draft, depths: list[int] | None = None) -> int:
        """`tree_keys` of the pass a draft makes (its pending token, then its nodes),
        without building the tree where rows read their own keys: each row then reads
        context + depth + 1 keys, whatever chain it is on (`depths`: the draft's, 1 for
        a root).

        >>> d = Draft((5, 6, 7), (-1, 0, -1), (3, 2, 1), match_len=2, source="index")
        >>> CostModel().draft_keys(100, d) == CostModel().tree_keys(100, VerifyTree.build(0, d)) == 101 + 102 + 103 + 102
        True
        """
        if self.padded:  # every row of a padded call scores its whole chain's keys
            return self.tree_keys(context, VerifyTree.build(0, draft))
        return (len(draft) + 1) * (context + 1) + sum(depths if depths is not None else _depths(draft))

    def row_keys(self, context: int, depth: int) -> int:
        """The keys one more row at `depth` adds: its own (lean), or its padded call's
        (on the main path or off it alike: every row of a padded call scores them all)."""
        if self.key_span is None:
            return context + depth + 1
        return self.key_span(context + depth + 1)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when `a` is (nearly) singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    scale = max(abs(v) for row in a for v in row) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-9 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def node_probabilities(draft: Draft, rate: Callable[[int, str], float],
                       depths: list[int] | None = None) -> list[float]:
    """P(node accepted) for every node of a topologically ordered draft: along its path,
    each step's count share times the acceptance rate at that step's match length.

    >>> d = Draft((5, 6, 7), (-1, 0, 0), (4, 3, 1), match_len=3, source="index")
    >>> [round(p, 3) for p in node_probabilities(d, rate=lambda match_len, source: 0.5)]
    [0.5, 0.188, 0.062]
    """
    match_len, source, n = draft.match_len, draft.source, len(draft)
    if draft.parents == _chain_parents(n):  # most drafts: every share is 1
        probs, p = [], 1.0
        for depth in range(1, n + 1):
            p = p * rate(match_len + depth - 1, source) * 1.0  # (* 1.0: the share, as below)
            probs.append(p)
        return probs
    sibling_total: dict[int, int] = {}
    for parent, count in zip(draft.parents, draft.counts):
        sibling_total[parent] = sibling_total.get(parent, 0) + (count if count > 1 else 1)
    rates: dict[int, float] = {}  # by depth: the same rate for every node at a depth
    probs = []
    for parent, count, depth in zip(draft.parents, draft.counts, depths or _depths(draft)):
        step = rates.get(depth)
        if step is None:
            step = rates[depth] = rate(match_len + depth - 1, source)
        share = (count if count > 1 else 1) / sibling_total[parent]
        probs.append((probs[parent] if parent >= 0 else 1.0) * step * share)
    return probs


@functools.lru_cache(maxsize=None)
def _chain_parents(n: int) -> tuple[int, ...]:
    return tuple(range(-1, n - 1))


@dataclass(frozen=True)
class Offered:
    """A request's drafts from its sources, to be picked among and pruned with the whole
    batch's (fastchoice.choose_all)."""

    candidates: list[Draft]


@dataclass(frozen=True)
class Priced:
    """A draft with each node's P(accepted) and depth (1 for a root), as priced on the
    draft it was cut from: pruning keeps a node's probability (a sibling left out of the
    pass does not make the model likelier to write this node)."""

    draft: Draft
    probs: tuple[float, ...]
    depths: tuple[int, ...]

    @classmethod
    def of(cls, draft: Draft, rate: Callable[[int, str], float]) -> Priced:
        depths = _depths(draft)
        return cls(draft, tuple(node_probabilities(draft, rate, depths)), tuple(depths))

    @classmethod
    def empty(cls, source: str = "none") -> Priced:
        return cls(Draft.empty(source), (), ())

    def __len__(self) -> int:
        return len(self.draft)

    def keep(self, nodes: Sequence[int]) -> Priced:
        """These nodes alone (a set closed under parents), in the draft's order."""
        if len(nodes) == len(self.draft):
            return self
        kept = sorted(nodes)
        return Priced(self.draft.restricted(set(kept)), tuple(self.probs[i] for i in kept),
                      tuple(self.depths[i] for i in kept))


def pick(candidates: Sequence[Draft], rate: Callable[[int, str], float], cost: CostModel, context: int = 0) -> Draft:
    """The candidate (a request's drafts from its several sources) whose best pruning
    gives the request alone the best expected goodput; empty when drafting nothing
    beats every candidate. Scoring, not rules, decides between a long match from the
    index, a shorter one in the request's own context and a copy anchor's guesses: each
    node is priced by its source's calibrated acceptance (as SuffixDecoding keeps the
    draft with the higher expected accepted length, here divided by its cost).

    >>> cost = CostModel.of({2: 0.024, 40: 0.1})   # 20 ms + 2 ms per row
    >>> short = Draft.chain([1, 2], [1, 1], match_len=2, source="context")
    >>> long = Draft.chain([3, 4, 5, 6], [1, 1, 1, 1], match_len=9, source="index")
    >>> pick([short, long], rate=lambda match_len, source: 0.9, cost=cost).token_ids
    (3, 4, 5, 6)
    """
    return pick_priced(candidates, rate, cost, context).draft


def pick_priced(candidates: Sequence[Draft], rate: Callable[[int, str], float], cost: CostModel,
                context: int = 0) -> Priced:
    """`pick`, with the winner's node probabilities for `choose_priced`."""
    row_keys = cost.row_keys
    alone = cost.attended_keys(context, [(1, 0)])  # the pending token's keys
    _, alone_goodput = cost.best_prefix(1, alone, 1.0, ())
    best, best_nodes, best_goodput = Priced.empty(), [], alone_goodput
    for draft in candidates:
        priced = Priced.of(draft, rate)
        ranked = sorted((-p, depth, i) for i, (p, depth) in enumerate(zip(priced.probs, priced.depths)))
        order = [i for _, _, i in ranked]
        n, goodput = cost.best_prefix(1, alone, 1.0, [(priced.probs[i], row_keys(context, priced.depths[i]))
                                                      for i in order])
        if not n:
            continue  # nothing drafted: the pending token alone, the goodput `best` starts from
        if cost.padded:  # a padded call's rows score their chain's keys: price the pruned tree
            chosen = priced.keep(order[:n])
            keys = cost.draft_keys(context, chosen.draft, list(chosen.depths))
            goodput = (1.0 + sum(chosen.probs)) / cost.cost(1 + n, keys)
        if goodput > best_goodput:
            best, best_nodes, best_goodput = priced, order[:n], goodput
    return best.keep(best_nodes) if best_nodes else best


def _depths(draft: Draft) -> list[int]:
    depths: list[int] = []
    for parent in draft.parents:
        depths.append(depths[parent] + 1 if parent >= 0 else 1)
    return depths


def choose(drafts: Sequence[Draft], rates: Sequence[Callable[[int, str], float]], cost: CostModel,
           contexts: Sequence[int] | None = None) -> list[Draft]:
    """Prune each request's draft to the selection with the best expected goodput;
    `contexts` are the requests' committed lengths (what each of their rows attends to)."""
    priced = [Priced.of(draft, rate) for draft, rate in zip(drafts, rates)]
    return [p.draft for p in choose_priced(priced, cost, contexts)]


def choose_priced(drafts: Sequence[Priced], cost: CostModel, contexts: Sequence[int] | None = None) -> list[Priced]:
    """`choose` over drafts already priced (`pick_priced`'s)."""
    contexts = list(contexts) if contexts is not None else [0] * len(drafts)
    if not any(len(d) for d in drafts):
        return list(drafts)
    candidates = sorted(  # (-probability, depth, request, node): parents sort before children
        (-p, depth, request, node)
        for request, draft in enumerate(drafts) for node, (p, depth) in enumerate(zip(draft.probs, draft.depths)))
    row_keys = cost.row_keys
    requests = len(drafts)
    keys = sum(cost.attended_keys(c, [(1, 0)]) for c in contexts)  # every request's pending token
    nodes = [(-neg_p, row_keys(contexts[request], depth)) for neg_p, depth, request, _ in candidates]
    best_n, _ = cost.best_prefix(requests, keys, float(requests), nodes)
    keep: list[list[int]] = [[] for _ in drafts]
    for _, _, request, node in candidates[:best_n]:
        keep[request].append(node)
    return [draft.keep(chosen) for draft, chosen in zip(drafts, keep)]
