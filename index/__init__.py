"""Token-sequence indexes that propose drafts: numpy + numba only, no torch.

This package knows nothing of requests, models or torch: it stores token ids and answers
"what most often followed the longest suffix of this context?". Policy (how long a draft
may be, when to draft at all) lives in `codespec.policy.proposer`.

* `ContextMatcher`: a request's own prompt and output (prompt lookup).
* `SuffixIndex`: the repository snapshot (`StaticIndex`, a suffix array on disk) plus
  past generations, open buffers and edited files (`DynamicIndex`, online).
"""

from __future__ import annotations

from codespec.index.context import ContextMatcher
from codespec.index.draft import Draft
from codespec.index.dynamic import DynamicIndex
from codespec.index.static import StaticIndex
from codespec.index.store import IndexFileError
from codespec.index.suffix_index import SuffixIndex

__all__ = ["ContextMatcher", "Draft", "DynamicIndex", "IndexFileError", "StaticIndex", "SuffixIndex"]
