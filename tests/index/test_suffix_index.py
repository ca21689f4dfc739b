"""SuffixIndex against brute force: static, dynamic (appends, removals, eviction), trees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codespec.index import DynamicIndex, SuffixIndex
from codespec.index.segment import MAX_OCCURRENCES

from .brute import chain, longest_match, path_counts

docs_strategy = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=40), min_size=1, max_size=6)


@settings(max_examples=200, deadline=None)
@given(docs=docs_strategy, context=st.lists(st.integers(0, 3), min_size=1, max_size=12),
       max_tokens=st.integers(1, 10), max_match=st.integers(1, 12))
def test_static_chain_equals_brute_force(docs, context, max_tokens, max_match):
    idx = SuffixIndex.build({f"f{i}.py": d for i, d in enumerate(docs)})
    draft = idx.draft(context, max_tokens, max_match=max_match)
    length, tokens, counts = chain(docs, context, max_tokens, max_match)
    assert (draft.match_len if len(draft) else length) == length
    assert draft.token_ids == tokens and draft.counts == counts
    assert draft.is_chain


@settings(max_examples=150, deadline=None)
@given(docs=docs_strategy, context=st.lists(st.integers(0, 3), min_size=1, max_size=10),
       max_tokens=st.integers(1, 12))
def test_tree_counts_are_prefix_counts(docs, context, max_tokens):
    idx = SuffixIndex.build({f"f{i}.py": d for i, d in enumerate(docs)})
    draft = idx.draft(context, max_tokens, tree=True, min_prob=0.0)
    length, occ = longest_match(docs, context, 64)
    windows = path_counts(docs, occ, min(max_tokens, length))
    assert len(draft) <= max_tokens
    paths: list[tuple[int, ...]] = []
    for token, parent, count in zip(draft.token_ids, draft.parents, draft.counts):
        path = (paths[parent] if parent >= 0 else ()) + (token,)
        paths.append(path)
        assert count == sum(w[: len(path)] == path for w in windows)
    assert len(set(paths)) == len(paths)  # no duplicate nodes
    # the first node is the most frequent first token (ties: the smaller id)
    if windows and any(windows):
        firsts = [w[0] for w in windows if w]
        assert draft.token_ids[0] == min(set(firsts), key=lambda t: (-firsts.count(t), t))


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "remove"]), st.integers(0, 7),
                              st.lists(st.integers(0, 3), min_size=1, max_size=30)), min_size=1, max_size=25),
       context=st.lists(st.integers(0, 3), min_size=1, max_size=10), budget=st.integers(20, 200))
def test_dynamic_appends_removals_and_eviction_equal_brute_force(ops, context, budget):
    # A tiny tail forces flushes into suffix-array segments and merges.
    idx = SuffixIndex(dynamic=DynamicIndex(budget_tokens=budget, tail_tokens=16, merge_factor=2))
    live: dict[str, list[int]] = {}  # insertion-ordered, oldest first
    for op, key_no, tokens in ops:
        key = f"doc{key_no}"
        if op == "add":
            idx.add_document(key, tokens)
            live.pop(key, None)
            live[key] = tokens[-budget:]
            while sum(map(len, live.values())) > budget:
                live.pop(next(iter(live)))
        else:
            assert idx.remove_document(key) == (key in live)
            live.pop(key, None)
    assert idx.dynamic.keys() == list(live)
    assert idx.dynamic.live_tokens == sum(map(len, live.values()))
    draft = idx.draft(context, 8)
    length, tokens, counts = chain(list(live.values()), context, 8)
    assert draft.token_ids == tokens and draft.counts == counts


def test_masked_and_updated_files():
    idx = SuffixIndex.build({"a.py": [1, 2, 3, 4], "b.py": [5, 2, 3, 6]})
    assert idx.draft([2, 3], 4, tree=True).token_ids == (4, 6)
    idx.update_file("a.py", [1, 2, 3, 7])
    d = idx.draft([2, 3], 4, tree=True)
    assert sorted(d.token_ids) == [6, 7] and d.source == "dynamic+static"
    idx.remove_file("a.py")
    assert idx.draft([2, 3], 4).token_ids == (6,)
    assert idx.stats()["static"]["masked_files"] == 1


def test_static_and_dynamic_pool_equal_length_matches():
    idx = SuffixIndex.build({"a.py": [1, 2, 3, 4]})
    idx.add_document("gen", [9, 2, 3, 4])
    d = idx.draft([8, 2, 3], 4)
    assert d.token_ids == (4,) and d.counts == (2,) and d.source == "dynamic+static"


def test_background_rebuild_swaps_without_blocking_queries():
    import threading

    from codespec.index import StaticIndex

    idx = SuffixIndex.build({"a.py": [1, 2, 3, 4]})
    idx.update_file("a.py", [1, 2, 3, 5])
    release = threading.Event()

    def build():
        release.wait(10)
        return StaticIndex.build({"a.py": [1, 2, 3, 5]})

    idx.rebuild_in_background(build)
    assert idx.draft([2, 3], 4).token_ids == (5,)  # answered while the rebuild waits
    release.set()
    idx.wait_for_rebuild(10)
    assert idx.rebuild_error is None
    assert idx.static.masked_files() == [] and "file:a.py" not in idx.dynamic
    assert idx.draft([2, 3], 4).token_ids == (5,)


def test_real_token_arrays_against_brute_force():
    """Token ids of real source (byte values of stdlib files) through the same checks."""
    import inspect
    import textwrap

    text = inspect.getsource(textwrap).encode()
    docs = [list(text[i : i + 2000]) for i in range(0, 8000, 2000)]
    idx = SuffixIndex.build({f"part{i}": d for i, d in enumerate(docs)})
    rng = np.random.default_rng(0)
    exact = sampled = 0
    while exact < 50:
        d = int(rng.integers(0, len(docs)))
        cut = int(rng.integers(10, len(docs[d])))
        context = docs[d][max(0, cut - 12) : cut]
        draft = idx.draft(context, 6, max_match=12)
        length, occurrences = longest_match(docs, context, 12)
        assert draft.match_len == length or len(draft) == 0
        if len(occurrences) > MAX_OCCURRENCES:  # counts come from an even sample
            assert all(c <= MAX_OCCURRENCES for c in draft.counts)
            sampled += 1
            continue
        _, tokens, counts = chain(docs, context, 6, max_match=12)
        assert draft.token_ids == tokens and draft.counts == counts
        exact += 1
    assert sampled > 0  # both regimes were exercised


def test_empty_and_degenerate_inputs():
    idx = SuffixIndex.build({"empty.py": []})
    assert len(idx.draft([1, 2], 8)) == 0
    assert len(SuffixIndex().draft([1, 2], 8)) == 0
    assert len(SuffixIndex.build({"a": [1, 2, 3]}).draft([], 8)) == 0
    with pytest.raises(ValueError):
        SuffixIndex.build({"a": [-1]})


def test_index_drafts_deeper_than_the_match_only_when_asked():
    from codespec.index import SuffixIndex

    idx = SuffixIndex.build({"a.py": [5, 6, 7, 8, 9, 10, 11]})
    assert idx.draft([6, 7], max_tokens=16, tree=True).token_ids == (8, 9)
    assert idx.draft([6, 7], max_tokens=16, tree=True, max_depth=16).token_ids == (8, 9, 10, 11)
    assert idx.draft([6, 7], max_tokens=16, max_depth=16).token_ids == (8, 9, 10, 11)  # chains too
