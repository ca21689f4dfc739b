"""The Triton kernels run on CPU tensors through the interpreter; it must be switched on
before triton compiles anything (before `codespec.kernels._triton` is imported). Its
repeated patch of the language on every device-function call is skipped
(interpreter_patch.py: the slowest of these tests 43 -> 20 s)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

from tests.kernels.interpreter_patch import skip_repeated_language_patches  # noqa: E402

skip_repeated_language_patches()
