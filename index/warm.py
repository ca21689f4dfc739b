"""Load every numba kernel a draft can call before the first request needs it.

The search kernels are compiled once per machine into numba's on-disk cache, but each
process still loads and types them on first use: 0.3 s on the 2-core VM, paid by the
first speculative request (an H100 run saw the first edit request take
0.54 s against a median of 0.15). Long-lived processes call `warm_up()` at start-up.

>>> warm_up() >= 0.0
True
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from codespec.index.context import ContextMatcher
from codespec.index.suffix_index import SuffixIndex

_TOKENS = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 6, 7, 1, 2, 3]


def warm_up() -> float:
    """Run each draft path once on a tiny corpus (chains and trees; the prompt, a static
    index, a dynamic one, a match in one segment and in several); returns the seconds."""
    began = time.perf_counter()
    matcher = ContextMatcher(_TOKENS)
    index = SuffixIndex.build({"a.py": _TOKENS, "b.py": _TOKENS[::-1]})
    index.add_document("past", _TOKENS + [9, 9, 8])
    # Contexts as lists (front ends) and as the matcher's read-only view of its tokens
    # (the proposers): numba compiles a kernel once per argument type, and a read-only
    # array is a type of its own. Missing it, an H100 run compiled
    # scan_longest_match inside a timed request (0.6 s) on a machine with a cold cache.
    viewed = ContextMatcher(_TOKENS + [9, 9]).tokens
    assert not viewed.flags.writeable, "the proposers' contexts are read-only views"
    # A static index loaded from its file (what serve and lsp query) holds read-only
    # memory-mapped arrays, another type again: missing them, the first requests after a
    # language server loaded its workspace index compiled build_draft (twice ~3.5 s on
    # the Zen 5 VM's typing replay with a cold cache).
    with tempfile.TemporaryDirectory(prefix="codespec-warm-") as folder:
        path = Path(folder) / "warm.csidx"
        index.save(path)
        loaded = SuffixIndex.load(path)
        for tree in (False, True):
            matcher.draft(4, tree=tree)
            for context in (_TOKENS[-3:], [9, 9], viewed[-3:], viewed[-2:]):
                # in every segment (their windows pooled), then in the dynamic segment alone
                index.draft(context, 4, tree=tree)
                loaded.draft(context, 4, tree=tree)  # the mapped segment alone
        loaded.add_document("past", _TOKENS)
        for tree in (False, True):  # the mapped segment pooled with a dynamic one
            for context in (_TOKENS[-3:], viewed[-3:]):
                loaded.draft(context, 4, tree=tree)
        del loaded  # its mapping, before the folder goes
    return time.perf_counter() - began
