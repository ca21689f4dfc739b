"""Drafting the next pass while the device computes this one (the index and the
controller on the CPU overlapping the GPU's pass).

A request's next draft depends on what this pass accepts, so the host can only work
ahead on a guess: the likeliest outcome, the whole main chain of the tree accepted and
the bonus token the request's own sources expect after it. While the pass runs (between
the backend's launch and its results: `Forward.launch`), `guess` extends the request's
proposer session by those tokens, drafts from every source, then puts the session back
as it was. When the pass commits exactly the guessed tokens, the engine takes the
guessed drafts and the session's state after drafting instead of drafting again (the
controller still prices them after the pass, with the batch): on an H100 a batch-8 pass
of the default model takes ~1.5 ms and the drafting ~0.15 ms of it (docs/decisions.md).

Lossless as every draft is: a draft only proposes, the pass decides. The guessed drafts
are the ones the sources give after the pass (the session's context is the same tokens).

Only worth it where a pass leaves the host idle (a GPU's asynchronous launch); a CPU
backend computes inside its call, and the guess would be extra work there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codespec.index import Draft
from codespec.verify.tree import VerifyTree


@dataclass(frozen=True)
class Guess:
    tokens: tuple[int, ...]  # what the pass would commit: the main chain's draft tokens and the bonus
    budget: int  # the draft budget the request would have then
    candidates: list[Draft]  # the sources' drafts then (ProposerSession.candidates)
    state: tuple  # the proposer session's state after drafting (ProposerSession.state)


def main_chain(tree: VerifyTree) -> tuple[int, ...]:
    """The draft tokens of the tree's main chain (nodes 1.. whose parent is the node before).

    >>> main_chain(VerifyTree((9, 5, 7, 6), (-1, 0, 1, 0), (0, 1, 2, 1), (0, 2, 1)))
    (5, 7)
    """
    _, end = tree.chains()[0]
    return tuple(tree.tokens[1:end])


def guess(run: Any, tree: VerifyTree, max_draft_tokens: int) -> Guess | None:
    """The drafts `run` would get after this pass if the pass commits the tree's main chain
    and the bonus its sources expect; None where there is no guess to make. The session
    is left as it was."""
    session = run.session
    if not hasattr(session, "state"):
        return None
    main = main_chain(tree)
    remaining = run.stop.max_new_tokens - len(run.generated) - len(main) - 1
    budget = max(0, min(max_draft_tokens, remaining - 1))  # Run.draft_budget() then
    if budget <= 0:
        return None
    before = session.state()
    try:
        session.extend(main)
        extended = session.state()
        expected = session.draft(1)
        session.set_state(extended)  # drafting moves the copy anchor: as if it never ran
        if not len(expected):
            return None
        session.extend(expected.token_ids[:1])
        candidates = session.candidates(budget)
        return Guess((*main, expected.token_ids[0]), budget, candidates, session.state())
    finally:
        session.set_state(before)
