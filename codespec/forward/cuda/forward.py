"""The `cuda` backend: Qwen2/Llama passes at one fixed shape, row-exact by construction,
replayed as CUDA graphs.

Why. On a GPU, cuBLAS and attention kernels pick tiles and splits by shape, so a verify
pass of 17 rows and the one-row decode steps it stands for may round differently, and a
near-tie then changes greedy output. Here every decode step and every verify pass runs
the same program over exactly `rows` rows (the bucket, 64 by default):

* the linear layers, norms, rotary embedding and lm_head see a [rows, ...] input
  whatever the pass holds. In a GEMM of fixed shape every output row is computed by the
  same tile program over its own input row, so a row's bits depend on that row alone;
  a pass of more rows than the bucket runs as several replays, in order (a tree's nodes
  come after their ancestors, so later replays see the KV earlier ones wrote);
* attention goes through forward/cuda/attention.py: one program per (row, KV head)
  reducing over the row's own logical keys in fixed blocks;
* padding rows repeat the first row's token, position and KV write (same values to the
  same place; the Triton kernels skip rows that hold no token, so on a GPU they store
  nothing) and attend to nothing.

On a GPU a padded row is nearly free: a step reads every weight once either way (the
default model: ~1 GB per pass, ~0.3 ms at H100 bandwidth; 64 rows add ~64 GFLOP, ~0.1 ms
at its bf16 rate). The bucket is also the controller's row block: a pass costs the same
up to `rows` rows and one more replay per bucket after that (CostModel.block).

Fast: the bucket's pass is captured once per KV cache as a CUDA graph (static metadata
buffers, KV written in place in the SlotCache's preallocated slots, no host sync inside),
so a step is one small host-to-device copy, one replay and, for greedy passes, one copy
of the rows' choices back. A prefill runs through the same graph: a pass's tokens are a
chain's rows, replayed `rows` at a time (~1.4 ms a replay on an H100, where an eager
pass with causal SDPA took ~25 ms).

On Hopper our Triton kernels launch as programmatic dependents (forward/cuda/_pdl.py): each
starts while the one before ends (a step 1-5% faster on an H100). Products that carried
the work around them (five launches a layer) made a step faster but a 32-row verify pass
1.40 steps against 1.10 on the H100 and H200, so the products stay cuBLAS's.

On a CPU the same code runs eagerly with the attention's torch reference: that is how
the tests check the layout (float64 tiny models; TRITON_INTERPRET=1 for the kernel).

    forward = CudaForward(model)              # a transformers Qwen2/Llama model on CUDA
    logits = forward.prefill(cache, slot, prompt, 0)
    choices = forward.choices(cache, [(slot, start, tree)])
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from codespec.forward.cuda.attention import row_attention
from codespec.forward.cuda.chained import Chained, Collect, next_starts, plain_steps, step_rows
from codespec.forward.cuda.layers import LayerWeights, Rope, add_norm, gated, layers_pass, rotary_table
from codespec.forward.cuda.passlayout import META_FIELDS, PassRows, chain_rows, fill_staging, tree_rows
from codespec.forward.cuda.settings import CudaSettings, launches_pdl
from codespec.forward import profile
from codespec.forward.base import Forward, Moves, Requests, kv_dims
from codespec.kernels.compact import keep_paths

def unsupported(model: Any) -> str | None:
    """Why this backend cannot run `model` (None: it can): the Qwen2/Llama layers it
    computes, with a rotary embedding whose cos and sin depend on the position alone (a
    slot's are computed once; a `dynamic` one changes with the pass's longest position, so
    a pass's rows would not be its steps' either)."""
    from codespec.forward.hf_weights import STATIC_ROPE
    from codespec.forward.rowdecoder import family_unsupported

    rope_type = getattr(getattr(model.model, "rotary_emb", None), "rope_type", None)
    if rope_type not in STATIC_ROPE:
        return f"rotary embedding {rope_type!r} (the cuda backend takes {', '.join(STATIC_ROPE)})"
    return family_unsupported(model.config, "the cuda backend")


@dataclass
class _Bucket:
    """One KV cache's static buffers and graph: what a replay reads and writes."""

    flat: torch.Tensor  # [META_FIELDS * rows + rows * rows] int64 on the device: meta, then path
    staging: torch.Tensor  # flat's host copy (pinned on CUDA)
    rope: tuple[torch.Tensor, torch.Tensor]  # cos, sin [slot positions, head_dim]: read at each row's position
    copied: Any = None  # torch.cuda.Event after the last staging copy (staging is reused)
    logits: torch.Tensor | None = None  # [rows, vocab]: the replay's outputs (graph memory)
    choices: torch.Tensor | None = None  # [rows] int64
    graph: Any = None  # the torch.cuda.CUDAGraph, captured on the first pass
    outputs: tuple = ()  # its logits and choices


class CudaForward(Forward):
    """The fixed-shape backend behind the Forward protocol (module docstring)."""

    name = "cuda"
    asynchronous = True
    prefill_exact = True  # a replayed prefill row is a decode step
    min_rows = 1  # every pass runs the bucket: one row costs what the bucket costs

    def __init__(self, model: Any, settings: CudaSettings | None = None, *, graphs: bool | None = None) -> None:
        why = unsupported(model)
        assert why is None, why  # select.py checks first
        settings = settings or CudaSettings.checked()  # CODESPEC_CUDA_* (forward/cuda/settings.py)
        self.model = model
        self.config, self.generation_config = model.config, getattr(model, "generation_config", None)
        embed = model.get_input_embeddings().weight
        self.device, self.kv_dtype = embed.device, embed.dtype
        self.rows = settings.rows
        self.max_tail = self.rows  # a row's off-chain path fills at most a row of the [rows, rows] path table
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.warm_up_pass = self.graphs  # the engine runs a step at start-up: compilation, the graph's capture
        _, self.kv_heads, self.head_dim = kv_dims(model.config)
        self.heads = model.config.num_attention_heads
        # each KV cache's buffers and graph (a graph holds the cache's addresses: it goes with it)
        self._buckets: weakref.WeakKeyDictionary[Any, _Bucket] = weakref.WeakKeyDictionary()
        # each KV cache's plain step queued behind the last pass (forward/cuda/chained.py)
        self._chained: weakref.WeakKeyDictionary[Any, Chained] = weakref.WeakKeyDictionary()
        self.chains_steps = settings.chain  # the verifier asks for it where every next pass is a plain step
        self.chained_taken = self.chained_dropped = 0  # queued steps the engine asked for, and the others
        self.pdl = launches_pdl(settings.pdl, self.device)
        self._layers = [LayerWeights.of(layer) for layer in model.model.layers]
        # The products run as cuBLAS's and the work between them as small functions fused
        # by torch.compile on CUDA (one compilation serves every layer): as first written,
        # a step of the default model ran ~800 small kernels, 14x the time its weights
        # take to read. Each residual add is fused with the norm after it: left beside a
        # product, inductor folded it into cuBLAS's epilogue, which copied the residual
        # first (two extra kernels a layer). Everything has the bucket's fixed shapes, so
        # rows stay exact.
        compile = self.graphs and settings.compile
        self._add_norm = torch.compile(add_norm, dynamic=False) if compile else add_norm
        self._gated = torch.compile(gated, dynamic=False) if compile else gated
        # What a pass runs, for the machine profile's key: a cost curve measured with one
        # layout must not price another's passes (profile_key).
        self._kernels = {"rows": self.rows, "graphs": self.graphs, "compile": compile, "pdl": self.pdl}

    # -- the Forward protocol --------------------------------------------------------------
    def probe(self, stored: tuple[int, bool] | None) -> tuple[int, bool]:
        return self.rows, False  # nothing to measure: exact by layout; the bucket is the row block

    def profile_key(self) -> dict[str, str]:
        key = profile.torch_key(self.model, self.name)
        key["layout"] += "".join(f",{name}={value}" for name, value in self._kernels.items())
        return key

    @torch.inference_mode()
    def prefill(self, cache: Any, slot: int, prompt: Sequence[int], start: int) -> torch.Tensor:
        """The prompt's passes (cache.spans) as replays of the bucket: a chunk of 256
        tokens is 4 replays of the captured graph (~1.4 ms each on an H100), where an eager
        pass launched ~800 kernels from Python (~25 ms). Each row attends to the positions
        before it and itself, as a chain's rows do; later replays read the KV earlier ones
        wrote."""
        self._drop_chained(cache)  # the engine's batch changes: a queued step is not asked for
        last = None
        for begin, end in cache.spans(len(prompt), start):
            for bucket, n, _ in self._replays(cache, chain_rows(prompt, slot, begin, end)):
                last = bucket, n  # the last replay's last row is the prompt's
        assert last is not None, "nothing to prefill"
        bucket, n = last
        return bucket.logits[n - 1:n].clone()  # the next pass overwrites the replay's outputs

    @torch.inference_mode()
    def logits(self, cache: Any, requests: Requests) -> torch.Tensor:
        self._drop_chained(cache)
        outputs = [bucket.logits[:n].clone() for bucket, n, _ in self._passes(cache, requests)]
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    @torch.inference_mode()
    def choices(self, cache: Any, requests: Requests) -> list[int]:
        return self.launch(cache, requests)()

    @torch.inference_mode()
    def launch(self, cache: Any, requests: Requests, chain_next: bool = False) -> Callable[[], list[int]]:
        """The pass queued on the device; returns what waits for its choices (the pass's
        one sync), so the host can work meanwhile (engine/ahead.py). With `chain_next`
        (the engine says every request's next pass is a plain step) the step after this
        pass is queued behind it, its tokens this pass's choices copied on the device
        (forward/cuda/chained.py); when the engine then asks for that step, it is not run
        again, and the one after it is queued."""
        queued = self._chained.get(cache)
        rows = queued.rows_for(requests) if queued is not None else None
        if rows is not None:
            del self._chained[cache]
            self.chained_taken += 1
            collect, choices = queued.collect, queued.choices
            if rows != list(range(len(queued.slots))):  # requests ended since: the others' rows
                index = torch.tensor(rows)
                if choices.is_cuda:  # a pageable copy would wait for the queued step
                    index = index.pin_memory().to(choices.device, non_blocking=True)
                choices = choices.index_select(0, index)
                collect = Collect(choices)
        else:
            self._drop_chained(cache)
            picked = []
            for bucket, n, last in self._passes(cache, requests):
                # the next replay overwrites the outputs: keep a copy unless none follows
                picked.append(bucket.choices[:n] if last and not chain_next else bucket.choices[:n].clone())
            choices = picked[0] if len(picked) == 1 else torch.cat(picked)
            collect = Collect(choices)
        if chain_next and self.chains_steps and plain_steps(requests) and len(requests) <= self.rows and \
                all(start + 2 < cache.slot_tokens for _, start, _ in requests):
            self._chained[cache] = self._queue_step(cache, requests, collect, choices)
        return collect

    def _drop_chained(self, cache: Any) -> None:
        """Forget the step queued behind the last pass (its writes lie past the committed KV)."""
        if self._chained.pop(cache, None) is not None:
            self.chained_dropped += 1

    def _queue_step(self, cache: Any, requests: Requests, fed_from: Collect, choices: torch.Tensor) -> Chained:
        """The plain step after `requests`' plain pass, its tokens `choices` (on the device)."""
        slots, starts = next_starts(requests)
        k = len(slots)
        queued = None
        for bucket, n, _ in self._replays(cache, step_rows(slots, starts), tokens=lambda flat: flat[:k].copy_(choices)):
            queued = bucket.choices[:n].clone()
        return Chained(slots, starts, fed_from, queued)

    def argmax(self, logits: torch.Tensor) -> list[int]:
        return torch.argmax(logits, dim=-1).tolist()  # the first maximum, as the replay's choices

    def tensor(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def keep(self, cache: Any, moves: Moves) -> None:
        self._drop_chained(cache)
        keep_paths(cache.keys, cache.values, moves)

    # -- verify passes and decode steps: the bucket ----------------------------------------
    def _passes(self, cache: Any, requests: Requests):
        return self._replays(cache, tree_rows(requests))

    def _replays(self, cache: Any, rows: PassRows, tokens: Callable[[torch.Tensor], Any] | None = None):
        """Run a pass's rows (passlayout.py) as replays of `self.rows` rows each; yields
        (bucket, real rows, whether it is the last) after each replay (its outputs are
        overwritten by the next one). `tokens` writes a one-replay pass's tokens into the
        metadata on the device, after its copy from the host (a queued step's)."""
        bucket = self._bucket(cache)
        for first in range(0, len(rows), self.rows):
            if bucket.copied is not None:
                bucket.copied.synchronize()  # the last copy out of staging is done
            n = fill_staging(bucket.staging.numpy(), rows, first, self.rows)
            bucket.flat.copy_(bucket.staging, non_blocking=True)
            if self.device.type == "cuda":
                bucket.copied = torch.cuda.Event()
                bucket.copied.record()
            if tokens is not None:
                tokens(bucket.flat)  # the ids lead the metadata (passlayout.META_FIELDS)
            self._replay(cache, bucket)
            yield bucket, n, first + self.rows >= len(rows)

    def _bucket(self, cache: Any) -> _Bucket:
        bucket = self._buckets.get(cache)
        if bucket is None:
            rows = self.rows
            size = META_FIELDS * rows + rows * rows
            flat = torch.zeros(size, dtype=torch.int64, device=self.device)
            staging = torch.zeros(size, dtype=torch.int64, pin_memory=self.device.type == "cuda")
            bucket = _Bucket(flat, staging, self._rope_table(cache.slot_tokens))
            self._buckets[cache] = bucket
        return bucket

    def _rope_table(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary's cos and sin for every position of a slot, computed once per KV cache by
        the model's own module: a pass reads its rows' (rope_store's `positions`) instead
        of running ~9 small kernels of transformers' rotary each time."""
        return rotary_table(self.model.model, positions, self.model.get_input_embeddings().weight[:0])

    def _replay(self, cache: Any, bucket: _Bucket) -> None:
        """One replay of the bucket's graph, captured on its first replay."""
        args = (bucket.flat, cache.keys, cache.values, bucket.rope)
        if not self.graphs:
            bucket.logits, bucket.choices = self._rows_forward(*args)
            return
        if bucket.graph is None:
            bucket.graph, bucket.outputs = self._capture(args)
        bucket.logits, bucket.choices = bucket.outputs
        bucket.graph.replay()

    def _capture(self, args: tuple[Any, ...]) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """A CUDA graph of _rows_forward(*args) and its outputs (graph memory). Warmed up on
        a side stream first (compilation, Triton, cuBLAS's kernel choice); both runs use
        this very pass's metadata: they write the same KV to the same places as the replay
        that follows."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._rows_forward(*args)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = self._rows_forward(*args)
        return graph, outputs

    def _rows_forward(self, flat: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                      rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's pass over the static metadata `flat` and the cache's per-layer
        keys and values ([slots, kv_heads, positions, dim] each), rotary's tables `rope`:
        logits [rows, vocab] and choices [rows]."""
        rows = self.rows
        ids, positions, write_slots, write_positions, source, slots, context, path_len = \
            flat[: META_FIELDS * rows].view(META_FIELDS, rows)
        path = flat[META_FIELDS * rows:].view(rows, rows)
        cos, sin = rope

        def attend(index: int, layer: Any, q: torch.Tensor) -> torch.Tensor:
            """Each row over its own keys (q rotated, the pass's K and V stored): [rows, hidden]."""
            return row_attention(q.view(rows, self.heads, -1), keys[index], values[index], slots=slots,
                                 context=context, path=path, path_len=path_len, scale=layer.self_attn.scaling,
                                 pdl=self.pdl).view(rows, -1)

        def rope_of(index: int) -> Rope:
            """Rotary and the KV store of layer `index` (rope_store's arguments)."""
            return Rope(cos, sin, positions, source, write_slots, write_positions, keys[index], values[index],
                        self.heads, self.kv_heads)

        return layers_pass(self.model, self._layers, ids, attend, rope_of, self._add_norm, self._gated,
                           (context, path_len), self.pdl)
