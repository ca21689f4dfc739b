"""Lossless speculative sampling for deterministic drafts (temperature > 0).

A model-free draft proposes one token per position with certainty (q = a point mass on
the draft token d). Speculative sampling (Leviathan et al.) with that q accepts d with
probability min(1, p(d) / q(d)) = p(d), where p is the target distribution after
temperature, top-k and top-p; on rejection it samples from the residual
max(0, p - q) renormalised, which is p with d removed. Every committed token is then
distributed exactly as plain sampling would draw it, whatever the draft. If the whole
chain is accepted, the bonus token is sampled from the last row's p.

Worked example: p = [0.5, 0.3, 0.2], draft d = 1. With probability 0.3 the pass accepts
token 1; otherwise it samples from [0.5, 0, 0.2] / 0.7. Token 1's total probability is
0.3, token 0's is 0.7 * 5/7 = 0.5: exactly p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from codespec.verifier import VerifyResult


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut

    def __post_init__(self) -> None:
        assert self.temperature > 0 and 0 < self.top_p <= 1 and self.top_k >= 0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[rows, vocab] logits -> [rows, vocab] float32 probabilities after temperature,
    top-k and top-p (the smallest set of tokens whose mass reaches top_p; the most
    likely token always stays)."""
    scaled = logits.float() / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_accept(logits: torch.Tensor, draft: torch.Tensor, params: SamplingParams,
                  generator: torch.Generator) -> VerifyResult:
    """logits: [k + 1, vocab] for inputs [pending, d0 .. d(k-1)]; draft: [k] int64."""
    probs = target_probs(logits, params)
    committed: list[int] = []
    for i, token in enumerate(draft.tolist()):
        p = probs[i]
        if torch.rand((), generator=generator, device=p.device) < p[token]:
            committed.append(token)
            continue
        residual = p.clone()
        residual[token] = 0.0
        committed.append(int(torch.multinomial(residual, 1, generator=generator)))
        return VerifyResult(i, tuple(committed))
    bonus = int(torch.multinomial(probs[len(committed)], 1, generator=generator))
    return VerifyResult(len(committed), (*committed, bonus))


def new_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A per-request generator: seeded runs are reproducible, unseeded ones are not."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
