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
* attention goes through kernels/row_attention.py: one program per (row, KV head)
  reducing over the row's own logical keys in fixed blocks;
* padding rows repeat the first row's token, position and KV write (same values to the
  same place; the Triton kernels skip rows that hold no token, so on a GPU they store
  nothing, and the fused products leave their outputs undefined) and attend to nothing.

On a GPU a padded row is nearly free: a step reads every weight once either way (the
default model: ~1 GB per pass, ~0.3 ms at H100 bandwidth; 64 rows add ~64 GFLOP, ~0.1 ms
at its bf16 rate). The bucket is also the controller's row block: a pass costs the same
up to `rows` rows and one more replay per bucket after that (CostModel.block).

Fast: the bucket's pass is captured once per KV cache as a CUDA graph (static metadata
buffers, KV written in place in the SlotCache's preallocated slots, no host sync inside),
so a step is one small host-to-device copy, one replay and, for greedy passes, one copy
of the rows' choices back. A prefill runs through the same graph: a pass's tokens are a
chain's rows, replayed `rows` at a time (CODESPEC_CUDA_PREFILL=eager: eager passes with
causal SDPA instead, ~25 ms each on an H100 against ~1.4 ms a replay). A prefill only
needs to be deterministic per pass (kvcache.spans); on a GPU the last chunk is one pass.

With `fused` (CODESPEC_CUDA_FUSED=1) the products carry the work around them
(kernels/row_linear.py: the norm before q/k/v and gate/up, from the sums of squares the
product before left; rotary and the K/V store in q/k/v's epilogue; SiLU in gate/up's; the
residual add after o and down; the greedy choices in lm_head's) and nothing is compiled:
six launches a layer with CODESPEC_CUDA_REDUCE=fold (eight with q/k/v's and down's
reduce launches), in programs of CODESPEC_CUDA_TILE_ROWS rows (CODESPEC_CUDA_ROW_GROUP of
such blocks a program, each weight tile loaded once for them). On Hopper our kernels
launch as programmatic dependents (CODESPEC_CUDA_PDL, kernels/_triton_pdl.py): each
starts while the one before ends (a step 1-5% faster on an H100, two runs on 2026-11-27).

On a CPU the same code runs eagerly with the attention's torch reference: that is how
the tests check the layout (float64 tiny models; TRITON_INTERPRET=1 for the kernel).

    forward = CudaForward(model)              # a transformers Qwen2/Llama model on CUDA
    logits = forward.prefill(cache, slot, prompt, 0)
    choices = forward.choices(cache, [(slot, start, tree)])
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from codespec.errors import SettingError
from codespec.forward import profile
from codespec.forward.base import Moves, Requests, kv_dims
from codespec.forward.chained import Chained, Collect, next_starts, plain_steps, step_rows
from codespec.forward.cuda_fused import full_logits, fused_layers, layout_tiles, screen_of
from codespec.forward.cuda_layers import (LayerWeights, add_norm, eager_prefill_chunk, gated, rotary_table,
                                          unfused_layers)
from codespec.forward.cuda_settings import CudaSettings, is_hopper, require_hopper
from codespec.forward.passlayout import CONTEXT, META_FIELDS, PATH_LEN, PassRows, chain_rows, fill_staging, tree_rows
from codespec.kernels.compact import keep_paths
from codespec.kernels.flags import PassFlags
from codespec.kernels.row_attention import grouping_refused, row_attention
from codespec.kernels.row_linear import Config, Rope, row_linear
from codespec.kernels.trace import TakeTrace, Tracer

_log = logging.getLogger(__name__)


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


# The graphs' layouts (the tracer's names too): the bucket's own graph is None; the wide
# passes' (CODESPEC_CUDA_PASS_ROW_GROUP) and the narrow steps' (CODESPEC_CUDA_NARROW_STEPS:
# the bucket's first tile_rows rows alone) have these.
WIDE = "wide passes"
NARROW = "narrow steps"


@dataclass
class _Bucket:
    """One KV cache's static buffers and graph: what a replay reads and writes."""

    flat: torch.Tensor  # [META_FIELDS * rows + rows * rows] int64 on the device: meta, then path
    staging: torch.Tensor  # flat's host copy (pinned on CUDA)
    rope: tuple[torch.Tensor, torch.Tensor]  # cos, sin [slot positions, head_dim]: read at each row's position
    copied: Any = None  # torch.cuda.Event after the last staging copy (staging is reused)
    logits: torch.Tensor | None = None  # [rows, vocab]: the replay's outputs (graph memory)
    choices: torch.Tensor | None = None  # [rows] int64
    normed: torch.Tensor | None = None  # behind lm_head's screen: its normed rows (logits: flagged blocks alone)
    layout: Any = None  # the last replay's graph
    # each layout's torch.cuda.CUDAGraph (None: the bucket's; WIDE, NARROW), captured on its
    # first pass, and its outputs
    graphs: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)


class CudaForward:
    """The fixed-shape backend behind the Forward protocol (module docstring)."""

    name = "cuda"
    exact = True
    min_rows = 1  # every pass runs the bucket: one row costs what the bucket costs

    def __init__(self, model: Any, *, rows: int | None = None, graphs: bool | None = None,
                 tiles: dict[str, Config] | None = None, fused: bool | None = None, pdl: str | None = None,
                 trace: bool = False) -> None:
        why = unsupported(model)
        assert why is None, why  # select.py checks first
        settings = CudaSettings.from_env()  # CODESPEC_CUDA_* (forward/cuda_settings.py): bad values fail here
        self.model = model
        self.config, self.generation_config = model.config, getattr(model, "generation_config", None)
        embed = model.get_input_embeddings().weight
        self.device, self.kv_dtype = embed.device, embed.dtype
        self.rows = rows or settings.rows
        self.max_tail = self.rows  # a row's off-chain path fills at most a row of the [rows, rows] path table
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.warm_up_pass = self.graphs  # the engine runs a step at start-up: compilation, the graph's capture
        _, self.kv_heads, self.head_dim = kv_dims(model.config)
        self.heads = model.config.num_attention_heads
        # each KV cache's buffers and graph (a graph holds the cache's addresses: it goes with it)
        self._buckets: weakref.WeakKeyDictionary[Any, _Bucket] = weakref.WeakKeyDictionary()
        # each KV cache's plain step queued behind the last pass (forward/chained.py)
        self._chained: weakref.WeakKeyDictionary[Any, Chained] = weakref.WeakKeyDictionary()
        self.chains_steps = settings.chain  # the verifier asks for it where every next pass is a plain step
        self.chained_taken = self.chained_dropped = 0  # queued steps the engine asked for, and the others
        self.attention = settings.attention  # attention's launch schedule (kernels/row_attention.py)
        self.key_block = settings.key_block  # ... and its logical keys per block (part of the bits)
        self.early_keys = settings.early_keys  # ... each program's first item begun before its wait
        self.attention_rows = settings.attention_rows  # ... or its rows in groups sharing their context's blocks
        refused = grouping_refused(self.attention_rows, self.attention, self.key_block, self.early_keys)
        if refused is not None:
            raise SettingError(f"CODESPEC_CUDA_ATTENTION_ROWS groups the worklist's or the fold's items (the fold's "
                               f"at 128-key blocks), without CODESPEC_CUDA_EARLY_KEYS ({refused}): unset one")
        self.early_rows = settings.early_rows  # the fused products' live rows read before their wait
        # the fold's counts, one per (row, KV head), left zero by every launch:
        # one buffer serves every layer (a layer's attention ends before the next one's starts)
        self._attention_counts = (torch.zeros(self.rows * self.kv_heads, dtype=torch.int32, device=self.device)
                                  if self.attention == "fold" else None)
        # Our kernels launched as programmatic dependents (kernels/_triton_pdl.py), the
        # fused products warming their own weights first with `prefetch`: CODESPEC_CUDA_PDL,
        # `auto` by default: launch on Hopper (the H100's step 0.95x without it, its bits
        # the same: scripts/gpu_step.py's pdl check on an H100), off on older GPUs and CPUs.
        self.pdl = pdl or settings.pdl
        if self.pdl == "auto":
            self.pdl = "launch" if is_hopper(self.device) else "off"
        elif self.pdl != "off":
            require_hopper(self.device, f"CODESPEC_CUDA_PDL={self.pdl} (programmatic dependent launch)", "unset it")
        # The products run as they are (cuBLAS, or row_linear's tiles where `tiles` names
        # one) and the work between them as small functions fused by torch.compile on
        # CUDA (one compilation serves every layer): as first written, a step of the
        # default model ran ~800 small kernels, 14x the time its weights take to read.
        # Each residual add is fused with the norm after it: left beside a product,
        # inductor folded it into cuBLAS's epilogue, which copied the residual first (two
        # extra kernels a layer). kernels/rope_store.py rotates q and k and stores K and V
        # in one launch. Everything has the bucket's fixed shapes, so rows stay exact.
        self.tiles = dict(tiles or {})
        # `fused` (CODESPEC_CUDA_FUSED=1): every product through row_linear with the work
        # around it in its prologue or epilogue, no compiled code: 6-8 launches a layer, not 11.
        self.fused = settings.fused if fused is None else fused
        # gate/up's rows interleaved for the fused layers' SiLU epilogue (row_linear `pairs`)
        self._layers = [LayerWeights.of(layer, pairs=self.fused) for layer in model.model.layers]
        self.tile_rows = settings.tile_rows  # rows a program of the fused products computes
        # CODESPEC_CUDA_REDUCE=fold: a split product summed by its last program, counting
        # in here (a block of 16 outputs and 16 rows at the least; every launch leaves it zero)
        widest = max(model.get_output_embeddings().weight.shape[0], 2 * model.config.intermediate_size)
        self._linear_counts = (torch.zeros(widest // 16 * max(1, self.rows // 16), dtype=torch.int32,
                                           device=self.device) if settings.reduce == "fold" else None)
        # the fused products' tiles for the bucket's graph, and where CODESPEC_CUDA_PASS_ROW_GROUP
        # or CODESPEC_CUDA_NARROW_STEPS asks, a wide pass's and a narrow step's graph's (else None)
        self.tiles, self.pass_tiles, self.narrow_tiles = layout_tiles(
            self.fused, settings, self._layers[0], model.lm_head.weight, self.tiles, self.rows, self.head_dim,
            self.kv_heads)
        # CODESPEC_CUDA_LM_SCREEN: lm_head's int8 screen (forward/cuda_fused.py; None: the full product)
        self.screen = screen_of(model, self.fused, self.tiles.get("lm_head")) if settings.lm_screen else None
        # the engine's start-up passes (engine._warm_up_pass): a step, and a pass wide
        # enough for the bucket's other graph where there is one
        two = self.pass_tiles is not None or self.narrow_tiles is not None
        self.warm_up_rows = (1, self.tile_rows + 1) if two else (1,)
        # `trace`: the fused layers' kernels write each program's time at each phase, for
        # scripts/gpu_trace.py's timeline of a step (kernels/trace.py); no setting: a probe's
        if trace and not self.fused:
            raise SettingError("tracing covers the fused layers' kernels alone: set CODESPEC_CUDA_FUSED=1")
        self.tracer = Tracer(self.device) if trace else None
        if self.pdl == "flags" and not self.fused:
            raise SettingError("CODESPEC_CUDA_PDL=flags counts the fused layers' launches (our kernels alone): set "
                               "CODESPEC_CUDA_FUSED=1")
        # `flags`: the kernels launch as with `prefetch`, and each launch of the fused
        # layers waits on the counts of the launch before (kernels/flags.py)
        self.flags = PassFlags(self.device) if self.pdl == "flags" else None
        if self.flags is not None:
            self.pdl = "prefetch"
        self.eager_prefill = settings.prefill == "eager"
        self.prefill_exact = not self.eager_prefill  # a replayed prefill row is a decode step
        compile = self.graphs and not self.fused and settings.compile
        self._add_norm = torch.compile(add_norm, dynamic=False) if compile else add_norm
        self._gated = torch.compile(gated, dynamic=False) if compile else gated
        # What a pass runs, for the machine profile's key: a cost curve measured with one
        # layout must not price another's passes (profile_key).
        self._kernels = {"rows": self.rows, "graphs": self.graphs, "fused": self.fused, "compile": compile,
                         "attention": self.attention, "key_block": self.key_block, "early_keys": self.early_keys,
                         "attention_rows": self.attention_rows,
                         "early_rows": self.early_rows,
                         "pdl": self.pdl,
                         "reduce": settings.reduce, "flags": self.flags is not None,
                         "tiles": ";".join(f"{name}:{tile}" for name, tile in sorted(self.tiles.items())),
                         "pass_row_group": settings.pass_row_group if self.pass_tiles is not None else 0,
                         "narrow_steps": self.narrow_tiles is not None, "lm_screen": self.screen is not None}

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
        wrote. CODESPEC_CUDA_PREFILL=eager runs the eager passes (causal SDPA) instead."""
        self._drop_chained(cache)  # the engine's batch changes: a queued step is not asked for
        if self.eager_prefill:
            hidden = None
            for begin, end in cache.spans(len(prompt), start):
                hidden = eager_prefill_chunk(self.model.model, self._layers, cache, slot, prompt[begin:end], begin,
                                             self._bucket(cache).rope, self.heads, self.kv_heads, self.head_dim)
            assert hidden is not None, "nothing to prefill"
            return self.model.lm_head(self.model.model.norm(hidden[-1:]))
        last = None
        for begin, end in cache.spans(len(prompt), start):
            for bucket, n, _ in self._replays(cache, chain_rows(prompt, slot, begin, end)):
                last = bucket, n  # the last replay's last row is the prompt's
        assert last is not None, "nothing to prefill"
        bucket, n = last
        return self._logits(bucket, n, last_only=True).clone()  # the next pass overwrites the replay's outputs

    @torch.inference_mode()
    def logits(self, cache: Any, requests: Requests) -> torch.Tensor:
        self._drop_chained(cache)
        outputs = [self._logits(bucket, n).clone() for bucket, n, _ in self._passes(cache, requests)]
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
        (forward/chained.py); when the engine then asks for that step, it is not run
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
            self._replay(cache, bucket, self.layout(n))
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

    def layout(self, rows: int) -> Any:
        """The graph a replay of `rows` real rows takes: NARROW (CODESPEC_CUDA_NARROW_STEPS)
        where they fit a block of tile_rows, WIDE (CODESPEC_CUDA_PASS_ROW_GROUP) where they
        do not, else the bucket's own (None). The same bits in each: every fused kernel
        computes a row from that row alone."""
        if self.narrow_tiles is not None and rows <= self.tile_rows:
            return NARROW
        if self.pass_tiles is not None and rows > self.tile_rows:
            return WIDE
        return None

    def _replay(self, cache: Any, bucket: _Bucket, layout: Any = None) -> None:
        """One replay of the bucket's graph of `layout` (`layout()`), captured on its first
        replay."""
        args = (bucket.flat, cache.keys, cache.values, bucket.rope, layout)
        bucket.layout = layout
        if not self.graphs:
            bucket.logits, bucket.choices, bucket.normed = self._rows_forward(*args)
            return
        graph = bucket.graphs.get(layout)
        if graph is None:
            graph, bucket.outputs[layout] = self._capture(args)
            bucket.graphs[layout] = graph
        bucket.logits, bucket.choices, bucket.normed = bucket.outputs[layout]
        graph.replay()

    def _logits(self, bucket: _Bucket, n: int, last_only: bool = False) -> torch.Tensor:
        """The first `n` rows' logits of the bucket's last replay (`last_only`: the n-th
        row's alone, a prefill's): its outputs, or behind lm_head's screen (whose product
        computed the flagged blocks alone) the full product over the replay's normed rows,
        by the same tile: the same bits."""
        first = n - 1 if last_only else 0
        if bucket.normed is None:
            return bucket.logits[first:n]
        rows = bucket.normed.shape[0]
        meta = bucket.flat[: META_FIELDS * self.rows].view(META_FIELDS, self.rows)
        context, path_len = meta[CONTEXT, :rows], meta[PATH_LEN, :rows]
        if last_only:  # the other rows left out: only the block of rows holding this one computes
            wanted = torch.arange(rows, device=context.device) == first
            context, path_len = context * wanted, path_len * wanted
        return full_logits(self.model, bucket.normed, self._layout_tiles(bucket.layout)["lm_head"],
                           (context, path_len))[first:n]

    def _layout_tiles(self, layout: Any) -> dict[str, Config]:
        return self.pass_tiles if layout == WIDE else self.narrow_tiles if layout == NARROW else self.tiles

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
                      rope: tuple[torch.Tensor, torch.Tensor],
                      layout: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The bucket's pass over the static metadata `flat` and the cache's per-layer
        keys and values ([slots, kv_heads, positions, dim] each), rotary's tables `rope`,
        in the graph of `layout` (its fused tiles; NARROW: the bucket's first tile_rows
        rows alone): logits [rows, vocab], choices [rows], and behind lm_head's screen
        its normed rows (else None)."""
        bucket = self.rows
        rows = self.tile_rows if layout == NARROW else bucket
        ids, positions, write_slots, write_positions, source, slots, context, path_len = \
            flat[: META_FIELDS * bucket].view(META_FIELDS, bucket)[:, :rows]
        path = flat[META_FIELDS * bucket:].view(bucket, bucket)[:rows]
        cos, sin = rope
        pdl, live = self.pdl != "off", (context, path_len)  # the rows that hold a token
        if self.tracer is not None:  # another graph launches other programs: its own regions
            self.tracer.begin(layout)
        flags = None
        if self.flags is not None:
            self.flags.begin()  # the counts zeroed: in the CUDA graph, a memset before the first launch
            flags = self.flags.take

        def attend(index: int, layer: Any, q: torch.Tensor) -> torch.Tensor:
            """Each row over its own keys (q rotated, the pass's K and V stored): [rows, hidden]."""
            return row_attention(q.view(rows, self.heads, -1), keys[index], values[index], slots=slots,
                                 context=context, path=path, path_len=path_len, scale=layer.self_attn.scaling,
                                 schedule=self.attention, key_block=self.key_block, pdl=pdl, early=self.early_keys,
                                 item_rows=self.attention_rows,
                                 counts=self._attention_counts, trace=self._trace("attention", index),
                                 flags=flags).view(rows, -1)

        def rope_of(index: int) -> Rope:
            """Rotary and the KV store of layer `index` (rope_store's arguments)."""
            return Rope(cos, sin, positions, source, write_slots, write_positions, keys[index], values[index],
                        self.heads, self.kv_heads)

        if self.fused:  # forward/cuda_fused.py
            linear = dict(live=live, pdl=self.pdl, counts=self._linear_counts, flags=flags,
                          early_rows=self.early_rows)
            return fused_layers(self.model, self._layers, self._layout_tiles(layout), ids, attend, rope_of, linear,
                                self._trace, self.screen)
        return unfused_layers(self.model, self._layers, ids, attend, rope_of, self._product, self._add_norm,
                              self._gated, live, pdl)

    def _trace(self, kind: str, index: int | None = None) -> TakeTrace | None:
        """Where a traced pass's launch of `kind` (in layer `index`) takes its region."""
        return self.tracer.launches(kind, index) if self.tracer is not None else None

    def _product(self, name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 live: tuple[torch.Tensor, torch.Tensor] | None = None,
                 choices: torch.Tensor | None = None) -> torch.Tensor:
        """x @ weight.T (+ bias): row_linear's tiles where `tiles` names some for this
        product and they fit its shape (the `live` rows alone), else F.linear (cuBLAS on
        CUDA). `choices`: written with each row's argmax (the first maximum), from the
        tiles' epilogue or an argmax pass after cuBLAS."""
        tiles = self.tiles.get(name)
        if tiles is not None and tiles.fits(x.shape[0], weight.shape[0], x.shape[1]):
            return row_linear(x, weight, bias, config=tiles, live=live, pdl=self.pdl, counts=self._linear_counts,
                              choices=choices, early_rows=self.early_rows)
        y = F.linear(x, weight, bias)
        if choices is not None:
            torch.argmax(y, dim=-1, out=choices)
        return y
