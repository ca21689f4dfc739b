"""Decode steps and verify passes in one C call (kernels/rowdecoder.c), row-exact by construction.

transformers' eager forward spends a decode step of the default model (2-core EPYC VM,
bf16) as ~30 ms of products and ~30 ms of everything else: ~1,500 torch ops of
dispatch (RMSNorm, rotary, SiLU, cat and copies, 24 layers of module calls) and 24
padded flash-attention calls whose layout rowcalls.py had to keep every row's bits
fixed. `RowDecoder` runs the same layer math (Qwen2 and Llama: RMSNorm, q/k/v with
rotary, attention over the KV slots, o, SiLU-gated MLP, final norm, lm_head) for every
row of a pass in one call: products through rowgemm, the rest in rowdecoder.c, where
each row's bits depend on that row alone (its tokens, position and keys), so plain
decoding and every verify pass agree without a probe.

Each row attends to its own key sequence: the slot's first `context` keys, then a
`path` of slot positions. A row on a request's main path (the chain from the pending
token) sees a prefix of the slot; a tree row off it sees the context, then its
ancestors and itself wherever the pass wrote them. Either is the sequence decoding
would have had, in that order.

Prefill chunks run on it too, as rows that see the slot up to themselves, so a prompt's
KV is the same whichever way it reaches the slot, and the torch-free path of a fresh CLI
process (codespec/direct), which runs this same forward over the same packed weights (its
Python side is rowforward.py, numpy only), computes what this path computes.

Used where the linear layers are rowgemm's (CPU, bfloat16, AVX-512 BF16: rowblocks.py)
and the model is one whose layers this forward knows (`unsupported` says why not);
`CODESPEC_FORWARD=transformers` turns it off.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from codespec import rowforward
from codespec.kernels import native, rowgemm
from codespec.rowforward import FORWARD_CHOICES, RowDecoder, wanted  # noqa: F401 (FORWARD_CHOICES: re-exported)

STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # cos/sin depend on the position alone


def unsupported(model: Any) -> str | None:
    """Why `model` cannot run on the row decoder (None: it can)."""
    reason = unsupported_layers(model)
    if reason is None:
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if not linears or not all("_codespec_rowgemm" in m.__dict__ for m in linears):
            reason = "linear layers not on rowgemm (needs CPU, bfloat16 and AVX-512 BF16)"
    return reason


def unsupported_layers(model: Any) -> str | None:
    """Why the row decoder does not know `model`'s layers (None: it does)."""
    reason = rowforward.config_unsupported(model.config)
    if reason is not None:
        return reason
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"rotary embedding {getattr(rotary, 'rope_type', None)!r}"
    return None


def forward_kind(model: Any) -> str:
    """Which forward decode steps and verify passes of `model` will run, before any
    layer is installed: "rowdecoder" or "transformers" (the machine profile keys on it)."""
    from codespec import rowblocks

    param = next(model.parameters())
    if (wanted() and unsupported_layers(model) is None and rowblocks.linear_kernel(param.dtype, param.device) == "rowgemm"
            and native.has("rowdecoder_forward")):
        return "rowdecoder"
    return "transformers"


def _fuse(modules: Sequence[torch.nn.Linear], arena: torch.Tensor | None) -> rowgemm.Packed:
    """One stripe matrix for several products of the same input (q, k, v; gate, up). When
    rowblocks packed them side by side in its buffer it is a view of them; else they are
    copied together and each module keeps a view of its stripes. Nothing is stored twice."""
    parts = [m.__dict__["_codespec_rowgemm"] for m in modules]
    out_features = sum(p.out_features for p in parts)
    stripes = sum(p.data.shape[0] for p in parts)
    first = parts[0].data
    adjacent = all(b.data.data_ptr() == a.data.data_ptr() + a.data.nbytes for a, b in zip(parts, parts[1:]))
    if arena is not None and adjacent:
        start = (first.data_ptr() - arena.data_ptr()) // arena.element_size()
        fused = arena[start : start + stripes * first[0].numel()].view(stripes, *first.shape[1:])
        return rowgemm.Packed(fused, out_features, parts[0].in_features)
    fused = torch.cat([p.data for p in parts])
    begin = 0
    for module, part in zip(modules, parts):
        count = part.data.shape[0]
        module._codespec_rowgemm = rowgemm.Packed(fused[begin : begin + count], part.out_features, part.in_features)
        begin += count
    return rowgemm.Packed(fused, out_features, parts[0].in_features)


def _ptr(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def bits(tensor: torch.Tensor) -> Any:
    """A bf16 tensor's storage as a numpy uint16 array (no copy)."""
    return tensor.detach().contiguous().view(torch.uint16).numpy()


def model_weights(model: Any) -> rowforward.Weights:
    """The addresses of a transformers model's weights, once rowblocks packed its linears."""
    body, keep = model.model, []
    arena = model.__dict__.get("_codespec_arena")
    layers = []
    for block in body.layers:
        attn, mlp = block.self_attn, block.mlp
        qkv = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], arena)
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv_bias = None  # Qwen2: all three; Llama: none (zeros stand in for a missing one)
        if any(p.bias is not None for p in projections):
            qkv_bias = torch.cat([p.bias if p.bias is not None else torch.zeros(p.out_features, dtype=torch.bfloat16)
                                  for p in projections])
        gate_up = _fuse([mlp.gate_proj, mlp.up_proj], arena)
        tensors = dict(norm_in=block.input_layernorm.weight, qkv=qkv.data, qkv_bias=qkv_bias,
                       o=attn.o_proj._codespec_rowgemm.data, o_bias=attn.o_proj.bias,
                       norm_post=block.post_attention_layernorm.weight, gate_up=gate_up.data,
                       down=mlp.down_proj._codespec_rowgemm.data)
        layers.append({name: _ptr(tensor) for name, tensor in tensors.items()})
        keep.extend(tensors.values())
    head = model.get_output_embeddings()
    embed = bits(model.get_input_embeddings().weight)
    keep.extend([body.norm.weight, head._codespec_rowgemm.data, head.bias, embed])
    _, _, head_dim = rowforward.kv_dims(model.config)
    scale = float(getattr(body.layers[0].self_attn, "scaling", head_dim ** -0.5))
    return rowforward.Weights(layers, body.norm.weight.data_ptr(), head._codespec_rowgemm.data.data_ptr(),
                              _ptr(head.bias), embed, head.out_features, scale, keep)


def _module_tables(rotary: Any, embed: torch.Tensor) -> Any:
    """Rotary tables from the model's own module (scaled rope types: linear, llama3, yarn)."""
    def tables(positions: int) -> tuple[Any, Any]:
        with torch.inference_mode():
            cos, sin = rotary(embed[:1][None], torch.arange(positions)[None])
        return bits(cos[0]), bits(sin[0])

    return tables


QUANTIZE = "_codespec_quantize"  # the model's Settings.quantize, set at load (models/loading.py)


def quantization(model: Any) -> str:
    """How the row decoder holds `model`'s products: "none" (bf16) or "int8"."""
    return str(model.__dict__.get(QUANTIZE, "none"))


def attach(model: Any, quantize: str | None = None) -> RowDecoder | None:
    """The model's row decoder (made once per model and quantization; `quantize` None: the
    model's own, `quantization`), or None where it does not apply."""
    if not wanted() or unsupported(model) is not None or not native.has("rowdecoder_forward"):
        return None  # unsupported(): the linears on rowgemm included
    choice = quantization(model) if quantize is None else quantize
    made = model.__dict__.setdefault("_codespec_decoders", {})
    if choice not in made:
        made[choice] = new_decoder(model, quantize=choice)
    return made[choice]


def new_decoder(model: Any, *, isa_cap: int = rowgemm.AVX512_BF16, quantize: str | None = None) -> RowDecoder:
    """A row decoder over `model`'s packed weights (`isa_cap=rowgemm.SCALAR`: the
    portable path, for tests on any CPU; `quantize` None: the model's own)."""
    lib = rowgemm.library()
    assert lib is not None and unsupported(model) is None
    rotary = model.model.rotary_emb
    default = rowforward.rope_type(model.config) == "default" and getattr(rotary, "rope_type", "default") == "default"
    tables = None if default else _module_tables(rotary, model.get_input_embeddings().weight)
    return RowDecoder(lib, rowgemm.isa(isa_cap), model.config, model_weights(model), tables,
                      quantize=quantization(model) if quantize is None else quantize)


def as_tensor(logits: Any) -> torch.Tensor:
    """The row decoder's logits (bf16 bits) as a bf16 tensor (no copy)."""
    return torch.from_numpy(logits).view(torch.bfloat16)
