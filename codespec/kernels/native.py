"""codespec's C kernels (`rowgemm.c`, `amx.c`, `amx_attention.c`, `int8.c`, `lmchoice.c`, `rowdecoder.c`), built once per machine with the C compiler.

Build: `gcc -O3 -shared -fPIC -fopenmp -ffp-contract=off rowgemm.c amx.c amx_attention.c int8.c lmchoice.c attend_avx2.c rowdecoder.c -lm`
(a couple of seconds) into `<cache>/kernels/codespec-<hash>.so`, the hash covering the
sources, the flags and the compiler's version; written to a temporary name and renamed,
so concurrent first uses and interrupted builds leave no broken library. Each build
records the library's size and sha256 beside it (`codespec-<hash>.json`); a library
that does not match its record (truncated, overwritten, or from before records) is
rebuilt once before it is mapped: mapping a truncated library crashed the process
with a bus error on every run.
`-ffp-contract=off` keeps the compiler from fusing a multiply and an add into one
rounding in some builds and not others: the kernels' sums are spelled out, and the
bits must not depend on the CPU the code was compiled for. `-fopenmp` links
`libgomp.so.1`, which the loader resolves to the copy torch already loaded: one thread
pool, sized by `torch.set_num_threads`. No compiler (or a failed build) means no
kernels: `library()` returns None with the reason in `unavailable()`, and callers keep
torch's paths (oneDNN products, transformers' forward).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import warnings
from pathlib import Path

from codespec.settings import current
from codespec.tempfiles import temp_beside

log = logging.getLogger("codespec.kernels")

HERE = Path(__file__).parent
GEMM = (HERE / "rowgemm.c", HERE / "amx.c")  # the products alone: what an older compiler may still build
SOURCES = (*GEMM, HERE / "amx_attention.c", HERE / "int8.c", HERE / "lmchoice.c", HERE / "attend_avx2.c",
           HERE / "rowdecoder.c")
HEADERS = (HERE / "bf16.h", HERE / "lanes.h", HERE / "amx.h")
FLAGS = ("-O3", "-shared", "-fPIC", "-fopenmp", "-ffp-contract=off", "-Wno-psabi")
LIBS = ("-lm",)


_chosen_dir: list[Path] = []  # set by use_cache_dir (the settings' cache directory)


def use_cache_dir(cache_dir: Path | str) -> None:
    """Build into `<cache_dir>/kernels` (the CLI's --cache-dir), if nothing was built yet."""
    if library.cache_info().currsize == 0:
        _chosen_dir[:] = [Path(cache_dir)]


def _cache_dir() -> Path:
    if _chosen_dir:
        return _chosen_dir[0] / "kernels"
    return Path(current().cache_dir) / "kernels"


def _compiler() -> str | None:
    return shutil.which(current().compiler) or shutil.which("cc")


def _build(compiler: str, target: Path, sources: tuple[Path, ...] = SOURCES) -> None:
    """Compile into a temporary, record its size and sha256, then rename into place."""
    fd, tmp = temp_beside(target)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, *map(str, sources), "-o", tmp, *LIBS], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            names = ", ".join(s.name for s in sources)
            raise RuntimeError(f"{compiler} failed on {names}: {done.stderr.strip().splitlines()[-1:]}")
        record = json.dumps(_fingerprint(Path(tmp)))
        fd, tmp_record = temp_beside(_record_path(target))
        with os.fdopen(fd, "w") as f:
            f.write(record)
        os.replace(tmp_record, _record_path(target))
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _record_path(target: Path) -> Path:
    return target.with_suffix(".json")


def _fingerprint(path: Path) -> dict[str, object]:
    return {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def damage(target: Path) -> str | None:
    """Why the library at `target` must not be mapped (None: it matches its build record)."""
    if not target.exists():
        return "not built"
    try:
        record = json.loads(_record_path(target).read_text())
        size, sha = int(record["size"]), str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return "no build record beside it"
    found = _fingerprint(target)
    if found["size"] != size:
        return f"{found['size']} bytes where the build wrote {size} (truncated or overwritten)"
    if found["sha256"] != sha:
        return "its sha256 differs from the build's (overwritten)"
    return None


def _load(compiler: str, target: Path, sources: tuple[Path, ...]) -> ctypes.CDLL:
    """Map the library, building it first where it is missing or damaged; a library that
    matches its record but will not load is rebuilt once more."""
    problem = damage(target)
    if problem is not None:
        if problem != "not built":
            log.warning("codespec's C kernels in %s: %s; rebuilding them", target, problem)
        _build(compiler, target, sources)
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        if problem is not None:
            raise
        log.warning("codespec's C kernels in %s do not load (%s); rebuilding them", target, err)
        _build(compiler, target, sources)
        return ctypes.CDLL(str(target))


_failure: list[str] = []  # why library() returned None (once per process)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, built on first use; None where they cannot be built or loaded.
    A compiler that builds rowgemm.c but not rowdecoder.c (it needs GCC 12 or clang for
    `__builtin_shufflevector`) gives a library with the GEMM alone (`has` tells)."""
    compiler = _compiler()
    if compiler is None:
        _failure.append("no C compiler (gcc or cc) on PATH")
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        _failure.append(f"{type(err).__name__}: {err}")
        return None
    errors = []
    for sources in (SOURCES, GEMM):  # everything, else the products alone
        try:
            text = b"".join(path.read_bytes() for path in (*sources, *HEADERS))
            digest = hashlib.sha256(text + " ".join(FLAGS + LIBS).encode() + version.encode()
                                    + platform.machine().encode()).hexdigest()[:16]
            target = _cache_dir() / f"codespec-{digest}.so"
            lib = _load(compiler, target, sources)
            if errors:
                warnings.warn(f"codespec's C forward is unavailable ({errors[0]}): decode steps run transformers' "
                              "forward", RuntimeWarning, stacklevel=2)
            return lib
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            errors.append(f"{type(err).__name__}: {err}")
    _failure.append(errors[-1])
    warnings.warn(f"codespec's C kernels are unavailable ({_failure[0]}): torch's kernels are used instead",
                  RuntimeWarning, stacklevel=2)
    return None


def build_id() -> str:
    """The loaded library's digest (its sources, flags and compiler): what a pass costs
    changes with it, so the machine profile's key holds it; "" without a library."""
    lib = library()
    return Path(lib._name).stem.removeprefix("codespec-") if lib is not None else ""


def has(symbol: str) -> bool:
    """Whether the library was built and holds `symbol` (e.g. "rowdecoder_forward")."""
    lib = library()
    return lib is not None and hasattr(lib, symbol)


def unavailable() -> str | None:
    """Why the kernels could not be built or loaded (None if they were, or were never tried)."""
    return _failure[0] if _failure else None
