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

Prefill chunks still run transformers' forward (a chunk is a GEMM-shaped problem that
torch's flash attention does well; they only need to agree with each other).

Used where the linear layers are rowgemm's (CPU, bfloat16, AVX-512 BF16: rowblocks.py)
and the model is one whose layers this forward knows (`unsupported` says why not);
`CODESPEC_FORWARD=transformers` turns it off.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Sequence

import torch

from codespec import rowcalls
from codespec.kernels import native, rowgemm
from codespec.kvcache import kv_dims

FORWARD_CHOICES = ("rowdecoder", "transformers")  # CODESPEC_FORWARD
FAMILIES = ("qwen2", "llama")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")  # cos/sin depend on the position alone

_pointer, _size = ctypes.c_void_p, ctypes.c_int64


class _Layer(ctypes.Structure):
    _fields_ = [(name, _pointer) for name in ("norm_in", "qkv", "qkv_bias", "o", "o_bias", "norm_post", "gate_up",
                                              "down")]


class _Model(ctypes.Structure):
    _fields_ = [*((name, _size) for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab")),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("layer", ctypes.POINTER(_Layer)),
                *((name, _pointer) for name in ("norm_final", "lm_head", "lm_bias", "cos", "sin")),
                ("positions", _size)]


class _Pass(ctypes.Structure):
    _fields_ = [("rows", _size),
                *((name, _pointer) for name in ("slot", "write", "position", "context", "path_start", "path_len",
                                                "path", "keys", "values")),
                ("capacity", _size)]


def wanted() -> bool:
    """Whether CODESPEC_FORWARD allows the row decoder (a typo is an error, not a silent default)."""
    choice = os.environ.get("CODESPEC_FORWARD", "")
    if choice and choice not in FORWARD_CHOICES:
        raise ValueError(f"CODESPEC_FORWARD={choice!r}: expected one of {', '.join(FORWARD_CHOICES)}")
    return choice != "transformers"


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
    config = model.config
    if getattr(config, "model_type", None) not in FAMILIES:
        return f"model type {getattr(config, 'model_type', None)!r} (the row decoder knows {', '.join(FAMILIES)})"
    if getattr(config, "hidden_act", None) != "silu" or getattr(config, "mlp_bias", False):
        return "an MLP other than SiLU-gated without bias"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "layers with sliding-window attention"
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"rotary embedding {getattr(rotary, 'rope_type', None)!r}"
    heads, (_, kv_heads, dim) = config.num_attention_heads, kv_dims(config)
    if dim not in (64, 128) or heads % kv_heads or heads // kv_heads > 16:
        return f"head layout {heads}x{dim} over {kv_heads} KV heads"
    stripe = rowgemm.STRIPE
    if config.hidden_size % 16 or config.intermediate_size % stripe or (heads * dim) % stripe or (kv_heads * dim) % stripe:
        return f"widths not in whole {stripe}-column stripes"
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


class RowDecoder:
    """The model's decoder stack for decode steps and verify passes (module docstring)."""

    def __init__(self, model: Any, *, isa_cap: int = rowgemm.AVX512_BF16) -> None:
        lib = rowgemm.library()
        assert lib is not None and unsupported(model) is None
        lib.rowdecoder_forward.argtypes = [ctypes.c_int, ctypes.POINTER(_Model), ctypes.POINTER(_Pass), _pointer,
                                           _pointer, _pointer]
        lib.rowdecoder_forward.restype = ctypes.c_int
        lib.rowdecoder_work.argtypes, lib.rowdecoder_work.restype = [ctypes.POINTER(_Model), _size], _size
        self._lib = lib
        self.isa = rowgemm.isa(isa_cap)
        config, body = model.config, model.model
        self.embed = model.get_input_embeddings().weight
        self._keep: list[Any] = []  # every tensor a pointer of the structures refers to
        layers = (_Layer * len(body.layers))()
        arena = model.__dict__.get("_codespec_arena")
        for entry, block in zip(layers, body.layers):
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
            for name, tensor in tensors.items():
                setattr(entry, name, _ptr(tensor))
            self._keep.extend(tensors.values())
        heads = config.num_attention_heads
        _, self.kv_heads, self.head_dim = kv_dims(config)
        head = model.get_output_embeddings()
        self._layers = layers
        self._rotary = body.rotary_emb
        self.dims = _Model(layers=len(body.layers), hidden=config.hidden_size, heads=heads, kv_heads=self.kv_heads,
                           head_dim=self.head_dim, inter=config.intermediate_size, vocab=head.out_features,
                           eps=float(config.rms_norm_eps), scale=float(getattr(body.layers[0].self_attn, "scaling",
                                                                                self.head_dim ** -0.5)),
                           layer=layers, norm_final=body.norm.weight.data_ptr(),
                           lm_head=head._codespec_rowgemm.data.data_ptr(), lm_bias=_ptr(head.bias))
        self._keep.extend([body.norm.weight, head._codespec_rowgemm.data, head.bias])
        self.vocab = head.out_features
        self.positions = 0
        self.reach(1024)

    def reach(self, positions: int) -> None:
        """Make the rotary tables cover positions [0, positions): transformers' own cos/sin,
        computed once for all of them (a position's values do not depend on the others)."""
        if positions <= self.positions:
            return
        with torch.inference_mode():
            ids = torch.arange(positions)[None]
            cos, sin = self._rotary(self.embed[:1][None], ids)
        self._tables = (cos[0].contiguous(), sin[0].contiguous())
        self.dims.cos, self.dims.sin = self._tables[0].data_ptr(), self._tables[1].data_ptr()
        self.dims.positions = positions
        self.positions = positions

    def slots(self, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> tuple[Any, Any, int]:
        """The per-layer cache pointers a pass hands over, for a SlotCache's tensors
        ([slots, kv_heads, capacity, head_dim] each, contiguous)."""
        for tensor in (*keys, *values):
            assert tensor.is_contiguous() and tensor.dtype == torch.bfloat16 and tensor.shape[1:] == (
                self.kv_heads, tensor.shape[2], self.head_dim)
        array = _pointer * len(keys)
        return array(*(t.data_ptr() for t in keys)), array(*(t.data_ptr() for t in values)), keys[0].shape[2]

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], rows: torch.Tensor, path: torch.Tensor, slots: tuple[Any, Any, int]
                ) -> torch.Tensor:
        """Logits [len(ids), vocab] bf16. `rows`: int64 [6, len(ids)]: slot, write position,
        rotary position, context, path start, path length per row; `path`: int64 slot
        positions; `slots`: from `slots()`. Writes each row's K/V at (slot, write)."""
        count = len(ids)
        assert rows.dtype == torch.int64 and rows.shape == (6, count) and rows.is_contiguous()
        needed = int(rows[2].max()) + 1
        if needed > self.positions:
            self.reach(max(needed, 2 * self.positions))
        x = self.embed.index_select(0, torch.tensor(ids, dtype=torch.int64))
        work = torch.empty(self._lib.rowdecoder_work(ctypes.byref(self.dims), count), dtype=torch.bfloat16)
        logits = torch.empty(count, self.vocab, dtype=torch.bfloat16)
        path = path if path.numel() else torch.zeros(1, dtype=torch.int64)
        base, stride = rows.data_ptr(), rows.stride(0) * rows.element_size()
        spec = _Pass(count, *(base + i * stride for i in range(6)), path.data_ptr(),
                     ctypes.cast(slots[0], _pointer), ctypes.cast(slots[1], _pointer), slots[2])
        status = self._lib.rowdecoder_forward(self.isa, ctypes.byref(self.dims), ctypes.byref(spec), x.data_ptr(),
                                              work.data_ptr(), logits.data_ptr())
        assert status == 0, "a row without keys or a position past the rotary tables"
        return logits


def attach(model: Any) -> RowDecoder | None:
    """The model's row decoder (made once per model), or None where it does not apply."""
    if not wanted() or unsupported(model) is not None or not native.has("rowdecoder_forward"):
        return None  # unsupported(): the linears on rowgemm included
    if "_codespec_decoder" not in model.__dict__:
        model.__dict__["_codespec_decoder"] = RowDecoder(model)
    return model.__dict__["_codespec_decoder"]


def plan_rows(requests: Sequence[tuple[int, int, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows [6, n], path) for `RowDecoder.forward` from (slot, slot length, tree) per
    request, in packing order: node i is written at length + i, rotated at length +
    depth; main-path rows see the slot's prefix, the others the context and their path.

    >>> from codespec.tree import VerifyTree
    >>> rows, path = plan_rows([(3, 10, VerifyTree((9, 1, 2, 5), (-1, 0, 1, 0), (0, 1, 2, 1), ()))])
    >>> rows.tolist(), path.tolist()
    ([[3, 3, 3, 3], [10, 11, 12, 13], [10, 11, 12, 11], [11, 12, 13, 10], [0, 0, 0, 0], [0, 0, 0, 2]], [10, 13])
    """
    columns: list[list[int]] = [[] for _ in range(6)]
    path: list[int] = []
    for slot, start, tree in requests:
        _, main = rowcalls.chains(tree)[0]  # the main path: nodes [0, main)
        for node in range(len(tree)):
            on_main = node < main
            nodes = [] if on_main else tree.path(node)
            for column, value in zip(columns, (slot, start + node, start + tree.depths[node],
                                               start + node + 1 if on_main else start, len(path), len(nodes))):
                column.append(value)
            path.extend(start + n for n in nodes)
    return torch.tensor(columns, dtype=torch.int64), torch.tensor(path, dtype=torch.int64)
