"""The cuda backend's settings, read from the environment once per backend
(forward/cuda.py) and checked there: a bad value is one clear line at start-up.

    setting                         values (default first)  what it does
    CODESPEC_CUDA_ROWS              64, 1..1024             the bucket: rows of every replay (a pass of more
                                                            rows is several replays)
    CODESPEC_CUDA_PREFILL           bucket, eager           prompts as replays of the bucket, or eager passes
    CODESPEC_CUDA_FUSED             0, 1                    every product through row_linear with its norm,
                                                            SiLU and residual inside (slower on the H100)
    CODESPEC_CUDA_COMPILE           1, 0                    the norms and SiLU compiled by torch.compile
    CODESPEC_CUDA_ATTENTION         worklist, grid          attention's launch schedule (kernels/row_attention.py)
    CODESPEC_CUDA_CHAIN             1, 0                    plain steps queued one ahead (forward/chained.py)
    CODESPEC_CUDA_PDL               auto, off, launch,      our kernels launched as programmatic dependents
                                    prefetch                (sm_90+; auto: launch there, off before), the
                                                            fused products warming their own weights first
    CODESPEC_CUDA_TILE_ROWS         64, 32, 16              rows a program of the fused products computes (a
                                                            step computes one such block, a pass several)
    CODESPEC_CUDA_REDUCE            launch, fold            a split product's sum: a second launch, or its
                                                            last program (row_linear's products)

>>> CudaSettings.from_env({"CODESPEC_CUDA_ROWS": "32"}).rows
32
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from codespec.errors import SettingError

CHOICES = {"prefill": ("bucket", "eager"), "fused": ("0", "1"), "compile": ("1", "0"),
           "attention": ("worklist", "grid"), "chain": ("1", "0"), "pdl": ("auto", "off", "launch", "prefetch"),
           "tile_rows": ("64", "32", "16"), "reduce": ("launch", "fold")}
RANGES = {"rows": (64, 1, 1024)}  # default, least, most


def is_hopper(device: Any) -> bool:
    """Whether `device` is a GPU of compute capability 9.0 or later (programmatic
    dependent launch, kernels/_triton_pdl.py)."""
    if device.type != "cuda":
        return False
    import torch

    return torch.cuda.get_device_capability(device) >= (9, 0)


def require_hopper(device: Any, setting: str, remedy: str) -> None:
    """A clear error at start-up where `setting` needs sm_90 (Hopper) or later and
    `device` is an older GPU (a CPU device: nothing to check, the kernels do not run)."""
    if device.type != "cuda":
        return
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (9, 0):
        raise SettingError(f"{setting} needs a GPU of compute capability 9.0 or later (Hopper); this one is "
                           f"{major}.{minor}: {remedy}")


@dataclass(frozen=True)
class CudaSettings:
    rows: int = 64
    prefill: str = "bucket"
    fused: bool = False
    compile: bool = True
    attention: str = "worklist"
    chain: bool = True
    pdl: str = "auto"
    tile_rows: int = 64
    reduce: str = "launch"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CudaSettings:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name, choices in CHOICES.items():
            raw = env.get(f"CODESPEC_CUDA_{name.upper()}", "") or choices[0]
            if raw not in choices:
                raise SettingError(f"CODESPEC_CUDA_{name.upper()}={raw!r}: expected one of {', '.join(choices)}")
            values[name] = raw == "1" if choices[0] in ("0", "1") else int(raw) if raw.isdigit() else raw
        for name, (default, least, most) in RANGES.items():
            raw = env.get(f"CODESPEC_CUDA_{name.upper()}", "") or str(default)
            if not raw.isdigit() or not least <= int(raw) <= most:
                raise SettingError(f"CODESPEC_CUDA_{name.upper()}={raw!r}: expected a whole number from {least} "
                                   f"to {most}")
            values[name] = int(raw)
        return cls(**values)
