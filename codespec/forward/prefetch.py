"""The cuda backend's weights warmed into L2 while its pass runs (kernels/l2_prefetch.py).

A side stream, forked from the pass at fixed points and joined at its end (inside the
CUDA graph: parallel branches of it), warms what the next products will read:

* at layer i's start (its norm, q/k/v, rotary, attention and o still to run, ~25 us of
  latency-bound kernels on an H100): layer i's gate/up and down weights (~25 MB of the
  default model's ~28 MB a layer); at layer 0 also its own q/k/v and o;
* at layer i's MLP (gate/up, SiLU, down: ~15 us): layer i+1's q/k/v and o.

The side stream waits for the pass to reach each point before it warms that window, so
it never runs a layer ahead and L2 (50 MB on an H100) holds one layer's weights at a
time. lm_head (260 MB) does not fit and is left alone. CODESPEC_CUDA_PREFETCH picks the
mode (off by default until the GPU check's `step` stage shows it pays),
CODESPEC_CUDA_PREFETCH_PROGRAMS the programs of each launch (32 by default: few enough
to leave the pass's own kernels most of the SMs; forward/cuda_settings.py)."""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from codespec.errors import SettingError
from codespec.forward.cuda_settings import require_hopper
from codespec.kernels.l2_prefetch import MODES, l2_prefetch


def plan(layers: int) -> dict[tuple[str, int], list[tuple[int, str]]]:
    """(point, layer) -> the (layer, weight) pairs warmed there, in the order they are read."""
    windows: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for i in range(layers):
        first = [(0, "qkv"), (0, "o")] if i == 0 else []
        windows[("layer", i)] = first + [(i, "gate_up"), (i, "down")]
        if i + 1 < layers:
            windows[("mlp", i)] = [(i + 1, "qkv"), (i + 1, "o")]
    return windows


class Prefetcher:
    """Forks the warming of each window from the current stream (module docstring)."""

    def __init__(self, layers: Sequence[Any], mode: str, programs: int, device: torch.device,
                 force_triton: bool | None = None) -> None:
        if mode not in MODES:
            raise SettingError(f"prefetch mode {mode!r}: expected one of {', '.join(MODES)}")
        if mode == "bulk":
            require_hopper(device, "CODESPEC_CUDA_PREFETCH=bulk (Hopper's bulk prefetch)", "use sector")
        self.mode, self.programs = mode, programs
        self.windows = {point: [getattr(layers[layer], name) for layer, name in pairs]
                        for point, pairs in plan(len(layers)).items()}
        self.sink = torch.zeros(programs, dtype=torch.int32, device=device)
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.force_triton = force_triton  # tests: the interpreter's kernel on CPU tensors
        self.launches = 0

    def at(self, point: str, layer: int) -> None:
        tensors = self.windows.get((point, layer))
        if not tensors:
            return
        if self.side is not None:
            self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
            l2_prefetch(tensors, self.sink, mode=self.mode, force_triton=self.force_triton)
        self.launches += 1

    def join(self) -> None:
        """The pass's stream waits for the side stream (a graph's capture must end joined)."""
        if self.side is not None:
            torch.cuda.current_stream().wait_stream(self.side)


class NoPrefetch:
    """The default: nothing warmed."""

    mode = "off"

    def at(self, point: str, layer: int) -> None:
        pass

    def join(self) -> None:
        pass
