"""Log-probabilities of the tokens a request commits, read off the rows of the very pass
that chose them (OpenAI's `logprobs` / `top_logprobs`).

A request that asks for them runs its passes through `Forward.logits` instead of
`Forward.choices`: the greedy choice is then `torch.argmax` over the same row, which the
Forward contract makes the token `choices` would have picked, so output is unchanged.
Values come from the model's own distribution (log-softmax of the raw logits, before
temperature or top-p), in float32. torch is imported when a request asks (as sampling
does): the torch-free row decoder stays torch-free for everyone else.

>>> import torch
>>> from codespec.verify.tree import VerifyTree
>>> accept = with_logprobs(None, top=1)
>>> logits = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0]])     # rows after nodes 0 and 1
>>> result = accept(logits, VerifyTree.chain(5, [1]))               # node 1 (token 1) accepted, bonus 0
>>> result.committed, [round(e.logprob, 3) for e in result.logprobs]
((1, 0), [-0.24, -0.095])
>>> [(token, round(logprob, 2)) for token, logprob in result.logprobs[0].top]   # the most likely at row 0
[(1, -0.24)]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from codespec.verify.tree import Accept, VerifyResult, VerifyTree, accept_choices

if TYPE_CHECKING:
    import torch

MAX_TOP = 20  # OpenAI's top_logprobs limit


@dataclass(frozen=True)
class TokenLogprob:
    """One committed token: its log-probability and the `top` most likely tokens at its
    place (token id, log-probability), most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def logprobs_of(logits: torch.Tensor, rows: Sequence[int], tokens: Sequence[int],
                top: int) -> tuple[TokenLogprob, ...]:
    """Entries for `tokens`, token i drawn from row `rows[i]` of `logits` [rows, vocab]."""
    import torch

    log_probs = torch.log_softmax(logits[list(rows)].float(), dim=-1)
    chosen = log_probs.gather(1, torch.tensor(list(tokens), device=log_probs.device)[:, None])[:, 0].tolist()
    if top:
        # a stable sort: equal values keep token order, so the first of a tie is the token
        # the greedy choice (the first maximum) took; topk orders ties arbitrarily
        values, ids = torch.sort(log_probs, dim=-1, descending=True, stable=True)
        values, ids = values[:, :top], ids[:, :top]
        tops = [tuple(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
    else:
        tops = [()] * len(tokens)
    return tuple(TokenLogprob(int(t), lp, alternatives) for t, lp, alternatives in zip(tokens, chosen, tops))


def with_logprobs(accept: Accept | None, top: int) -> Accept:
    """`accept` (None: greedy) whose results carry the committed tokens' logprobs."""

    def accepted(logits: Any, tree: VerifyTree) -> VerifyResult:
        import torch

        result = accept(logits, tree) if accept is not None else accept_choices(
            torch.argmax(logits, dim=-1).tolist(), tree)
        rows = (0, *result.path)[: len(result.committed)]  # committed token i was chosen at row rows[i]
        return replace(result, logprobs=logprobs_of(logits, rows, result.committed, top))

    return accepted


class Committed(list):
    """The tokens one step committed to a run (a plain list of ids to every caller), and
    their logprobs when the request asked for them (streams send them along)."""

    logprobs: tuple[TokenLogprob, ...] | None = None

    @classmethod
    def of(cls, tokens: Sequence[int], logprobs: Sequence[TokenLogprob] | None) -> Committed:
        out = cls(tokens)
        out.logprobs = None if logprobs is None else tuple(logprobs)
        return out
