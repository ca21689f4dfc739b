"""The interpreter's language patch, once per launch (interpreter_patch.py): a device
function's repeated patch is skipped, a module the launch has not patched yet still gets
its patch, the kernel computes what it would without, and the language is triton's own
again after the launch. Its int32 overflow checks are skipped while `debug` would throw
them away: the same bits, no int64 casts."""

from __future__ import annotations

import dataclasses

import pytest
import torch

triton = pytest.importorskip("triton", reason="triton is a test dependency (pip install -e '.[test]')")
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from tests.kernels.interpreter_patch import (  # noqa: E402
    skip_discarded_overflow_checks,
    skip_repeated_language_patches,
)


@triton.jit
def _row_sum(x_ptr, row, WIDTH: tl.constexpr):
    return tl.sum(tl.load(x_ptr + row * WIDTH + tl.arange(0, WIDTH)), axis=0)  # tl.sum: triton.language.standard


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, WIDTH: tl.constexpr):
    for row in tl.static_range(ROWS):
        tl.store(out_ptr + row, _row_sum(x_ptr, row, WIDTH))


def test_a_launch_patches_each_language_module_once_and_computes_the_same():
    assert skip_repeated_language_patches(), "triton's interpreter lost _patch_lang or GridExecutor: the kernels' tests run unpatched and slower"
    assert skip_repeated_language_patches()  # a second call wraps nothing again
    patch = interpreter._patch_lang
    real: list[str] = []

    def counted(fn):
        scope = patch(fn)
        if scope._changes:
            real.append(fn.__name__)
        return scope

    counted.skips_repeats = True
    interpreter._patch_lang = counted
    try:
        x = torch.arange(32, dtype=torch.float32).reshape(4, 8)
        out = torch.empty(4, dtype=torch.float32)
        _row_sums_kernel[(2,)](x, out, ROWS=4, WIDTH=8)
        again = torch.empty(4, dtype=torch.float32)
        _row_sums_kernel[(1,)](x, again, ROWS=4, WIDTH=8)
    finally:
        interpreter._patch_lang = patch
    assert torch.equal(out, x.sum(dim=1)) and torch.equal(again, out)
    # per launch: the kernel's module (tl), then tl.sum's (tl.core) at its first call; the
    # programs' other calls of _row_sum and tl.sum patch nothing
    assert real == ["_row_sums_kernel", "sum", "_row_sums_kernel", "sum"]
    assert tl.core.is_builtin(tl.load), "the launch left triton.language patched"


@triton.jit
def _wrapping_sums_kernel(a_ptr, b_ptr, out_ptr, WIDTH: tl.constexpr):
    offsets = tl.arange(0, WIDTH)
    tl.store(out_ptr + offsets, tl.load(a_ptr + offsets) + tl.load(b_ptr + offsets))  # int32 + int32


def test_int32_arithmetic_skips_the_overflow_checks_debug_would_drop(monkeypatch):
    builder = interpreter.interpreter_builder
    assert skip_discarded_overflow_checks(), "triton's interpreter lost interpreter_builder.options.sanitize_overflow"
    assert builder.options.sanitize_overflow is False and builder.options.debug is False
    a = torch.tensor([1, -7, 2**31 - 1, -(2**31)], dtype=torch.int32)  # the last two wrap
    b = torch.tensor([2, 3, 1, -1], dtype=torch.int32)
    int_casts: list[int] = []
    cast = builder.create_int_cast
    monkeypatch.setattr(builder, "create_int_cast", lambda *args: int_casts.append(1) or cast(*args))

    def sums(sanitize: bool) -> tuple[torch.Tensor, int]:
        monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=sanitize))
        int_casts.clear()
        out = torch.empty(4, dtype=torch.int32)
        _wrapping_sums_kernel[(1,)](a, b, out, WIDTH=4)
        return out, len(int_casts)

    checked, checked_casts = sums(True)
    unchecked, unchecked_casts = sums(False)
    assert torch.equal(checked, unchecked) and torch.equal(unchecked, a + b)  # wrapped, as on a GPU
    assert checked_casts == 2 and unchecked_casts == 0  # the check's int64 operands, then none


def test_the_overflow_checks_stay_where_debug_would_raise(monkeypatch):
    builder = interpreter.interpreter_builder
    monkeypatch.setattr(builder, "options", dataclasses.replace(builder.options, debug=True, sanitize_overflow=True))
    assert not skip_discarded_overflow_checks()
    assert builder.options.sanitize_overflow is True
