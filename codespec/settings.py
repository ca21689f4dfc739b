"""One source of configuration: `CODESPEC_*` environment variables and CLI flags.

Every field carries a description; the CLI builds its flags and `--help` from these
fields (see `codespec.cli.options`), so a setting is documented in exactly one place.

>>> Settings(max_draft_tokens=8).max_draft_tokens
8
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from codespec.errors import SettingError, error_line
from codespec.forward.cuda.settings import CudaSettings

DType = Literal["auto", "float32", "bfloat16", "float16", "float64"]
Device = Literal["auto", "cpu", "cuda"]


def default_cache_dir() -> Path:
    """XDG cache directory for prepared models: `$XDG_CACHE_HOME/codespec` or `~/.cache/codespec`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "codespec"


class Settings(BaseSettings):
    """codespec's settings; each can be set as `CODESPEC_<NAME>` or as a CLI flag."""

    model_config = SettingsConfigDict(env_prefix="CODESPEC_", extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):  # type: ignore[no-untyped-def]
        """Flags > CODESPEC_* env > the TOML file named by CODESPEC_CONFIG > defaults."""
        from pydantic_settings import TomlConfigSettingsSource

        sources = [init_settings, env_settings]
        config = settings_cls.model_config.get("toml_file") or os.environ.get("CODESPEC_CONFIG")
        if config:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config))
        return tuple(sources)

    model: str = Field(
        "default",
        description="Model: 'default' (the embedded Qwen2.5-Coder-0.5B-Instruct), "
        "a local Hugging Face model directory, or a hub id when a hub is reachable.",
    )
    dtype: DType = Field(
        "auto",
        description="Weights and compute dtype. 'auto' is bfloat16 on CPU (verify passes "
        "scale better than float32 there; see docs/decisions.md) and on CUDA.",
    )
    device: Device = Field("auto", description="Where the model runs; 'auto' picks CUDA when present.")
    quantize: Literal["none", "int8"] = Field(
        "none",
        description="'int8': weight-only int8 for every linear layer and lm_head (half the bytes per "
        "decode step; the output is int8's, not bf16's). Speculation stays lossless against "
        "--no-spec with the same setting. Needs the C row decoder (CPU with AVX-512 BF16 or "
        "AVX2, bf16 Qwen2/Llama).",
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where prepared models are cached (default: $XDG_CACHE_HOME/codespec).",
    )
    threads: int = Field(
        0, ge=0, description="CPU threads for torch; 0 uses every core this process may use."
    )
    max_draft_tokens: int = Field(
        32, ge=0, le=256,
        description="Cap on draft tokens per request per verify pass (chain and tree policies draft "
        "up to k tokens for a k-token match; goodput drafts deeper where acceptance is calibrated high).",
    )
    draft_policy: Literal["chain", "tree", "goodput"] = Field(
        "goodput",
        description="Drafts per verify pass: 'chain' (k tokens for a k-token match), 'tree' (a token "
        "tree of up to max_draft_tokens nodes), 'goodput' (each request's best-scoring source's tree, "
        "pruned to maximise expected committed tokens per second; may draft nothing).",
    )
    min_match_tokens: int = Field(
        2, ge=1, le=64,
        description="Shortest suffix match of the context that may propose a draft (chain and tree "
        "policies; goodput prices every match by its calibrated acceptance instead).",
    )
    max_match_tokens: int = Field(
        64, ge=1, le=1024, description="Longest suffix of the context the matcher tries to match."
    )
    draft_model: str = Field(
        "none", description="A smaller model of the same tokenizer that drafts where the context and the "
        "index have nothing to copy (fill-in-the-middle, fresh code), priced by the goodput controller beside "
        "the verify pass: 'none', 'auto' (the packaged 0.5B under the packaged 1.5B, none under the 0.5B), a "
        "packaged model's name or a model directory. It costs its weights' memory and a prefill of "
        "draft_model_window tokens per request; on a 2-core CPU it saves passes but not time "
        "(docs/benchmarks.md), hence off by default.",
    )
    draft_model_window: int = Field(
        160, ge=16, le=4096, description="Prompt tokens the draft model reads: the prompt's tail, or for a "
        "fill-in-the-middle prompt the prefix's tail and the suffix's head (a fifth).",
    )
    look_ahead: Literal["auto", "on", "off"] = Field(
        "auto", description="Goodput policy: draft each request's next pass on a guess while a pass computes "
        "('auto': where the backend launches passes asynchronously, a GPU's).",
    )

    kv_cache_mb: int = Field(
        1024, ge=1, description="Memory for KV slots, in MiB: one slot per active request, the rest "
        "keep finished prompts for prefix reuse.",
    )
    kv_slot_tokens: int = Field(
        8192, ge=64, description="Tokens one KV slot holds (prompt + output); longer prompts are refused.",
    )
    prefill_chunk_tokens: int = Field(
        256, ge=16, le=4096, description="Prefill chunk; cached prompt prefixes are reused in whole chunks.",
    )

    # -- serving -------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="Address `codespec serve` binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port `codespec serve` listens on.")
    api_key: str = Field(
        "", description="Bearer token clients must send; required when binding to a non-loopback address."
    )
    index: str = Field("", description="A suffix index file to serve drafts from (built by `codespec index`).")
    repo: str = Field(
        ".", description="Repository to index at start-up (in the background) when no --index is given; "
        "'' for none.",
    )
    index_max_mb: int = Field(
        64, ge=1, description="Indexing a repository (--repo, a workspace, `codespec index`) stops once its files "
        "reach this many MiB, and says so; dependency, build and vendored folders and what .gitignore, .ignore "
        "and .codespecignore exclude are never read.",
    )
    upstream: str = Field(
        "", description="An OpenAI-compatible engine (vLLM, SGLang, ...) that generates for `codespec serve`: "
        "codespec's routes in front, prompts sent as --model's tokens (docs/scale.md).",
    )
    upstream_api_key: str = Field("", description="Bearer token the --upstream engine wants, if any.")
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens / n_predict a request may ask for.")
    infill_max_tokens: int = Field(256, ge=1, description="Tokens an /infill request with n_predict -1 (no limit) "
                                   "gets at most, as llama-server's --n-predict bounds it; the block's end or the "
                                   "suffix usually ends it sooner.")
    infill_layout: Literal["psm", "spm"] = Field(
        "spm", description="The prompt order of an /infill request that names none (codespec's `fim_layout`): "
        "'spm', the text after the cursor first (fewer tokens re-read per new line, and better completions "
        "from the default model: docs/decisions.md), or 'psm' as llama.cpp builds it.")
    next_edit_layout: Literal["auto", "sweep", "zeta", "instruct"] = Field(
        "auto", description="The prompt layout of next-edit requests that name none: 'auto' picks by --model's "
        "name (a Sweep next-edit model: 'sweep', a Zeta model: 'zeta', any other: 'instruct', the layout measured "
        "best for the default model: docs/next-edit.md), or the one named.")
    max_request_bytes: int = Field(8 << 20, ge=1024, description="Largest request body accepted, in bytes.")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="Largest request header block accepted, in "
                                  "bytes; more gets HTTP 431.")
    header_timeout_s: float = Field(10.0, gt=0, description="Seconds a connection has to send a request's "
                                    "headers (from connect, or from the last response); then HTTP 408 and close.")
    log_file: str = Field("", description="`codespec serve` logs to this file (rotated at 4 MiB, two old ones "
                          "kept) instead of stderr; per-request lines come only with --log-level debug.")
    body_timeout_s: float = Field(20.0, gt=0, description="Seconds a request's body has to arrive after its "
                                  "headers; then HTTP 408 and close.")
    idle_timeout_s: float = Field(5.0, gt=0, description="Seconds an idle kept-alive connection stays open.")
    max_active_requests: int = Field(4, ge=1, le=256, description="Requests generating at once; more wait.")
    max_waiting_requests: int = Field(64, ge=0, description="Requests allowed to wait; more get HTTP 429.")
    index_workspaces: bool = Field(False, description="Let clients have a local folder indexed as the "
                                   "repository (POST /v1/index/workspace); on in the shared server of "
                                   "`codespec lsp --shared`, whose API key only its user can read.")
    shared_grace_s: float = Field(60.0, ge=0, description="Seconds the shared server of `codespec lsp --shared` "
                                  "keeps running after its last editor left (the next window finds it warm).")

    # -- this machine's kernels: not flags, they choose how passes run, not what they compute
    forward: Literal["", "rowdecoder", "cuda", "transformers"] = Field(
        "", description="The backend that runs the passes ('': the fastest that applies, and `model info` says "
        "why; 'rowdecoder' also on a CPU without AVX-512 BF16 or AVX2, portable and slow: for checks).")
    linear: Literal["", "rowgemm", "onednn", "torch"] = Field(
        "", description="transformers' linear kernel ('': rowgemm where it runs; anything but rowgemm rules the "
        "row decoder out).")
    amx: Literal["on", "off"] = Field("on", description="The C kernels' AMX path on CPUs that have it ('off': "
                                      "AVX-512 BF16 instead).")
    lm_screen: Literal["on", "off"] = Field(
        "on", description="Greedy passes on the row decoder find each choice through an int8 screen of lm_head "
        "(half its bytes), the exact product only where the choice may lie: the same choices.")
    compiler: str = Field("gcc", validation_alias=AliasChoices("CODESPEC_COMPILER", "CC"),
                          description="The C compiler that builds the kernels on first use (also read from CC).")
    peers_dir: Path | None = Field(None, description="Where `scripts/install-bench-peers.sh` put the bench's "
                                   "peers (llama.cpp; default: <cache_dir>/peers).")
    cuda: CudaSettings = Field(default_factory=CudaSettings.checked,
                               description="The cuda backend's settings (CODESPEC_CUDA_*, below).")

    def effective(self) -> dict[str, object]:
        """Every value in force, as `model info --json` and `/health` show them (keys left out)."""
        return self.model_dump(mode="json", exclude={"api_key", "upstream_api_key"})

    @classmethod
    def with_file(cls, path: str | Path, **values: object) -> Settings:
        """Settings with the TOML file `path` under the environment and `values` (flags)."""

        class FromFile(cls):  # type: ignore[valid-type, misc]
            model_config = SettingsConfigDict(**{**cls.model_config, "toml_file": str(path)})

        return FromFile(**values)


def current() -> Settings:
    """The settings the environment (and CODESPEC_CONFIG's file) gives, read now: for the
    switches no flag sets, read where they act. A bad value is one SettingError line."""
    try:
        return Settings()
    except ValidationError as error:
        raise SettingError(error_line(error)) from None


def environment_switches(names: tuple[str, ...]) -> dict[str, str]:
    """The values of other libraries' environment switches among `names` (torch's and
    oneDNN's kernel choices): part of the machine profile's key."""
    return {name: os.environ[name] for name in names if name in os.environ}


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment plus `extra`, for a process it starts (a server, a peer):
    settings travel to it as CODESPEC_* variables."""
    return {**os.environ, **extra}


def no_advisory_warnings() -> None:
    """transformers' advisory warnings off, unless the user set them: they would interleave
    with the CLI's one-line messages."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


# settings without a flag: this machine's kernels and the shared server's grace
ENV_ONLY = ("shared_grace_s", "forward", "linear", "amx", "lm_screen", "compiler", "peers_dir", "cuda")


def reference_markdown() -> str:
    """docs/settings.md: every setting, its variable, flag, default and description, from
    the fields themselves (tests/test_settings_doc.py keeps the file equal to this)."""
    rows = ["# Settings", "",
            "Every setting is a `CODESPEC_<NAME>` environment variable, and most are flags of the commands that use "
            "them (`codespec <command> --help` lists a command's); `codespec serve --config FILE` also reads them from a "
            "TOML file. Flags win over variables, variables over the file. Generated from `codespec/settings.py` "
            "by `python -c 'from codespec.settings import reference_markdown as r; print(r(), end=\"\")' > "
            "docs/settings.md`.", "",
            "| setting | variable, flag | default | what it does |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        if name == "cuda":
            continue
        default = "`$XDG_CACHE_HOME/codespec`" if name == "cache_dir" else f"`{field.default!r}`"
        variable = "`CODESPEC_COMPILER` or `CC`" if name == "compiler" else f"`CODESPEC_{name.upper()}`"
        flag = f", `--{name.replace('_', '-')}`" if name not in ENV_ONLY else ""
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{name}` | {variable}{flag} | {default} | {description} |")
    for name, field in CudaSettings.model_fields.items():
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `cuda.{name}` | `CODESPEC_CUDA_{name.upper()}` | `{field.default!r}` | {description} |")
    return "\n".join(rows) + "\n"
