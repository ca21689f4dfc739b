"""The direct path: a model served without torch or transformers, straight to the C forward.

A fresh `codespec generate` process used to spend ~2 s importing torch and transformers
before its first token, on top of the model load; Hugging Face's own prompt lookup pays
the same, so speculation could not win back a fixed cost that size on a short request
(issue 16). Where the row decoder serves the model anyway (CPU with AVX-512 BF16,
bfloat16, a Qwen2/Llama model: decoder.py) nothing of torch is needed: the weights come
from the safetensors files (weights.py), the tokenizer from `tokenizers` (tokenizer.py),
the KV slots are numpy arrays, and prefill, decode steps and verify passes are the C
forward's (rowforward.py). It computes what transformers' path with the row decoder
computes, bit for bit: the same packed weights, rotary tables and C code
(tests/test_direct.py pins that), so `generate` and `serve` agree.

    reason = unsupported(path, settings)        # None: the direct path applies
    model = DirectModel.load(path, settings)     # ~0.6 s for the default model
    engine = Engine(model, model.tokenizer, ...)

Greedy requests never import torch; a sampled one imports it for the acceptance rule
(sampling.py). Elsewhere (CUDA, another dtype or CPU, CODESPEC_FORWARD=transformers,
weights stored in another dtype) models/loading.py loads transformers' model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import numpy as np

from codespec import calibration, rowforward
from codespec.kernels import lmchoice, native, rowgemm
from codespec.kvcache import SlotCache
from codespec.tree import Item, VerifyResult, VerifyTree, accept_choices


def _config(path: Path, name: str) -> SimpleNamespace:
    file = path / name
    return SimpleNamespace(**json.loads(file.read_text())) if file.is_file() else SimpleNamespace()


def _cuda_visible() -> bool:
    """Whether `--device auto` would pick a GPU, told without importing torch: an NVIDIA
    device node and a torch build that is not CPU-only."""
    if not os.path.exists("/dev/nvidiactl"):
        return False
    from importlib import metadata

    try:
        return "+cpu" not in metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False


def unsupported(path: str | Path, settings: Any) -> str | None:
    """Why the direct path cannot serve the model at `path` under `settings` (None: it can)."""
    path = Path(path)
    if not rowforward.wanted() or rowforward.linear_wanted() not in ("", "rowgemm"):
        return "CODESPEC_FORWARD/CODESPEC_LINEAR ask for transformers' forward or another linear kernel"
    if settings.device == "cuda" or (settings.device == "auto" and _cuda_visible()):
        return "the model runs on CUDA"
    if settings.device not in ("auto", "cpu") or settings.dtype not in ("auto", "bfloat16"):
        return f"device {settings.device}, dtype {settings.dtype} (the direct path is CPU bfloat16)"
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        return "no config.json or tokenizer.json"
    config = _config(path, "config.json")
    reason = rowforward.config_unsupported(config)
    if reason is None and rowforward.rope_type(config) != "default":
        reason = "a scaled rotary embedding"
    if reason is not None:
        return reason
    from codespec.direct import weights

    if weights.dtypes(_weights_dir(path)) != {"BF16"}:
        return "weights not stored in bfloat16"
    if not native.has("rowdecoder_forward") or rowgemm.library() is None:
        return f"the C forward is not built ({native.unavailable() or 'no rowdecoder'})"
    if rowgemm.isa() != rowgemm.AVX512_BF16:
        return "this CPU has no AVX-512 BF16"
    return None


def _weights_dir(path: Path) -> Path:
    """The bfloat16 serving copy `model prepare` writes (models/loading.py), else `path`."""
    from codespec.models.loading import SERVING_COPY

    copy = path / "bfloat16"
    return copy if (copy / SERVING_COPY).is_file() else path


def _threads(settings: Any) -> int:
    if settings.threads > 0:
        return settings.threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def profile_key(path: str | Path, settings: Any) -> dict[str, str]:
    """The machine-profile key of the model at `path` on the direct path (calibration.py)."""
    return calibration.direct_profile_key(_config(_weights_dir(Path(path)), "config.json"), str(path),
                                          _threads(settings), settings.quantize)


class DirectVerifier:
    """The verifier of the direct path: Verifier's contract (verifier.py) over numpy KV
    slots and the C forward, which every pass of this path takes."""

    device = "cpu"
    row_block, padded_rows = 0, False  # each row reads its own keys: no blocks, no padding

    def __init__(self, decoder: rowforward.RowDecoder, cache: SlotCache) -> None:
        self.decoder, self.cache = decoder, cache
        self._slots = decoder.slots(cache)
        decoder.reach(cache.slot_tokens)

    def prefill(self, slot: int, prompt_ids: Sequence[int], start: int = 0) -> np.ndarray:
        """The KV of prompt_ids[start:] in chunks (on the same grid as the other path);
        returns the logits (bf16 bits) after the prompt's last token: [1, vocab]."""
        prompt = list(prompt_ids)
        assert 0 <= start < len(prompt) <= self.cache.slot_tokens and start % self.cache.chunk == 0
        logits = self.decoder.prefill(prompt, slot, start, self.cache.chunk, self._slots)
        self.cache.prefilled(slot, prompt)
        return logits

    def first_token(self, logits: np.ndarray) -> int:
        return int(lmchoice.first_max(logits[-1:])[0])

    def verify(self, items: Sequence[Item]) -> list[VerifyResult]:
        ids: list[int] = []
        offsets: list[int] = []
        for item in items:
            assert self.cache.length(item.slot) + len(item.tree) < self.cache.slot_tokens
            offsets.append(len(ids))
            ids.extend(item.tree.tokens)
        rows, path = rowforward.plan_rows([(item.slot, self.cache.length(item.slot), item.tree) for item in items])
        if all(item.accept is None for item in items):  # greedy needs the choices alone (lm_head's screen)
            picked = self.decoder.choices(ids, rows, path, self._slots)
            results = [accept_choices(picked[offset : offset + len(item.tree)], item.tree)
                       for item, offset in zip(items, offsets)]
            self._commit(items, results)
            return results
        logits = self.decoder.forward(ids, rows, path, self._slots)
        results = []
        for item, offset in zip(items, offsets):
            if item.accept is None:
                results.append(greedy_tree_accept(logits[offset : offset + len(item.tree)], item.tree))
            else:  # a sampling rule takes torch tensors (sampling.py): imported for sampled requests only
                from codespec.decoder import as_tensor

                results.append(item.accept(as_tensor(logits[offset : offset + len(item.tree)]), item.tree))
        self._commit(items, results)
        return results

    def _commit(self, items: Sequence[Item], results: Sequence[VerifyResult]) -> None:
        for item, result in zip(items, results):
            start = self.cache.length(item.slot)
            if any(node != j + 1 for j, node in enumerate(result.path)):  # a branch won: move it after the context
                source = start + np.array([0, *result.path])
                for layer in (*self.cache.keys, *self.cache.values):
                    kept = layer[item.slot]  # [kv_heads, positions, head_dim]: gather, then store
                    kept[:, start : start + len(source)] = kept[:, source]
            self.cache.committed(item.slot, [item.tree.tokens[0], *(item.tree.tokens[i] for i in result.path)])


def greedy_tree_accept(logits: np.ndarray, tree: VerifyTree) -> VerifyResult:
    """kernels/accept.py's rule over bf16 bits [nodes, vocab] (`accept_choices` of each
    row's first maximum, as torch.argmax).

    >>> lg = rowforward.bf16_bits(np.full((3, 5), -1.0, np.float32)); lg[0, 2] = lg[1, 4] = lg[2, 0] = 0x3F80
    >>> greedy_tree_accept(lg, VerifyTree.chain(9, [2, 3]))
    VerifyResult(accepted=1, committed=(2, 4), path=(1,))
    """
    return accept_choices(lmchoice.first_max(logits), tree)


class DirectModel:
    """A model on the direct path: what the engine asks of a model (engine.py: `config`,
    `generation_config`, `kv_storage`, `new_verifier`, `profile_key`)."""

    direct = True

    def __init__(self, name: str, path: Path, config: Any, generation_config: Any, decoder: rowforward.RowDecoder,
                 tokenizer: Any, threads: int) -> None:
        self.name, self.path, self.config = name, path, config
        self.generation_config, self.decoder, self.tokenizer = generation_config, decoder, tokenizer
        self.threads = threads
        self.weights_dir = _weights_dir(path)

    @classmethod
    def load(cls, name: str, path: str | Path, settings: Any) -> DirectModel:
        from codespec.direct import weights
        from codespec.direct.tokenizer import DirectTokenizer

        path = Path(path)
        threads = _threads(settings)
        lib = rowgemm.library()  # built (or found) by unsupported()
        lib.rowdecoder_threads(threads)
        source = _weights_dir(path)
        config = _config(source, "config.json")
        packed = weights.load_weights(source, config)
        decoder = rowforward.RowDecoder(lib, rowgemm.AVX512_BF16, config, packed, quantize=settings.quantize)
        return cls(name, path, config, _config(source, "generation_config.json"), decoder, DirectTokenizer(path),
                   threads)

    @property
    def parameter_count(self) -> int:
        return self.decoder.weights.parameters

    def kv_storage(self) -> tuple[Any, str]:
        return np.uint16, "cpu"  # bf16 bits

    def new_verifier(self, cache: SlotCache) -> DirectVerifier:
        return DirectVerifier(self.decoder, cache)

    def profile_key(self) -> dict[str, str]:
        return calibration.direct_profile_key(self.config, str(self.path), self.threads, self.decoder.quantize)
