"""A model's weights straight from its safetensors files into the row decoder's stripes.

The safetensors format is an 8-byte header length, a JSON header (name -> dtype, shape,
byte offsets) and the raw tensors. We map the files and read bf16 tensors as uint16
arrays: the `safetensors` package's numpy loader has no bfloat16, and its torch loader
is what this path exists to avoid. The products' weights are then copied once into
rowgemm's stripes (kernels/rowgemm.c's `rowgemm_pack`, the very routine transformers'
path packs with), in one 64-byte-aligned buffer where q/k/v and gate/up sit side by
side, fused as the C forward reads them.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

from codespec.errors import ModelError
from codespec.forward.base import kv_dims
from codespec.kernels import rowgemm
from codespec.forward.rowdecoder import Weights

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def tensor_files(path: Path) -> list[Path]:
    """The safetensors files of a model directory (one file, or the shards its index names)."""
    if (path / INDEX).is_file():
        shards = sorted(set(json.loads((path / INDEX).read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    return [path / SINGLE] if (path / SINGLE).is_file() else []


def read_header(file: Path) -> tuple[dict[str, Any], int]:
    """(header, offset of the data) of one safetensors file; a clear error when it is not one."""
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                raise ValueError("header length out of range")
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelError(f"{file}: not a readable safetensors file ({exc})") from exc
    header.pop("__metadata__", None)
    return header, 8 + length


def dtypes(path: Path) -> set[str]:
    """Every tensor dtype stored in the model directory's safetensors files."""
    return {entry["dtype"] for file in tensor_files(path) for entry in read_header(file)[0].values()}


def map_tensors(path: Path, maps: list[np.memmap] | None = None) -> dict[str, np.ndarray]:
    """Every bf16 tensor of the model directory as a read-only uint16 array over the mapped
    files (appended to `maps` when given)."""
    tensors: dict[str, np.ndarray] = {}
    for file in tensor_files(path):
        header, start = read_header(file)
        data = np.memmap(file, dtype=np.uint8, mode="r")
        if maps is not None:
            maps.append(data)
        for name, entry in header.items():
            if entry["dtype"] != "BF16":
                raise ModelError(f"{file}: tensor {name} is {entry['dtype']}, the torch-free load reads BF16")
            begin, end = entry["data_offsets"]
            tensors[name] = data[start + begin : start + end].view(np.uint16).reshape(entry["shape"])
    return tensors


def _release(mapping: np.memmap) -> None:
    """Drop the process's pages of a read-only file mapping (they stay in the page
    cache; the few still read, embeddings and norms, fault back in): the resident
    size stays one copy of the weights, not two."""
    import mmap

    try:
        mapping._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        pass  # not Linux, or no mapping: only memory is at stake


def aligned_empty(elements: int, dtype: Any = np.uint16, align: int = 64) -> np.ndarray:
    """An uninitialised array whose data starts on an `align`-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(elements * itemsize + align, dtype=np.uint8)
    skip = -raw.ctypes.data % align
    return raw[skip : skip + elements * itemsize].view(dtype)


def load_weights(path: Path, config: Any) -> Weights:
    """The model's weights for the row decoder: products packed into stripes, the rest
    (embeddings, norms, biases) left in the mapped files."""
    maps: list[np.memmap] = []
    tensors = map_tensors(path, maps)
    prefix = "model."

    def get(name: str, required: bool = True) -> np.ndarray | None:
        found = tensors.get(name)
        if found is None and required:
            raise ModelError(f"{path}: no tensor {name} in its safetensors files")
        return found

    layers_count = config.num_hidden_layers
    embed = get(prefix + "embed_tokens.weight")
    head = get("lm_head.weight", required=not getattr(config, "tie_word_embeddings", False))
    head = embed if head is None else head
    products: list[np.ndarray] = []  # in buffer order: per layer q, k, v, o, gate, up, down; lm_head
    for i in range(layers_count):
        layer = f"{prefix}layers.{i}."
        products += [get(layer + f"self_attn.{p}_proj.weight") for p in ("q", "k", "v", "o")]
        products += [get(layer + f"mlp.{p}_proj.weight") for p in ("gate", "up", "down")]
    products.append(head)
    sizes = [rowgemm.packed_elements(w.shape) for w in products]
    arena = aligned_empty(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    lib = rowgemm.library()  # signatures declared there
    for weight, offset in zip(products, offsets):
        n, k = weight.shape
        lib.rowgemm_pack(weight.ctypes.data, n, k, k, arena.ctypes.data + 2 * offset)
    for mapping in maps:  # the products now live in the arena: let the file's pages go
        _release(mapping)

    def at(index: int) -> int:
        return arena.ctypes.data + 2 * offsets[index]

    keep: list[Any] = [arena, tensors]
    layers = []
    _, kv_heads, head_dim = kv_dims(config)
    for i in range(layers_count):
        layer, first = f"{prefix}layers.{i}.", 7 * i
        biases = [get(layer + f"self_attn.{p}_proj.bias", required=False) for p in ("q", "k", "v")]
        qkv_bias = None  # Qwen2: all three; Llama: none (zeros stand in for a missing one)
        if any(b is not None for b in biases):
            widths = (config.num_attention_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
            qkv_bias = np.concatenate([b if b is not None else np.zeros(w, np.uint16) for b, w in zip(biases, widths)])
            keep.append(qkv_bias)
        o_bias = get(layer + "self_attn.o_proj.bias", required=False)
        layers.append(dict(norm_in=get(layer + "input_layernorm.weight").ctypes.data, qkv=at(first),
                           qkv_bias=None if qkv_bias is None else qkv_bias.ctypes.data, o=at(first + 3),
                           o_bias=None if o_bias is None else o_bias.ctypes.data,
                           norm_post=get(layer + "post_attention_layernorm.weight").ctypes.data,
                           gate_up=at(first + 4), down=at(first + 6)))
    head_bias = get("lm_head.bias", required=False)
    return Weights(layers, get(prefix + "norm.weight").ctypes.data, at(len(products) - 1),
                   None if head_bias is None else head_bias.ctypes.data, embed, head.shape[0],
                   head_dim ** -0.5, keep, parameters=sum(t.size for t in tensors.values()))
