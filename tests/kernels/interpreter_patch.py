"""Triton's interpreter, without its repeated patch of the language and without the
overflow checks it computes and then throws away.

Under TRITON_INTERPRET=1 a kernel launch (`GridExecutor.__call__`) patches
triton.language's builtins into interpreted ones for its programs, then restores them.
A call of one @triton.jit function from another (a device function: our kernels' shared
row loads, their combine and reduce helpers) patches the language again on every call,
though the launch around it has patched those very modules (the patch walks each module
with `inspect.getmembers`): in triton 3.9 that was 58% of a fused-layers test (91 of 156
s under cProfile, 132k calls, an AMX Xeon). Inside a launch whose patch covered the
device function's language modules the device call's patch is the same patch again, so
it is skipped; anywhere else (no launch running, or a module the launch did not patch)
the interpreter patches as it always does. Output is unchanged: the kernels' tests
compare bits, and they pass with and without this.

If triton's interpreter no longer has the two names this wraps, nothing is wrapped (the
tests run as they would, only slower).

Every int32 `+`, `-` and `*` in a kernel asks for an overflow check (`sanitize_overflow`,
on by default): the front end casts both operands to int64, redoes the operation, compares
it with int32's bounds, and hands the result to `device_assert`, which drops it unless the
options say `debug`. The interpreter's builder never sets `debug`, so each check is work
whose result nobody reads: 42% of the narrow-steps test under cProfile. Its
options say `sanitize_overflow=False` instead, the setting a GPU compile reaches when it
drops the same assert; with `debug` on (nothing in triton 3.9 sets it, but a later
release might) the checks stay, since they would then raise."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

# A padding row's outputs are uninitialised memory and never reach a real row; numpy warns
# when the interpreter's arithmetic on them overflows (sums of squares of garbage). Test
# files whose kernels leave padding rows set `pytestmark` to this.
PADDING_ROW_WARNINGS = pytest.mark.filterwarnings("ignore:(overflow|invalid value) encountered:RuntimeWarning")


def skip_repeated_language_patches() -> bool:
    """Wrap the interpreter once per process; False where there is nothing to wrap."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    launch = getattr(interpreter.GridExecutor, "__call__", None)
    patch = getattr(interpreter, "_patch_lang", None)
    if launch is None or patch is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    if getattr(patch, "skips_repeats", False):
        return True
    # the language modules patched since the running launch began: its own patch, then
    # its device functions' (triton.language.standard's see tl.core, ours tl)
    running: list[frozenset[int]] = []
    seen: dict[Any, frozenset[int]] = {}  # by function

    def languages(fn: Any) -> frozenset[int]:
        if fn not in seen:
            seen[fn] = frozenset(id(value) for value in fn.__globals__.values()
                                 if inspect.ismodule(value) and value in (tl, tl.core))
        return seen[fn]

    def patch_once(fn: Any) -> Any:
        wanted = languages(fn)
        if running and wanted and wanted <= running[-1]:
            return interpreter._LangPatchScope()  # patched already: nothing to set or restore
        if running:
            running[-1] |= wanted
        return patch(fn)

    def launch_patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        running.append(frozenset())
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    patch_once.skips_repeats = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch_patched
    return True


def skip_discarded_overflow_checks() -> bool:
    """Switch off the interpreter's int32 overflow checks while `debug` would discard them;
    False where there is no such setting (or `debug` is on, so they stay)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow") \
            or getattr(options, "debug", True):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
