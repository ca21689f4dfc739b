"""The cuda backend's settings, `CODESPEC_CUDA_*` environment variables (a field `tile_rows`
is `CODESPEC_CUDA_TILE_ROWS`), each described on its field below; read once per backend
(forward/cuda.py) and checked there: a bad value is one clear line at start-up. They
stay out of the CLI's flags: they choose among kernel layouts measured on a GPU
(docs/gpu.md), not what a user asks of a request.

>>> CudaSettings.from_env({"CODESPEC_CUDA_ROWS": "32"}).rows
32
"""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from codespec.errors import SettingError

PREFIX = "CODESPEC_CUDA_"
# Settings that lost on a GPU and were taken out: one that is still set stops the
# backend with the reason, rather than being ignored.
REMOVED = {"EARLY": "reading the pass's metadata and the residual sooner made the H200's step "
                    "slower, and its bits were another layout's reduction, not a stale read"}


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
    if device.type != "cuda" or is_hopper(device):
        return
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    raise SettingError(f"{setting} needs a GPU of compute capability 9.0 or later (Hopper); this one is "
                       f"{major}.{minor}: {remedy}")


class CudaSettings(BaseSettings):
    """The cuda backend's kernel layout; defaults are what the H100 runs measured fastest
    with every row exact (docs/decisions.md)."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="ignore", env_ignore_empty=True, frozen=True)

    rows: int = Field(64, ge=1, le=1024, description="The bucket: rows of every replay (a pass of more rows is "
                      "several replays).")
    prefill: Literal["bucket", "eager"] = Field(
        "bucket", description="Prompts as replays of the bucket, or eager passes with causal SDPA.")
    fused: bool = Field(False, description="Every product through row_linear with the work around it in its "
                        "prologue or epilogue: six launches a layer with reduce=fold, eight without (exact; on "
                        "an H100 (2026-11-27) with tile_rows=16, pdl=prefetch and both folds a step 1.19 against "
                        "1.41 ms, but a 32-row pass 1.40 steps).")
    compile: bool = Field(True, description="The norms and SiLU compiled by torch.compile.")
    attention: Literal["worklist", "grid", "fold"] = Field(
        "worklist", description="Attention's launch schedule (kernels/row_attention.py): worklist and grid give the "
                                "same bits; fold combines in the same launch (other bits, still each row's own).")
    key_block: Literal[64, 128] = Field(
        128, description="Logical keys per attention block (kernels/row_attention.py): part of every row's "
        "summation order, so of its bits (still each row's own). Attention alone at 512 keys, worklist, CUDA "
        "graphs: 64-key blocks 6.6-6.8 against 8.2-8.4 us a layer on every H100 and H200 run; "
        "in a step and a pass not yet timed.")
    early_keys: bool = Field(
        False, description="Attention (worklist, fold) begins each program's first item before it waits for "
        "q/k/v: the pass's metadata, and the keys and values a replay cannot have written (kernels/row_attention.py). "
        "The same values into the same arithmetic: the same bits. An H200 trace (2026-11-28) put the fold's last "
        "program at 8.2 us a layer after its wait, ~6 dependent round trips; this takes three off. Not yet timed "
        "on a GPU.")
    attention_rows: Literal[1, 2, 4] = Field(
        1, description="Attention (worklist, fold at 128-key blocks; not with early_keys) in groups of this many "
        "consecutive rows: the key blocks wholly in the context of each row of a group, all of one slot, loaded "
        "once and each row's partial computed from them in turn (kernels/row_attention.py). The same values into "
        "the same arithmetic: the same bits. For the pass bar: an H200's 32-row pass spent 14.4 us a layer in "
        "attention against a step's 8.9, its 320 items two rounds of the wave. Not yet timed on a GPU.")
    early_rows: bool = Field(
        False, description="The fused products read which of their rows hold a token before they wait for the "
        "kernel before (the pass's metadata, the host's copy), not after: one round trip off each product's chain, "
        "the same bits. An earlier `early` also read the residual early, which changed the epilogue's layout "
        "and its bits (removed); this is its metadata half alone. Not yet timed.")
    chain: bool = Field(True, description="Plain steps queued one ahead on the device (forward/chained.py).")
    pdl: Literal["auto", "off", "launch", "prefetch", "flags"] = Field(
        "auto", description="Our kernels launched as programmatic dependents (sm_90+; 'auto': 'launch' there, "
        "'off' before); 'prefetch': the fused products also warm their own weights into L2 first; 'flags': "
        "'prefetch', each launch of the fused layers waiting on a count the launch before's programs raise after "
        "their stores, not on its end (kernels/flags.py; an H200, 2026-11-28: the same bits, a step 10% "
        "slower).")
    tile_rows: Literal[64, 32, 16] = Field(
        64, description="Rows a program of the fused products computes (a step computes one such block, a "
        "pass several).")
    row_group: Literal[1, 2, 4] = Field(
        1, description="Blocks of tile_rows rows a fused program computes with each weight tile it loads (only "
        "those up to the last that holds a token; each block its own product, so the bits are a group of one's): a "
        "32-row pass in 16-row programs reads the weights once, not twice (an H200, 2026-11-28: the "
        "same bits, a step 8% slower, a 32-row pass 7% slower).")
    pass_row_group: Literal[0, 1, 2, 4] = Field(
        0, description="With the fused layers: passes of more than tile_rows rows replay a second graph whose "
        "products compute this many blocks of rows with each weight tile, while steps keep row_group's (a "
        "step's one block in a group of one's loop: an H200 (2026-11-28) timed a row group's step 8% slower, "
        "and 16-row programs' 32-row pass 1.31 steps, over the 1.3 bar). The same bits either way: a row "
        "group's are a group of one's (0: every pass takes row_group's graph). An H200: "
        "the same bits, and a 32-row pass's device time unchanged, 1.310 against 1.309 ms.")
    narrow_steps: bool = Field(
        False, description="With the fused layers: passes of up to tile_rows rows (a plain step, a short verify "
        "pass) replay a graph of the bucket's first tile_rows rows alone, not the whole bucket, so no product "
        "launches programs for blocks of padding rows (a step's 16-row programs leave three of four idle, lm_head's "
        "3,561 of 4,748). The same bits: every fused kernel computes a row from that row alone. Not "
        "yet timed on a GPU.")
    lm_screen: bool = Field(
        False, description="With the fused layers: lm_head's greedy choices through an int8 screen "
        "(kernels/lm_screen.py): the final norm's rows written once, every vocab block bounded from int8 weights "
        "(~half lm_head's bytes), and the exact product computing only the blocks that may hold a row's choice, so "
        "every choice is the full product's bits. Logits a request asks for (prefill's last row, sampling, "
        "logprobs) come from the full product over the same normed rows, outside the graph. Needs bf16 or float16 "
        "weights on a GPU and an lm_head without bias; +~137 MB for the int8 copy. Not yet timed on a "
        "GPU (an H200 trace: lm_head 87 us of a 0.94 ms step, its int8 bytes ~30 us).")
    reduce: Literal["launch", "fold"] = Field(
        "launch", description="A split product's sum (row_linear's products): a second launch, or its last "
        "program.")

    @field_validator("tile_rows", "row_group", "pass_row_group", "key_block", "attention_rows", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        return int(value) if isinstance(value, str) and value.isdigit() else value  # the environment's text

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CudaSettings:
        """The settings `env` (default: this process's environment) sets, the rest default;
        a bad value raises SettingError naming the variable."""
        env = os.environ if env is None else env
        for name, why in REMOVED.items():
            if env.get(PREFIX + name):
                raise SettingError(f"{PREFIX}{name} is gone ({why}); unset it")
        values = {name: env[PREFIX + name.upper()] for name in cls.model_fields if env.get(PREFIX + name.upper())}
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            first = error.errors()[0]
            name = PREFIX + str(first["loc"][0]).upper()
            raise SettingError(f"{name}={values[str(first['loc'][0])]!r}: {first['msg'].lower()}") from None
