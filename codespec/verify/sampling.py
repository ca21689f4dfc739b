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

from codespec.verify.tree import VerifyResult, VerifyTree


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
    # Shifted so each row's largest logit is 0 before the division: a temperature so small
    # that logit / T overflows (5e-324 is a valid request) then gives the argmax's point
    # mass, its limit, instead of inf - inf = NaN (0 / 0 for the largest: 0 again).
    logits = logits.float()
    scaled = ((logits - logits.amax(dim=-1, keepdim=True)) / params.temperature).nan_to_num(nan=0.0)
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


def sample_accept(logits: torch.Tensor, tree: VerifyTree, params: SamplingParams,
                  generator: torch.Generator) -> VerifyResult:
    """Multi-draft speculative sampling down a draft tree.

    logits: [nodes, vocab], row i after node i. At the current node (the pending token
    first) its children's tokens are tried in order: child c is accepted with
    probability p(c) under the current distribution p; on rejection c's token is
    removed from p, which is renormalised, and the next child is tried. Deterministic
    drafts make each try the point-mass rule above, so the token that leaves the node
    is distributed exactly as p. If no child is accepted, the token is drawn from what
    is left of p and the pass ends; if an accepted node has no children, the bonus is
    drawn from its row."""
    probs = target_probs(logits, params)
    node, path, committed = 0, [], []
    while True:
        child, token = sample_step(probs[node], tree, node, generator)
        committed.append(token)
        if child is None:
            return VerifyResult(len(path), tuple(committed), tuple(path))
        path.append(child)
        node = child


def sample_step(p: torch.Tensor, tree: VerifyTree, node: int,
                generator: torch.Generator) -> tuple[int | None, int]:
    """The token that leaves `node` under distribution `p` [vocab]: (the child accepted,
    its token), or (None, a token drawn from what the rejected children leave of p)."""
    p = p.clone()
    for child in tree.children(node):
        token = tree.tokens[child]
        mass = p.sum()
        if torch.rand((), generator=generator, device=p.device) * mass < p[token]:
            return child, token
        p[token] = 0.0
    return None, int(torch.multinomial(p, 1, generator=generator))


def new_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A per-request generator: seeded runs are reproducible, unseeded ones are not."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
