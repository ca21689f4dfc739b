"""The `transformers` backend: transformers' own forward over the KV slots.

Every model transformers loads runs here, on every device: CPUs without AVX-512 BF16,
models the row decoder does not know, CUDA. The model's attention layers read and write
the slots through attention.py (a `Plan` per pass says where each row's KV goes and
which keys it attends to).

`transformers` keeps the exactness contract (base.py) by layout: each row attends in a
call whose kernel shapes do not depend on the rest of the pass (rowcalls.py), and the
linear layers multiply in row blocks within one kernel regime (rowblocks.py). Both are
probed per machine (`probe`); the probes' results live in the machine profile. A lone
row would take bf16's GEMV kernel (another summation order), so a one-row pass is
padded to two rows (`min_rows`).

    forward = TorchForward(model)
    forward.probe(None)                       # -> (row block, padded attention), measured
    logits = forward.prefill(cache, slot, prompt, 0)
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from codespec.errors import ModelError
from codespec.forward import attention, profile, rowblocks, rowcalls
from codespec.forward.base import Forward, Moves, Requests, kv_dims
from codespec.kernels.compact import keep_paths


def cache_keyword(model: Any) -> str:
    """The name under which the model's forward takes the KV cache: `cache` since
    transformers 5.2x, `past_key_values` before (still taken there, with a FutureWarning,
    until 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class TorchForward(Forward):
    """transformers' forward behind the Forward protocol (module docstring)."""

    min_rows = 2
    prefill_exact = False  # a prefill pass's GEMMs round by its shape: reuse on the pass grid

    name = "transformers"

    def __init__(self, model: Any, *, padded: bool | None = None) -> None:
        """`padded=False`: one lean attention call per row whatever the probe finds (the
        fallback where padded calls are not row-exact; tests run both)."""
        if attention.uses_sliding_window(model.config):
            raise ModelError("models with sliding-window attention are not supported")
        self.model = model
        self.config, self.generation_config = model.config, getattr(model, "generation_config", None)
        embed = model.get_input_embeddings().weight
        self.device, self.kv_dtype = embed.device, embed.dtype
        attention.install(model)
        rowblocks.install(model)
        _, kv_heads, self.head_dim = kv_dims(model.config)
        self.kv_heads = kv_heads
        self.query_group = model.config.num_attention_heads // kv_heads
        self.row_block, self.padded_rows = 0, False
        self._padded = padded
        # A 4D mask makes transformers skip building one; slot_attention ignores it.
        self._no_mask = torch.zeros(1, 1, 1, 1, dtype=self.kv_dtype, device=self.device)
        self._cache_keyword = cache_keyword(model)

    def probe(self, stored: tuple[int, bool] | None) -> tuple[int, bool]:
        if stored is not None and stored[0]:
            self.row_block, self.padded_rows = stored
        else:  # ~6 s on the default model: rowblocks multiplies lm_head 126 times
            self.row_block = rowblocks.probe(self.model)
            self.padded_rows = rowcalls.probe(self.kv_dtype, self.device, self.kv_heads, self.query_group,
                                              self.head_dim)
        if self._padded is not None:
            self.padded_rows = self.padded_rows and self._padded
        return self.row_block, self.padded_rows

    def profile_key(self) -> dict[str, str]:
        return profile.torch_key(self.model, self.name)

    def _forward(self, cache: Any, ids: list[int], positions: list[int], plan: attention.Plan,
                 **kwargs: Any) -> torch.Tensor:
        cache.plan = plan
        try:
            out = self.model(
                input_ids=torch.tensor([ids], device=self.device),
                position_ids=torch.tensor([positions], device=self.device),
                attention_mask=self._no_mask,
                use_cache=True,
                **{self._cache_keyword: cache},
                **{attention.PLAN_KEY: plan},
                **kwargs,
            )
        finally:
            cache.plan = None
        return out.logits[0]

    @torch.inference_mode()
    def prefill(self, cache: Any, slot: int, prompt: Sequence[int], start: int) -> torch.Tensor:
        logits = None
        for begin, end in cache.spans(len(prompt), start):
            rows = torch.arange(begin, end, device=self.device)
            causal = torch.arange(end, device=self.device)[None, :] <= rows[:, None]  # [rows, end]
            plan = attention.Plan(cache, write_slots=torch.full((end - begin,), slot, device=self.device),
                                  write_positions=rows, prefill=(slot, begin, end - begin), prefill_mask=causal)
            # logits_to_keep=1: a chunk's full [rows, vocab] logits would be ~40 MB we never read
            with rowblocks.prefill_products():  # float32 products where bf16 has no fast GEMM
                logits = self._forward(cache, list(prompt[begin:end]), rows.tolist(), plan, logits_to_keep=1)
        assert logits is not None, "nothing to prefill"
        return logits[-1:]

    @torch.inference_mode()
    def logits(self, cache: Any, requests: Requests) -> torch.Tensor:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        writes: list[int] = []
        for slot, start, tree in requests:
            ids.extend(tree.tokens)
            positions.extend(start + d for d in tree.depths)
            slots.extend([slot] * len(tree))
            writes.extend(start + i for i in range(len(tree)))
        real = len(ids)
        if real == 1:
            # A lone row would take bf16's GEMV kernel (another summation order than the
            # GEMM every other pass uses): pad with a copy whose output is discarded.
            ids, slots = ids * 2, slots * 2
            positions, writes = [positions[0], positions[0] + 1], [writes[0], writes[0] + 1]
        write_slots = torch.tensor(slots, device=self.device)
        write_positions = torch.tensor(writes, device=self.device)
        calls = rowcalls.plan_calls(requests, padded=self.padded_rows, group=self.query_group, dtype=self.kv_dtype,
                                    device=self.device)
        plan = attention.Plan(cache, write_slots, write_positions, calls=calls)
        with rowblocks.blocked(self.row_block):  # multiply like a decode step (rowblocks.py)
            return self._forward(cache, ids, positions, plan)[:real]

    def choices(self, cache: Any, requests: Requests) -> list[int]:
        return self.argmax(self.logits(cache, requests))

    def argmax(self, logits: torch.Tensor) -> list[int]:
        # max().indices is torch.argmax's first-maximum rule at a third of its CPU cost
        return logits.max(dim=-1).indices.tolist()

    def tensor(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def keep(self, cache: Any, moves: Moves) -> None:
        keep_paths(cache.keys, cache.values, moves)
