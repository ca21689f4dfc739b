"""The C kernels' paths as pytest parameters: every one this CPU runs, the others skipped
with the reason (their bits differ, so each is tested on its own)."""

from __future__ import annotations

import pytest

from codespec.kernels import rowgemm

NAMES = ((rowgemm.SCALAR, "scalar"), (rowgemm.AVX2, "avx2"), (rowgemm.AVX512_BF16, "avx512"), (rowgemm.AMX, "amx"))
WHY = {rowgemm.AVX2: "CPU without AVX2 and FMA", rowgemm.AVX512_BF16: "CPU without AVX-512 BF16",
       rowgemm.AMX: "CPU without AMX, or Linux did not grant this process the tile state"}


def isa_params(*, start: int = rowgemm.SCALAR) -> list:
    """One pytest.param per path from `start` up, skipped where this CPU does not run it."""
    return [pytest.param(cap, id=name, marks=pytest.mark.skipif(
        rowgemm.library() is None or rowgemm.isa(cap) != cap, reason=WHY.get(cap, "no kernel build")))
        for cap, name in NAMES if cap >= start]
