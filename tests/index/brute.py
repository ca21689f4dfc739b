"""Brute-force reference for the suffix index: the definitions, written plainly."""

from __future__ import annotations

import math


def longest_match(docs: list[list[int]], context: list[int], max_match: int) -> tuple[int, list[tuple[int, int]]]:
    """(length, [(doc, end)]) of the longest context suffix inside any document."""
    best, occ = 0, []
    for length in range(1, min(max_match, len(context)) + 1):
        suffix = context[len(context) - length :]
        hits = [(d, e) for d, doc in enumerate(docs) for e in range(length - 1, len(doc))
                if doc[e - length + 1 : e + 1] == suffix]
        if not hits:
            break
        best, occ = length, hits
    return best, occ


def path_counts(docs, occ, depth):
    """Continuation windows after each occurrence, cut at the document's end."""
    return [tuple(docs[d][e + 1 : e + 1 + depth]) for d, e in occ]


def chain(docs, context, max_tokens, max_match=64, min_prob=0.1):
    length, occ = longest_match(docs, context, max_match)
    depth = min(max_tokens, length)
    windows = path_counts(docs, occ, depth)
    min_count = max(1, math.ceil(min_prob * len(windows))) if windows else 1
    tokens, counts, prefix = [], [], ()
    for level in range(depth):
        options = {}
        for w in windows:
            if len(w) > level and w[:level] == prefix:
                options[w[level]] = options.get(w[level], 0) + 1
        options = {t: c for t, c in options.items() if c >= min_count}
        if not options:
            break
        tok = min(options, key=lambda t: (-options[t], t))
        tokens.append(tok)
        counts.append(options[tok])
        prefix += (tok,)
    return length, tuple(tokens), tuple(counts)
