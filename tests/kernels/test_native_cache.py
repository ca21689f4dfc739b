"""The compiled kernels' cache survives damage: a truncated library crashed
every later run with a bus error, and a garbage one fell back, silently, to a far
slower route. Now each is found before it is mapped and rebuilt once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codespec.kernels import native

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C compiler")

LOAD = ("import json, warnings; warnings.simplefilter('error'); from codespec.kernels import native; "
        "lib = native.library(); print(json.dumps({'loaded': lib is not None, 'why': native.unavailable(), "
        "'rowgemm': native.has('rowgemm_bf16')}))")


def quick_compiler(folder: Path) -> str:
    """The C compiler with optimization off (its last -O wins over the build's -O3): the
    test below is about the cache, not the code, and its four -O3 builds took ~90 s."""
    wrapper = folder / "cc-O0"
    wrapper.write_text(f'#!/bin/sh\nexec {native._compiler()} "$@" -O0\n')
    wrapper.chmod(0o755)
    try:  # a temporary folder mounted noexec: the compiler itself, at -O3
        subprocess.run([str(wrapper), "--version"], capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return str(native._compiler())
    return str(wrapper)


def run_fresh(cache: Path, **env: str) -> tuple[dict, str]:
    """library() in a new process (as every `codespec` run starts) over `cache`."""
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "CODESPEC_CACHE_DIR": str(cache), **env})
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"  # a bus error is -7 / 135
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def library_file(cache: Path) -> Path:
    (found,) = (cache / "kernels").glob("codespec-*.so")
    return found


def test_a_truncated_or_garbage_library_is_rebuilt_not_mapped(tmp_path):
    cc = quick_compiler(tmp_path)
    first, _ = run_fresh(tmp_path, CC=cc)
    assert first["loaded"], first
    lib = library_file(tmp_path)
    record = json.loads(lib.with_suffix(".json").read_text())
    assert record["size"] == lib.stat().st_size
    good = lib.read_bytes()

    for damage, expected in [(good[: len(good) // 2], "truncated"), (os.urandom(len(good)), "sha256"),
                             (good, "no build record")]:
        lib.write_bytes(damage)
        if expected == "no build record":  # a cache from before the records
            lib.with_suffix(".json").unlink()
        again, log = run_fresh(tmp_path, CC=cc)
        assert again == first, (expected, again)
        assert expected in log and "rebuilding" in log  # said, in the start-up log
        assert lib.read_bytes() == good or native.damage(lib) is None


@pytest.mark.model
def test_kernels_that_cannot_be_built_are_said_loudly(tmp_path):
    """A compiler that fails (here `false`): `model info` and the start-up log say the
    passes run a slower route, and why."""
    env = {**os.environ, "CC": "false", "PATH": os.environ["PATH"]}
    done = subprocess.run([sys.executable, "-m", "codespec", "model", "info", "--json"], capture_output=True,
                          text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    forward = json.loads(done.stdout)["forward"]
    assert forward["degraded"].startswith("codespec's C kernels are unavailable: RuntimeError: ")
    assert "false failed on rowgemm.c" in forward["degraded"]
    assert forward["backend"] == "transformers"
