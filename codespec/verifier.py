"""The verifier: one forward over [pending token, draft...], greedy acceptance, KV crop.

State between passes: the KV cache holds every committed token except the last one, the
*pending* token, whose KV the next pass computes. A pass feeds the pending token and the
k draft tokens at positions P .. P+k, where P is the cache length. Logits row i is the
model's distribution after input i, so row 0 checks draft[0], row 1 checks draft[1], ...:

    input    pending  d0   d1   d2          model's argmax  a0 a1 a2 a3
    accepted while d_i == a_i; the bonus is a_j at the first mismatch j (or a_k)

With draft [d0, d1, d2] and argmax [d0, d1, x, y] the pass accepts 2 draft tokens and
commits [d0, d1, x]; x becomes the new pending token, and the KV entries of d2 are
cropped (those of pending, d0 and d1 stay).

An empty draft makes the pass a plain decode step: speculation off runs the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from codespec import attention


@dataclass(frozen=True)
class VerifyResult:
    accepted: int  # draft tokens accepted
    committed: tuple[int, ...]  # accepted draft tokens + the bonus token


def greedy_accept(logits: torch.Tensor, draft: torch.Tensor) -> VerifyResult:
    """Longest prefix of `draft` equal to the argmax chain, plus the bonus token.

    logits: [k + 1, vocab] for inputs [pending, d0 .. d(k-1)]; draft: [k] int64.

    >>> lg = torch.full((3, 5), -1.0); lg[0, 2] = lg[1, 4] = lg[2, 0] = 1.0
    >>> greedy_accept(lg, torch.tensor([2, 3]))      # 2 matches, 3 != 4: bonus 4
    VerifyResult(accepted=1, committed=(2, 4))
    """
    k = draft.shape[0]
    assert logits.shape[0] == k + 1, "one logits row per input token"
    target = logits.argmax(dim=-1)  # [k + 1]
    matches = (target[:k] == draft).to(torch.int64)
    accepted = int(matches.cumprod(0).sum()) if k else 0
    return VerifyResult(accepted, tuple(target[: accepted + 1].tolist()))


# How a pass turns logits into committed tokens: greedy_accept, or speculative sampling
# (codespec.sampling.sample_accept) bound to a request's parameters and generator.
Accept = Callable[[torch.Tensor, torch.Tensor], VerifyResult]
_NO_DRAFT = torch.empty(0, dtype=torch.long)


class ChainVerifier:
    """Drives a Hugging Face causal LM for prefill and chain verify passes."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        # Decode steps and verify passes share one attention path row by row, so a
        # verified row equals the decode step it replaces bit for bit (see attention.py).
        self.rows_exact = attention.install(model)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def prefill(self, cache: Any, prompt_ids: Sequence[int], accept: Accept = greedy_accept) -> int:
        """Run the prompt through the model and return its next token."""
        ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(ids.shape[1], device=self.device)[None]
        # logits_to_keep=1: the full [prompt, vocab] logits of a 1k-token prompt would be
        # ~600 MB of memory traffic for one row we need.
        out = self.model(
            input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        return accept(out.logits[0, -1:], _NO_DRAFT.to(self.device)).committed[0]

    @torch.inference_mode()
    def verify(self, cache: Any, pending: int, draft: Sequence[int], accept: Accept = greedy_accept) -> VerifyResult:
        """One verify pass; on return the cache holds pending + accepted draft tokens."""
        start = cache.get_seq_length()
        tokens = [pending, *draft]
        # CPU bf16 matmuls take another kernel for a single row (GEMV) than for two or
        # more, with another summation order; a lone row is padded to two so that every
        # pass runs the same kernels. The pad row's output and KV are discarded.
        pad = 1 if self.rows_exact and len(tokens) == 1 else 0
        ids = torch.tensor([tokens + [pending] * pad], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device)[None]
        rows = {attention.ROWS_FLAG: len(tokens)} if self.rows_exact else {}
        out = self.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True, **rows)
        result = accept(out.logits[0, : len(tokens)], ids[0, 1 : len(tokens)])
        discard = len(draft) - result.accepted + pad
        if discard:
            cache.crop(-discard)
        return result
