"""The Triton kernels run on CPU tensors through the interpreter; it must be switched on
before triton compiles anything (before `codespec.kernels._triton` is imported)."""

import os

os.environ["TRITON_INTERPRET"] = "1"
