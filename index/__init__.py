"""Token-sequence indexes that propose drafts: numpy (and later numba) only, no torch.

This package knows nothing of requests, models or torch: it stores token ids and answers
"what most often followed the longest suffix of this context?". Policy (how long a draft
may be, when to draft at all) lives in `codespec.proposer`.
"""

from __future__ import annotations

from codespec.index.context import ContextMatcher
from codespec.index.draft import Draft

__all__ = ["ContextMatcher", "Draft"]
