"""The `rowdecoder` backend over a transformers model's weights (rows.py runs the passes).

Where the torch-free load does not apply (direct.py: a scaled rotary embedding, weights
stored in another dtype, `codespec bench`, which needs transformers' model for its
peers) but the row decoder knows the model's layers, the model's linear layers are
packed into rowgemm's stripes (rowblocks.install) and the C forward reads them, with
the model's embeddings, norms and biases, in place: one copy of the weights, shared
with transformers' forward. Rotary tables come from the model's own module for scaled
rope types.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from codespec.forward import profile, rowblocks, rowdecoder
from codespec.forward.rowdecoder import RowDecoder
from codespec.forward.rows import RowForward
from codespec.kernels import native, rowgemm

STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # cos/sin depend on the position alone


def unsupported(model: Any) -> str | None:
    """Why the row decoder cannot serve `model` here (None: it can)."""
    reason = unsupported_layers(model)
    if reason is not None:
        return reason
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    embed = model.get_input_embeddings().weight  # never replaced by a packed copy (rowblocks.install)
    kernel = "rowgemm" if linears and all("_codespec_rowgemm" in m.__dict__ for m in linears) else \
        rowblocks.linear_kernel(embed.dtype, embed.device)
    if kernel != "rowgemm":
        return (f"linear kernel {kernel!r}, not rowgemm (it needs a CPU with AVX-512 BF16 or AVX2 and FMA, "
                "and bfloat16 weights)")
    if not native.has("rowdecoder_forward"):
        return f"the C forward is not built ({native.unavailable() or 'no rowdecoder'})"
    return None


def unsupported_layers(model: Any) -> str | None:
    """Why the row decoder does not know `model`'s layers (None: it does)."""
    reason = rowdecoder.config_unsupported(model.config)
    if reason is not None:
        return reason
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"rotary embedding {getattr(rotary, 'rope_type', None)!r}"
    return None


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


def model_weights(model: Any) -> rowdecoder.Weights:
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
    _, _, head_dim = rowdecoder.kv_dims(model.config)
    scale = float(getattr(body.layers[0].self_attn, "scaling", head_dim ** -0.5))
    return rowdecoder.Weights(layers, body.norm.weight.data_ptr(), head._codespec_rowgemm.data.data_ptr(),
                              _ptr(head.bias), embed, head.out_features, scale, keep)


def _module_tables(rotary: Any, embed: torch.Tensor) -> Any:
    """Rotary tables from the model's own module (scaled rope types: linear, llama3, yarn)."""
    def tables(positions: int) -> tuple[Any, Any]:
        with torch.inference_mode():
            cos, sin = rotary(embed[:1][None], torch.arange(positions)[None])
        return bits(cos[0]), bits(sin[0])

    return tables


def row_forward(model: Any, *, quantize: str = "none", screen: bool = True,
                isa_cap: int | None = None) -> RowForward:
    """The `rowdecoder` backend over `model` (check `unsupported` first). Its linear layers
    are packed for rowgemm once (rowblocks.install); one decoder is made per model and
    quantization. `isa_cap=rowgemm.SCALAR`: the portable code (tests, on any CPU)."""
    import torch

    rowblocks.install(model)
    made = model.__dict__.setdefault("_codespec_decoders", {})
    if (quantize, isa_cap) not in made:
        made[quantize, isa_cap] = new_decoder(model, isa_cap=isa_cap, quantize=quantize)
    key = profile.rows_key(model.config, profile.model_source(model, "bfloat16"), torch.get_num_threads(), quantize,
                           made[quantize, isa_cap].isa)
    return RowForward(made[quantize, isa_cap], model.config, model.generation_config, key, screen=screen)


def new_decoder(model: Any, *, isa_cap: int | None = None, quantize: str = "none") -> RowDecoder:
    """A row decoder over `model`'s packed weights (`isa_cap=rowgemm.SCALAR`: the
    portable path, for tests on any CPU)."""
    lib = rowgemm.library()
    assert lib is not None and unsupported(model) is None
    rotary = model.model.rotary_emb
    default = rowdecoder.rope_type(model.config) == "default" and getattr(rotary, "rope_type", "default") == "default"
    tables = None if default else _module_tables(rotary, model.get_input_embeddings().weight)
    return RowDecoder(lib, rowgemm.isa(isa_cap), model.config, model_weights(model), tables, quantize=quantize)
