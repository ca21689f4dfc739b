"""The cuda backend's layer pieces (forward/cuda.py): each decoder layer's tensors with
q/k/v and gate/up fused into one product each, the rotary tables, the small functions
between the products (torch.compile'd there on CUDA), the pass without the fused layers
(its products through cuBLAS or row_linear's tiles: `unfused_layers`; the fused layers
are forward/cuda_fused.py's), and the eager prefill's chunk (CODESPEC_CUDA_PREFILL=eager)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from codespec.kernels.rope_store import rope_store, rope_store_ref
from codespec.kernels.row_linear import Rope, gate_up_pairs, rms_norm, silu_pairs


@dataclass
class LayerWeights:
    """One decoder layer's tensors (q, k, v fused into one product, gate and up into one:
    stacked, or with `pairs` interleaved row by row for row_linear's SiLU epilogue)."""

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
    pairs: bool = False

    @classmethod
    def of(cls, layer: Any, pairs: bool = False) -> LayerWeights:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = torch.cat([p.weight for p in projections]).detach()
        biases = [p.bias for p in projections]
        qkv_bias = None if any(b is None for b in biases) else torch.cat(biases).detach()
        gate, up = mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()
        gate_up = gate_up_pairs(gate, up) if pairs else torch.cat([gate, up])
        return cls(layer.input_layernorm.weight, eps_of(layer.input_layernorm), qkv, qkv_bias, attn.o_proj.weight,
                   attn.o_proj.bias, layer.post_attention_layernorm.weight, eps_of(layer.post_attention_layernorm),
                   gate_up, mlp.down_proj.weight, pairs)

    def activated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up of this layer's gate/up product, in either layout."""
        return silu_pairs(gate_up) if self.pairs else gated(gate_up)


def rotary_table(model: Any, positions: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim] in `like`'s dtype and device, from the model's own
    rotary module: what it gives every position from 0 (its rope type static: forward/
    cuda.py's unsupported)."""
    at = torch.arange(positions, device=like.device)
    cos, sin = model.rotary_emb(like, at[None])  # [1, positions, head_dim] each
    return cos[0].contiguous(), sin[0].contiguous()


def eps_of(norm: Any) -> float:
    return float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))


def add_norm(hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
              eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream plus a sublayer's output, and its norm (one fused kernel)."""
    hidden = hidden + delta
    return hidden, rms_norm(hidden, weight, eps)


def gated(gate_up: torch.Tensor) -> torch.Tensor:
    """The MLP's SiLU gate on the fused gate/up product."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def unfused_layers(model: Any, layers: list[LayerWeights], ids: torch.Tensor,
                   attend: Callable[[int, Any, torch.Tensor], torch.Tensor], rope_of: Callable[[int], Rope],
                   product: Callable[..., torch.Tensor], add_norm_: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                   gated_: Callable[[torch.Tensor], torch.Tensor], live: tuple[torch.Tensor, torch.Tensor],
                   pdl: bool) -> tuple[torch.Tensor, torch.Tensor, None]:
    """The pass of a transformers Qwen2/Llama `model` over token `ids` (the bucket's rows)
    without the fused layers: its logits and greedy choices (and None: no screen).
    `product(name, x, weight, bias, live=, choices=)`: each product (cuBLAS, or row_linear's
    tiles where the backend names some); `add_norm_` and `gated_`: the work between them
    (add_norm and gated, torch.compile'd on CUDA); rotary and the KV store in one launch
    (kernels/rope_store.py, `rope_of(index)`'s tables and cache layer); `attend(index,
    layer, q)`: attention; `live`: the rows that hold a token."""
    body = model.model
    hidden = body.embed_tokens(ids)  # [rows, hidden]
    delta = torch.zeros_like(hidden)  # what the last layer adds to the residual stream
    for index, (layer, w) in enumerate(zip(body.layers, layers)):
        hidden, x = add_norm_(hidden, delta, w.input_norm, w.input_eps)
        r = rope_of(index)
        q = rope_store(product("qkv", x, w.qkv, w.qkv_bias, live=live), r.cos, r.sin, r.source, r.write_slots,
                       r.write_positions, r.keys, r.values, heads=r.heads, kv_heads=r.kv_heads, positions=r.positions,
                       live=live, pdl=pdl)
        attended = attend(index, layer, q)
        hidden, x = add_norm_(hidden, product("o", attended, w.o, w.o_bias, live=live), w.post_norm, w.post_eps)
        delta = product("down", gated_(product("gate_up", x, w.gate_up, live=live)), w.down, live=live)
    _, x = add_norm_(hidden, delta, body.norm.weight, eps_of(body.norm))
    head = model.lm_head
    choices = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    return product("lm_head", x, head.weight, head.bias, live=live, choices=choices), choices, None


def eager_prefill_chunk(model: Any, layers: list[LayerWeights], cache: Any, slot: int, ids: Sequence[int],
                        begin: int, rope: tuple[torch.Tensor, torch.Tensor], heads: int, kv_heads: int,
                        head_dim: int) -> torch.Tensor:
    """One prefill chunk of the transformers model body `model` (its layers' tensors
    `layers`), eager with causal SDPA: its KV written at positions begin.. of the slot,
    rotary's tables `rope` read at them; its last hidden states."""
    n, end = len(ids), begin + len(ids)
    device = rope[0].device
    positions = torch.arange(begin, end, device=device)
    causal = torch.arange(end, device=device)[None, :] <= positions[:, None]  # [n, end]
    hidden = model.embed_tokens(torch.tensor(list(ids), device=device))
    cos, sin = (table.index_select(0, positions) for table in rope)
    for index, (layer, w) in enumerate(zip(model.layers, layers)):
        x = rms_norm(hidden, w.input_norm, w.input_eps)
        q, k, v = rope_store_ref(F.linear(x, w.qkv, w.qkv_bias), cos, sin, heads, kv_heads, head_dim)
        cache.keys[index][slot, :, begin:end] = k.transpose(0, 1)
        cache.values[index][slot, :, begin:end] = v.transpose(0, 1)
        attended = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], cache.keys[index][slot:slot + 1, :, :end],
            cache.values[index][slot:slot + 1, :, :end], attn_mask=causal, scale=layer.self_attn.scaling,
            enable_gqa=True)
        hidden, x = add_norm(hidden, F.linear(attended[0].transpose(0, 1).reshape(n, -1), w.o, w.o_bias),
                             w.post_norm, w.post_eps)
        hidden = hidden + F.linear(w.activated(F.linear(x, w.gate_up)), w.down)
    return hidden
