"""The cuda backend's layers (forward/cuda/forward.py): each decoder layer's tensors with q/k/v and
gate/up fused into one product each, the rotary tables, the small functions between the
products (torch.compile'd there on CUDA), and the pass itself (`layers_pass`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from codespec.forward.cuda.rope_store import rope_store


@dataclass(frozen=True)
class Rope:
    """Rotary and the KV store of one layer (rope_store's arguments, its tables form)."""

    cos: torch.Tensor  # [positions, dim] tables
    sin: torch.Tensor
    positions: torch.Tensor  # [rows]: where each row reads the tables
    source: torch.Tensor  # [rows]: a padding row's K and V are its source row's (the reference's stores)
    write_slots: torch.Tensor  # [rows]
    write_positions: torch.Tensor  # [rows]
    keys: torch.Tensor  # [slots, kv_heads, positions, dim]: one layer of the cache
    values: torch.Tensor
    heads: int
    kv_heads: int


@dataclass
class LayerWeights:
    """One decoder layer's tensors (q, k, v fused into one product, gate and up into one)."""

    input_norm: torch.Tensor
    input_eps: float
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    post_eps: float
    gate_up: torch.Tensor
    down: torch.Tensor

    @classmethod
    def of(cls, layer: Any) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = torch.cat([p.weight for p in projections]).detach()
        biases = [p.bias for p in projections]
        qkv_bias = None if any(b is None for b in biases) else torch.cat(biases).detach()
        gate, up = mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()
        return cls(layer.input_layernorm.weight, eps_of(layer.input_layernorm), qkv, qkv_bias, attn.o_proj.weight,
                   attn.o_proj.bias, layer.post_attention_layernorm.weight, eps_of(layer.post_attention_layernorm),
                   torch.cat([gate, up]), mlp.down_proj.weight)


def rotary_table(model: Any, positions: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] in `like`'s dtype and device, from the model's own
    rotary module: what it gives every position from 0 (its rope type static: forward/
    cuda.py's unsupported)."""
    at = torch.arange(positions, device=like.device)
    cos, sin = model.rotary_emb(like, at[None])  # [1, positions, head_dim] each
    return cos[0].contiguous(), sin[0].contiguous()


def eps_of(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen2/Llama RMSNorm: in float32, scaled in the input's dtype."""
    x32 = x.to(torch.float32)
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def add_norm(hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream plus a sublayer's output, and its norm (one fused kernel)."""
    hidden = hidden + delta
    return hidden, rms_norm(hidden, weight, eps)


def gated(gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's SiLU gate on the fused gate/up product."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def layers_pass(model: Any, layers: list[LayerWeights], ids: torch.Tensor,
                attend: Callable[[int, Any, torch.Tensor], torch.Tensor], rope_of: Callable[[int], Rope],
                add_norm_: Callable[..., tuple[torch.Tensor, torch.Tensor]], gated_: Callable[[torch.Tensor], torch.Tensor],
                live: tuple[torch.Tensor, torch.Tensor], pdl: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The pass of a transformers Qwen2/Llama `model` over token `ids` (the bucket's rows):
    its logits and greedy choices. The products through cuBLAS (fixed shapes: a row's bits
    are that row's alone); `add_norm_` and `gated_`: the work between them (torch.compile'd
    on CUDA); rotary and the KV store in one launch (forward/cuda/rope_store.py, `rope_of(index)`'s
    tables and cache layer); `attend(index, layer, q)`: attention; `live`: the rows that
    hold a token."""
    body = model.model
    hidden = body.embed_tokens(ids)  # [rows, hidden]
    delta = torch.zeros_like(hidden)  # what the last layer adds to the residual stream
    for index, (layer, w) in enumerate(zip(body.layers, layers)):
        hidden, x = add_norm_(hidden, delta, w.input_norm, w.input_eps)
        r = rope_of(index)
        q = rope_store(F.linear(x, w.qkv, w.qkv_bias), r.cos, r.sin, r.source, r.write_slots, r.write_positions,
                       r.keys, r.values, heads=r.heads, kv_heads=r.kv_heads, positions=r.positions, live=live,
                       pdl=pdl)
        attended = attend(index, layer, q)
        hidden, x = add_norm_(hidden, F.linear(attended, w.o, w.o_bias), w.post_norm, w.post_eps)
        delta = F.linear(gated_(F.linear(x, w.gate_up)), w.down)
    _, x = add_norm_(hidden, delta, body.norm.weight, eps_of(body.norm))
    head = model.lm_head
    logits = F.linear(x, head.weight, head.bias)
    return logits, torch.argmax(logits, dim=-1)
