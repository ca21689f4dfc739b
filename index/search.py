"""numba kernels: longest suffix match, occurrence collection, draft-tree construction.

Terms. A *segment* stores documents as one int32 corpus, each document followed by
`SEP` (no real token id equals it, so no match crosses a document boundary). An
*occurrence* of the context's longest matched suffix is identified by its *end*: the
corpus index of its last token; its continuation starts at end + 1.

Suffix-array segments index the *reversed* corpus, so the longest suffix of the context
is the longest prefix of the reversed context: one narrowing pass over the suffix array,
one token per step, stopping at the first mismatch (~2-4 us at 10 M tokens).

Every kernel is `@njit(cache=True, nogil=True)`: compiled once per machine into numba's
cache, and free of the GIL so that queries overlap a background rebuild.
"""

from __future__ import annotations

import numpy as np
from numba import njit

SEP = 2**31 - 1  # document separator; real token ids are smaller (a plain int: numba
# inlines it, where a numpy scalar global is unpickled on every call)
NO_TOKEN = -1  # padding in continuation windows past a document's end
UNREAD = -2  # a window cell not read from the corpus yet (see build_draft)
_INSERTION_SORT_MAX = 24


@njit(cache=True, nogil=True, inline="always")
def _doc_index(doc_starts, position):
    """Index of the document holding `position` (doc_starts ascending, first is 0)."""
    lo, hi = 0, doc_starts.shape[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if doc_starts[mid] <= position:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True, nogil=True, inline="always")
def _key(rev, suffix, depth):
    """Token `depth` of the reversed-corpus suffix starting at `suffix`; -1 past its end."""
    j = suffix + depth
    return rev[j] if j < rev.shape[0] else -1


@njit(cache=True, nogil=True)
def _any_live(sa, lo, hi, n, doc_starts, doc_dead):
    for i in range(lo, hi):
        if not doc_dead[_doc_index(doc_starts, n - 1 - sa[i])]:
            return True
    return False


@njit(cache=True, nogil=True)
def sa_longest_match(rev, sa, context, max_match, doc_starts, doc_dead, any_dead):
    """Longest suffix of `context` (<= max_match tokens) occurring in a live document.

    Returns (lo, hi, length): sa[lo:hi] are the reversed-corpus suffixes that start
    with the reversed matched suffix.
    """
    n = rev.shape[0]
    lo, hi, length = 0, n, 0
    c = context.shape[0]
    while length < max_match and length < c:
        token = context[c - 1 - length]
        a, b = lo, hi  # first index in [lo, hi) whose key >= token
        while a < b:
            mid = (a + b) // 2
            if _key(rev, sa[mid], length) < token:
                a = mid + 1
            else:
                b = mid
        first = a
        b = hi  # first index in [first, hi) whose key > token
        while a < b:
            mid = (a + b) // 2
            if _key(rev, sa[mid], length) <= token:
                a = mid + 1
            else:
                b = mid
        if first == a:
            break
        if any_dead and not _any_live(sa, first, a, n, doc_starts, doc_dead):
            break  # every longer match lies in masked documents too
        lo, hi, length = first, a, length + 1
    return lo, hi, length


@njit(cache=True, nogil=True)
def sa_ends(sa, lo, hi, n, max_occurrences, doc_starts, doc_dead, any_dead):
    """End positions (forward corpus) of the live occurrences in sa[lo:hi], at most
    `max_occurrences` of them, sampled with an even stride when there are more."""
    count = hi - lo
    stride = 1 if count <= max_occurrences else (count + max_occurrences - 1) // max_occurrences
    out = np.empty(min(count, max_occurrences), dtype=np.int64)
    k = 0
    for i in range(lo, hi, stride):
        end = n - 1 - sa[i]
        if any_dead and doc_dead[_doc_index(doc_starts, end)]:
            continue
        out[k] = end
        k += 1
        if k == out.shape[0]:
            break
    return out[:k]


@njit(cache=True, nogil=True)
def scan_longest_match(corpus, n, context, max_match, doc_starts, doc_dead, exclude_end):
    """Brute-force longest match over corpus[:n] (small, unsorted segments).

    Returns (length, ends) with every live occurrence's end, ascending. An occurrence
    ending at `exclude_end` (the context itself, when it lives in the corpus) is skipped.
    """
    c = context.shape[0]
    best = 0
    ends = np.empty(0, dtype=np.int64)
    if c == 0 or n == 0:
        return best, ends
    last = context[c - 1]
    found = np.empty(n, dtype=np.int64)
    k = 0
    for end in range(n):
        if corpus[end] != last or end == exclude_end:
            continue
        if doc_dead[_doc_index(doc_starts, end)]:
            continue
        length = 1
        limit = min(max_match, c, end + 1)
        while length < limit and corpus[end - length] == context[c - 1 - length]:
            length += 1
        if length > best:
            best, k = length, 0
        if length == best:
            found[k] = end
            k += 1
    return best, found[:k].copy()


@njit(cache=True, nogil=True)
def fill_windows(corpus, n, ends, width, windows, row0):
    """windows[row0 + i, :] = the `width` tokens after ends[i], NO_TOKEN past SEP or n."""
    for i in range(ends.shape[0]):
        row = row0 + i
        stopped = False
        for j in range(width):
            p = ends[i] + 1 + j
            if not stopped and (p >= n or corpus[p] == SEP):
                stopped = True
            windows[row, j] = NO_TOKEN if stopped else corpus[p]
    return row0 + ends.shape[0]


@njit(cache=True, nogil=True)
def _read_column(windows, order, lo, hi, depth, corpus, n, ends):
    """Fill windows[order[lo:hi], depth] where still UNREAD, from the corpus after each
    row's occurrence end. Only rows of expanded nodes are read deeper than their first
    token, so a chain over 128 occurrences touches a few hundred corpus positions, not
    128 x 32. (A loop, not a per-cell helper: passing arrays to a helper inside the
    loop costs reference-count updates that made each cell ~30x slower.)"""
    for i in range(lo, hi):
        row = order[i]
        if windows[row, depth] == UNREAD:
            p = ends[row] + 1 + depth
            if p >= n or corpus[p] == SEP:
                windows[row, depth] = NO_TOKEN
            else:
                windows[row, depth] = corpus[p]


@njit(cache=True, nogil=True)
def build_draft(windows, rows, max_depth, max_nodes, min_count, chain, corpus, n, ends):
    """Best-first draft tree over continuation windows.

    Nodes are prefixes of the windows; a node's count is how many windows start with
    it. Candidates (children of added nodes) are added in order of decreasing count,
    skipping any whose count is below `min_count`, until `max_nodes` nodes. With
    `chain`, only the last added node's children are candidates: the most frequent path.
    Ties go to the smaller token id. Parents always precede children. Cells that are
    UNREAD are read lazily from `corpus[:n]` after `ends[row]` (one segment); a fully
    filled `windows` needs no corpus.

    Returns (token_ids, parents, counts) as int64 arrays.
    """
    tokens = np.empty(max_nodes, dtype=np.int64)
    parents = np.empty(max_nodes, dtype=np.int64)
    counts = np.empty(max_nodes, dtype=np.int64)
    if rows == 0 or max_depth == 0 or max_nodes == 0:
        return tokens[:0], parents[:0], counts[:0]
    width = min(max_depth, windows.shape[1])
    if chain:
        return _build_chain(windows, rows, width, max_nodes, min_count, corpus, n, ends, tokens, parents, counts)
    order = np.arange(rows)  # row permutation; every node's rows are one range of it
    cap = max_nodes * 64 + rows  # candidate pool: every child of every added node
    c_lo = np.empty(cap, dtype=np.int64)
    c_hi = np.empty(cap, dtype=np.int64)
    c_depth = np.empty(cap, dtype=np.int64)
    c_parent = np.empty(cap, dtype=np.int64)
    c_alive = np.zeros(cap, dtype=np.bool_)
    n_cand = _push_children(windows, order, 0, rows, 0, -1, width, min_count,
                            c_lo, c_hi, c_depth, c_parent, c_alive, 0, corpus, n, ends)
    n_nodes = 0
    while n_nodes < max_nodes:
        best = -1
        best_count = 0
        best_token = 0
        for i in range(n_cand):
            if not c_alive[i]:
                continue
            cnt = c_hi[i] - c_lo[i]
            tok = windows[order[c_lo[i]], c_depth[i]]
            if cnt > best_count or (cnt == best_count and tok < best_token):
                best, best_count, best_token = i, cnt, tok
        if best < 0:
            break
        c_alive[best] = False
        tokens[n_nodes] = best_token
        parents[n_nodes] = c_parent[best]
        counts[n_nodes] = best_count
        lo, hi, depth = c_lo[best], c_hi[best], c_depth[best]
        if chain:
            n_cand = 0  # a path: the other candidates are out for good
        if depth + 1 < width and n_cand + rows <= cap:
            n_cand = _push_children(windows, order, lo, hi, depth + 1, n_nodes, width, min_count,
                                    c_lo, c_hi, c_depth, c_parent, c_alive, n_cand, corpus, n, ends)
        n_nodes += 1
    return tokens[:n_nodes].copy(), parents[:n_nodes].copy(), counts[:n_nodes].copy()


@njit(cache=True, nogil=True)
def _push_children(windows, order, lo, hi, depth, parent, width, min_count,
                   c_lo, c_hi, c_depth, c_parent, c_alive, n_cand, corpus, n, ends):
    """Sort order[lo:hi] by the token at `depth` and add each run of equal tokens as a
    candidate. Sorting only the rows of nodes being expanded keeps a 32-node draft over
    256 windows at a few microseconds; a child's later sort permutes only its own range.
    A range already in order (typical below the root, where rows share a prefix and
    often the next token too) costs one pass; small ranges sort in place by insertion;
    large ones by argsort, which keeps a 256-row root linearithmic."""
    _read_column(windows, order, lo, hi, depth, corpus, n, ends)
    ordered = True
    for i in range(lo + 1, hi):
        if windows[order[i - 1], depth] > windows[order[i], depth]:
            ordered = False
            break
    if ordered:
        pass
    elif hi - lo > _INSERTION_SORT_MAX:
        keys = np.empty(hi - lo, dtype=np.int64)
        for i in range(lo, hi):
            keys[i - lo] = windows[order[i], depth]
        block = order[lo:hi][np.argsort(keys)]
        order[lo:hi] = block
    else:
        for i in range(lo + 1, hi):
            row = order[i]
            key = windows[row, depth]
            j = i - 1
            while j >= lo and windows[order[j], depth] > key:
                order[j + 1] = order[j]
                j -= 1
            order[j + 1] = row
    i = lo
    while i < hi:
        tok = windows[order[i], depth]
        j = i + 1
        while j < hi and windows[order[j], depth] == tok:
            j += 1
        if tok != NO_TOKEN and j - i >= min_count:
            c_lo[n_cand], c_hi[n_cand], c_depth[n_cand], c_parent[n_cand] = i, j, depth, parent
            c_alive[n_cand] = True
            n_cand += 1
        i = j
    return n_cand


@njit(cache=True, nogil=True)
def _build_chain(windows, rows, width, max_nodes, min_count, corpus, n, ends, tokens, parents, counts):
    """The most frequent path, level by level, without sorting in the common case: a
    majority vote (Boyer-Moore) finds a token held by more than half of the rows in two
    passes; only levels without a majority count every token. The chosen rows are then
    partitioned to the front of the range, which becomes the next level's range."""
    order = np.arange(rows)
    lo, hi = 0, rows
    n_nodes = 0
    keys = np.empty(rows, dtype=np.int64)
    while n_nodes < max_nodes and n_nodes < width:
        depth = n_nodes
        _read_column(windows, order, lo, hi, depth, corpus, n, ends)
        candidate, votes = NO_TOKEN, 0
        for i in range(lo, hi):
            value = windows[order[i], depth]
            if votes == 0:
                candidate, votes = value, 1
            elif value == candidate:
                votes += 1
            else:
                votes -= 1
        best, best_count = NO_TOKEN, 0
        if candidate != NO_TOKEN:
            c = 0
            for i in range(lo, hi):
                if windows[order[i], depth] == candidate:
                    c += 1
            if 2 * c > hi - lo:
                best, best_count = candidate, c
        if best == NO_TOKEN:  # no majority: count all tokens (ties: the smaller id)
            for i in range(lo, hi):
                keys[i - lo] = windows[order[i], depth]
            sorted_keys = np.sort(keys[: hi - lo])
            i = 0
            while i < hi - lo:
                j = i + 1
                while j < hi - lo and sorted_keys[j] == sorted_keys[i]:
                    j += 1
                if sorted_keys[i] != NO_TOKEN and j - i > best_count:
                    best, best_count = sorted_keys[i], j - i
                i = j
        if best == NO_TOKEN or best_count < min_count:
            break
        w = lo  # stable partition: rows continuing with `best` first
        for i in range(lo, hi):
            row = order[i]
            if windows[row, depth] == best:
                keys[w - lo] = row
                w += 1
        for i in range(lo, w):
            order[i] = keys[i - lo]
        hi = w
        tokens[n_nodes], parents[n_nodes], counts[n_nodes] = best, n_nodes - 1, best_count
        n_nodes += 1
    return tokens[:n_nodes].copy(), parents[:n_nodes].copy(), counts[:n_nodes].copy()


@njit(cache=True, nogil=True)
def self_longest_match(tokens, n, max_match):
    """The longest suffix of tokens[:n] (up to `max_match` tokens) that also ends
    earlier in it, and every earlier end where it does, ascending (ContextMatcher): the
    scan above over the sequence's own tokens before its last, as one live document."""
    one_document = np.zeros(1, dtype=np.int64)
    return scan_longest_match(tokens, max(n - 1, 0), tokens[:n], max_match, one_document,
                              np.zeros(1, dtype=np.bool_), -1)


@njit(cache=True, nogil=True)
def chain_after(tokens, n, ends, max_tokens):
    """The most frequent continuation after the occurrences ending at `ends` (ascending)
    within tokens[:n], one token at a time: at each step the token that most of the
    still-followed occurrences continue with, ties to the one whose occurrence is
    latest; only the occurrences that continued with it go on. Returns (token_ids,
    counts), each count the occurrences that agreed on that token."""
    out_tokens = np.empty(max(max_tokens, 0), dtype=np.int64)
    out_counts = np.empty(max(max_tokens, 0), dtype=np.int64)
    positions = ends + 1
    values = np.empty(positions.shape[0], dtype=np.int64)
    m = positions.shape[0]
    k = 0
    while k < max_tokens:
        live = 0
        for i in range(m):
            if positions[i] < n:
                positions[live] = positions[i]
                values[live] = tokens[positions[i]]
                live += 1
        m = live
        if m == 0:
            break
        token = _most_frequent_latest(values, m)
        c = 0
        for i in range(m):
            if values[i] == token:
                positions[c] = positions[i] + 1
                c += 1
        out_tokens[k], out_counts[k] = token, c
        k += 1
        m = c
    return out_tokens[:k].copy(), out_counts[:k].copy()


@njit(cache=True, nogil=True)
def _most_frequent_latest(values, m):
    """The most frequent of values[:m]; among equally frequent ones, the one seen last."""
    first = values[0]
    same = True
    for i in range(1, m):
        if values[i] != first:
            same = False
            break
    if same:
        return first
    order = np.argsort(values[:m], kind="mergesort")  # stable: a run's last index is its latest
    best, best_count, best_last = first, 0, -1
    i = 0
    while i < m:
        j = i + 1
        while j < m and values[order[j]] == values[order[i]]:
            j += 1
        count, last = j - i, order[j - 1]
        if count > best_count or (count == best_count and last > best_last):
            best, best_count, best_last = values[order[i]], count, last
        i = j
    return best
