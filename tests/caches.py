"""New cache directories for the servers a test starts, as a user's first run has them,
less the C kernels: each would build them again (~20 s at -O3 on a 2-core VM, several
minutes of CI in all). This run's library and its build record are copied in instead;
the name carries the digest of the sources, flags and compiler, so the server maps this
copy where it would have built the same file (kernels/native.py)."""

from __future__ import annotations

import shutil
from pathlib import Path


def fresh_cache(path: Path) -> str:
    """`path` made a cache directory holding this run's compiled kernels; its name as a
    string (for CODESPEC_CACHE_DIR)."""
    from codespec.kernels import native

    kernels = path / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    lib = native.library()
    if lib is not None:
        built = Path(lib._name)
        for source in (built, built.with_suffix(".json")):
            shutil.copy2(source, kernels / source.name)
    return str(path)
