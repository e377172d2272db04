"""Kernel tests run the Triton kernels on CUDA when there is a GPU, else under Triton's CPU interpreter.

Triton chooses between compiling and interpreting a kernel when the kernel is defined, i.e. when a kernel
module (``actzip.kernels.sparse``, ...) is imported, and the interpreter needs ``TRITON_INTERPRET`` still set
while kernels run. So without a GPU this sets ``TRITON_INTERPRET=1`` now, at import (before the test modules import
the kernels), and puts the variable back as it was once this directory's tests are done. Afterwards
``actzip.kernels.runtime`` reports the (interpreted) kernels as unusable instead of running them without the
variable. With a GPU the variable is left as the user set it, so the CUDA cases test compiled kernels and the
CPU cases skip.
"""

import os

import pytest
import torch

_BEFORE = os.environ.get("TRITON_INTERPRET")
if _BEFORE is None and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
_DURING = os.environ.get("TRITON_INTERPRET")


@pytest.fixture(scope="package", autouse=True)
def _triton_interpret_env():
    os.environ.pop("TRITON_INTERPRET", None)
    if _DURING is not None:
        os.environ["TRITON_INTERPRET"] = _DURING
    yield
    os.environ.pop("TRITON_INTERPRET", None)
    if _BEFORE is not None:
        os.environ["TRITON_INTERPRET"] = _BEFORE
