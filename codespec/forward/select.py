"""The one place that decides which backend (base.py) runs a model's passes.

At start-up, once per process, from the machine, the model and two settings:

1. The `forward` and `linear` settings (CODESPEC_FORWARD: "" the fastest that applies,
   or a backend by name; CODESPEC_LINEAR: transformers' linear kernel; anything but
   rowgemm rules the row decoder out).
2. The torch-free load (direct.py) where the C row decoder serves the model from its
   files: CPU with AVX-512 BF16 or AVX2 with FMA, bfloat16, Qwen2/Llama, default rotary
   embedding, weights stored in bfloat16. No torch or transformers import: a fast start
   and one copy of the weights. `CODESPEC_FORWARD=rowdecoder` also takes it on a CPU
   with neither, with the C forward's portable code (exact, slow: for checks).
3. Else transformers loads the model, and the row decoder runs over its weights where
   it knows the layers and the linear layers are rowgemm's (hf_weights.py).
4. On CUDA, Qwen2/Llama: the `cuda` backend (cuda.py: one fixed pass shape, our row-exact
   attention kernel, CUDA graphs).
5. Else transformers' own forward, row-exact (transformers.py).

The choice and its reason (why each faster backend did not apply) travel with the
loaded model: `codespec model info --json` shows them, `generate --json` names the
backend.

    loaded = load(settings)                # Loaded: forward, tokenizer, backend, reason
    forward = of_model(hf_model)           # a transformers model already in hand (tests, bench)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codespec.errors import ModelError
from codespec.forward import direct
from codespec.forward.base import Forward
from codespec.settings import Settings

FASTEST = "the fastest backend that applies"


@dataclass
class Loaded:
    """A model ready for the engine: its backend, tokenizer, and the facts `model info` reports."""

    name: str
    path: str
    forward: Forward
    tokenizer: Any  # transformers' tokenizer, or forward/tokenizer.py's (torch-free)
    weights: str  # the directory the weights came from (a serving-dtype copy, or path)
    reason: str  # why this backend: what ruled out each faster one
    model: Any = None  # transformers' model, where one was loaded (None: torch-free)
    parameters: int = 0

    @property
    def backend(self) -> str:
        return self.forward.name

    @property
    def torch_free(self) -> bool:
        return self.model is None

    @property
    def degraded(self) -> str | None:
        """Why codespec's C kernels, which this machine should run, could not be built or
        loaded (the passes then take a slower route; said loudly, not only in `reason`)."""
        from codespec.kernels import native

        problem = native.unavailable()
        return f"codespec's C kernels are unavailable: {problem}" if problem else None

    def info(self) -> dict[str, Any]:
        config = self.forward.config
        return {
            "name": self.name,
            "path": self.path,
            "weights": self.weights or self.path,
            "dtype": "bfloat16" if self.backend == "rowdecoder" else str(self.forward.kv_dtype).removeprefix("torch."),
            "device": str(self.forward.device),
            "parameters": self.parameters,
            "vocab_size": int(config.vocab_size),
            "max_context": int(getattr(config, "max_position_embeddings", 0) or 0),
            "forward": {"backend": self.backend, "torch_free": self.torch_free, "exact": self.forward.exact,
                        "reason": self.reason, "degraded": self.degraded},
        }


def load(settings: Settings, *, progress: bool = True, transformers: bool = False) -> Loaded:
    """Resolve and load the model `settings.model` names on the backend this machine runs
    best (module docstring). `transformers=True`: load transformers' model even where the
    torch-free load applies (the benchmark's peers run on it); the row decoder still runs
    the passes over its weights."""
    from codespec.kernels import native
    from codespec.models.loading import resolve_model_path

    native.use_cache_dir(settings.cache_dir)  # where the C kernels are built, beside the models
    wanted, linear = settings.forward, settings.linear
    name, path = resolve_model_path(settings.model, settings, progress=progress)
    asked = _asked_elsewhere(wanted, linear)
    refused = asked or _torch_free_refused(path, settings, portable=wanted == "rowdecoder")
    if refused is None and not transformers:
        forward, tokenizer, weights = direct.load(path, settings, portable=wanted == "rowdecoder")
        return Loaded(name, path, forward, tokenizer, str(weights), FASTEST + " (torch-free)",
                      parameters=forward.decoder.weights.parameters)
    from codespec.models.loading import load_transformers

    model, tokenizer, weights = load_transformers(settings, name, path)
    forward, why_not_rows = _for_model(model, wanted, settings.quantize, settings.cuda)
    if forward.name == "rowdecoder":
        reason = f"{FASTEST} with transformers' weights: {refused or 'transformers was asked for (bench)'}"
    elif forward.name == "cuda" and not asked:
        reason = f"{FASTEST} on CUDA: fixed-shape row-exact passes in CUDA graphs"
    else:
        reason = asked or f"the row decoder does not serve it here: {why_not_rows}"
    parameters = sum(p.numel() for p in model.parameters())
    return Loaded(name, path, forward, tokenizer, weights, reason, model=model, parameters=parameters)


def _asked_elsewhere(wanted: str, linear: str) -> str | None:
    """The setting that rules the row decoder out (None: none does)."""
    if wanted in ("cuda", "transformers"):
        return f"CODESPEC_FORWARD={wanted}"
    if linear not in ("", "rowgemm"):
        return f"CODESPEC_LINEAR={linear}"
    return None


def _torch_free_refused(path: str, settings: Settings, *, portable: bool = False) -> str | None:
    """Why the torch-free load cannot serve the model at `path` (None: it can)."""
    if not Path(path).is_dir():
        return "a hub id: transformers resolves it"
    return direct.unsupported(path, settings, portable=portable)


def _for_model(model: Any, wanted: str, quantize: str, cuda_settings: Any = None) -> tuple[Forward, str | None]:
    """The backend for a transformers model, and why the row decoder does not serve it."""
    from codespec.forward import hf_weights

    why = _asked_elsewhere(wanted, "") or hf_weights.unsupported(model)
    if quantize != "none" and why is not None:
        raise ModelError(f"--quantize {quantize} runs on the C row decoder (CPU with AVX-512 BF16 or AVX2, bf16 "
                         f"Qwen2/Llama), which does not serve this model here: {why}")
    if wanted == "rowdecoder" and why is not None:
        raise ModelError(f"CODESPEC_FORWARD=rowdecoder: the row decoder does not serve this model here: {why}")
    if wanted == "cuda" or (not wanted and why is not None and _on_cuda(model)):
        from codespec.forward.cuda import forward as cuda

        refused = cuda.unsupported(model) or (None if _on_cuda(model) else "the model is not on a CUDA device")
        if refused is None:
            return of_model(model, backend="cuda", cuda_settings=cuda_settings), why
        if wanted == "cuda":
            raise ModelError(f"CODESPEC_FORWARD=cuda: the cuda backend does not serve this model here: {refused}")
        why = f"{why}; the cuda backend: {refused}"
    backend = wanted or ("rowdecoder" if why is None else "transformers")  # decided: of_model checks nothing again
    return of_model(model, backend=backend, quantize=quantize), why


def _on_cuda(model: Any) -> bool:
    return model.get_input_embeddings().weight.device.type == "cuda"


def of_model(model: Any, *, backend: str = "", quantize: str = "none", screen: bool = True,
             cuda_settings: Any = None) -> Forward:
    """The backend for a transformers model already loaded: `backend` "" is the row decoder
    where it serves the model (hf_weights.unsupported), else transformers' row-exact
    forward (the `cuda` backend for Qwen2/Llama on CUDA); "rowdecoder", "cuda", "transformers"
    pick one. `screen=False`: greedy passes on the row decoder compute full
    logits (tests that compare the two); `cuda_settings`: the cuda backend's (None: the
    environment's)."""
    from codespec.forward.cuda import forward as cuda
    from codespec.forward import hf_weights
    from codespec.forward.transformers import TorchForward

    if backend == "rowdecoder" or (backend == "" and hf_weights.unsupported(model) is None):
        return hf_weights.row_forward(model, quantize=quantize, screen=screen)
    if backend == "cuda" or (backend == "" and _on_cuda(model) and cuda.unsupported(model) is None):
        return cuda.CudaForward(model, cuda_settings)
    return TorchForward(model)
