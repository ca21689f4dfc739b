"""Grammar-constrained acceptance: every row of a verify pass masked by the grammar's
state after the row's path (structured output, tool calls' arguments).

A constrained request's token after node i is the model's choice among the tokens the
grammar allows after the path to node i: greedy, the first maximum of the masked row;
sampled, a draw from the masked row's distribution (temperature, top-k, top-p after the
mask). The rule walks the tree from the pending token as the unconstrained rules do
(tree.accept_choices, sampling.sample_accept), but computes each mask only for the node
it stands on, after consuming the path's tokens: the masks of rejected branches are never
computed. Plain decoding runs the same rule on one-row passes, so constrained output is
the same with or without drafts.

Drafts are pruned before the pass (`prune`): a draft token the grammar forbids ends its
branch there, as no row could accept it.

    constraint = grammar.start()            # a structured.grammar.Grammar's matcher
    accept = constrained(constraint)        # greedy; or constrained(constraint, params, generator)
    result = accept(logits, tree)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from codespec.errors import RequestError
from codespec.index import Draft
from codespec.verify.tree import Accept, VerifyResult, VerifyTree

if TYPE_CHECKING:
    import numpy as np

    from codespec.verify.sampling import SamplingParams


class Constraint(Protocol):
    """One request's grammar state (structured/grammar.py's `GrammarMatcher`)."""

    def allowed(self) -> np.ndarray:
        """A bool mask [vocab]: the tokens the grammar allows next."""

    def consume(self, token: int) -> None:
        """The request committed `token` (one the mask allowed)."""

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, in order, the grammar would allow from here."""

    def describe(self) -> str:
        """What went wrong, for an error message, where the grammar allows nothing."""


def constrained(constraint: Constraint, params: SamplingParams | None = None, generator: Any = None) -> Accept:
    """The acceptance rule of a request under `constraint`: greedy (`params` None) or
    sampled with `params` and `generator`."""

    def accept(logits: Any, tree: VerifyTree) -> VerifyResult:
        import torch

        from codespec.verify.sampling import sample_step, target_probs

        node, path, committed = 0, [], []
        while True:
            allowed = torch.from_numpy(constraint.allowed())
            if not bool(allowed.any()):
                raise RequestError(f"the grammar allows no token after {len(committed)} tokens of this pass: "
                                   f"{constraint.describe()}")
            row = logits[node].float()
            row = row.masked_fill(~allowed[: row.shape[-1]], float("-inf"))
            if params is None:  # the first maximum among the allowed tokens
                token = int(torch.argmax(row))
                child = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
            else:
                child, token = sample_step(target_probs(row[None], params)[0], tree, node, generator)
            constraint.consume(token)
            committed.append(token)
            if child is None:
                return VerifyResult(len(path), tuple(committed), tuple(path))
            path.append(child)
            node = child

    return accept


def prune(draft: Draft, constraint: Constraint) -> Draft:
    """The draft's nodes whose path the grammar allows (a forbidden token ends its branch).

    >>> class Even:  # a grammar of even tokens
    ...     def valid_prefix(self, tokens): return next((i for i, t in enumerate(tokens) if t % 2), len(tokens))
    >>> prune(Draft((2, 4, 5, 6), (-1, 0, 1, -1), (1, 1, 1, 1), 2, "index"), Even()).token_ids
    (2, 4, 6)
    """
    if not len(draft):
        return draft
    keep: set[int] = set()
    for node in range(len(draft)):
        parent = draft.parents[node]
        if parent >= 0 and parent not in keep:
            continue
        path = [node]
        while draft.parents[path[-1]] >= 0:
            path.append(draft.parents[path[-1]])
        tokens = [draft.token_ids[i] for i in reversed(path)]
        if constraint.valid_prefix(tokens) == len(tokens):
            keep.add(node)
    return draft.restricted(keep)
