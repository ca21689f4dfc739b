"""Triton's interpreter, without its repeated patch of the language.

Under TRITON_INTERPRET=1 a kernel launch (`GridExecutor.__call__`) patches
triton.language's builtins into interpreted ones for its programs, then restores them.
A call of one @triton.jit function from another (a device function: our kernels' shared
row loads, their combine and reduce helpers) patches the language again on every call,
though the launch around it has patched those very modules (the patch walks each module
with `inspect.getmembers`): in triton 3.9 that was 58% of a fused-layers test (91 of 156
s under cProfile, 132k calls, session 50). Inside a launch whose patch covered the
device function's language modules the device call's patch is the same patch again, so
it is skipped; anywhere else (no launch running, or a module the launch did not patch)
the interpreter patches as it always does. Output is unchanged: the kernels' tests
compare bits, and they pass with and without this.

If triton's interpreter no longer has the two names this wraps, nothing is wrapped (the
tests run as they would, only slower)."""

from __future__ import annotations

import inspect
from typing import Any


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
