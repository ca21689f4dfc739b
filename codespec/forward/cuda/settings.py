"""The cuda backend's settings: `Settings.cuda` (codespec/settings.py), from
`CODESPEC_CUDA_*` environment variables (a field `rows` is `CODESPEC_CUDA_ROWS`). They
stay out of the CLI's flags: they shape how the passes run on a GPU, not what a user
asks of a request. Every value keeps each row computed from that row alone (lossless).

>>> CudaSettings(rows=32).rows
32
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from codespec.errors import SettingError, error_line


class CudaSettings(BaseSettings):
    """The cuda backend's layout; the defaults are what the H100 and H200 runs measured
    fastest with every row exact (docs/gpu.md)."""

    model_config = SettingsConfigDict(env_prefix="CODESPEC_CUDA_", extra="ignore", env_ignore_empty=True,
                                      frozen=True)

    rows: int = Field(64, ge=1, le=1024, description="Rows of every replay of the pass's CUDA graph (the bucket): "
                      "a pass of more rows is several replays, and the controller prices passes in these blocks.")
    compile: bool = Field(True, description="The norms, residual adds and SiLU compiled by torch.compile (off: "
                          "eager, slower; for a machine where inductor cannot build).")
    chain: bool = Field(True, description="A plain greedy step queued on the device behind the pass before it, "
                        "its tokens that pass's choices (forward/cuda/chained.py): plain decoding 1.21 against 1.42 "
                        "ms a token on an H100, 1.12 against 1.57 on an H200.")
    pdl: Literal["auto", "on", "off"] = Field(
        "auto", description="Our Triton kernels launched as programmatic dependents, each starting while the one "
        "before ends (sm_90+; auto: on there, off before; an H100's step 5% faster, the same bits).")

    @classmethod
    def checked(cls, **values: Any) -> CudaSettings:
        """`values` over the CODESPEC_CUDA_* environment; a bad value is a SettingError
        naming the variable, one line at start-up."""
        try:
            return cls(**values)
        except ValidationError as error:
            raise SettingError(error_line(error, prefix="CODESPEC_CUDA_")) from None


def launches_pdl(setting: str, device: Any) -> bool:
    """Whether the kernels launch as programmatic dependents (forward/cuda/_pdl.py) on
    `device`: `auto` where it is Hopper (compute capability 9.0) or later; `on` there too,
    else a clear error at start-up."""
    if setting == "off" or device.type != "cuda":
        return False
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= (9, 0):
        return True
    if setting == "on":
        raise SettingError(f"CODESPEC_CUDA_PDL=on needs a GPU of compute capability 9.0 or later (Hopper); this one "
                           f"is {major}.{minor}: unset it")
    return False
