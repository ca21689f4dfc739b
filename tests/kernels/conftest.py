"""The Triton kernels run on CPU tensors through the interpreter; it must be switched on
before triton compiles anything (before `codespec.kernels._triton` is imported). Its
repeated patch of the language on every device-function call is skipped
(interpreter_patch.py: the slowest of these tests 43 -> 20 s), and so are the int32
overflow checks whose results the interpreter throws away (32 -> 20 s on an AMX Xeon)."""

import os

os.environ["TRITON_INTERPRET"] = "1"

from tests.kernels.interpreter_patch import (  # noqa: E402
    skip_discarded_overflow_checks,
    skip_repeated_language_patches,
)

skip_repeated_language_patches()
skip_discarded_overflow_checks()
