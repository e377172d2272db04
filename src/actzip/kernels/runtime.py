"""Where actzip's Triton kernels can run, and a record of the times they could not.

- :func:`triton_import_error` / :func:`triton_available`: can Triton be imported at all;
- :func:`interpreter_enabled`: do the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``);
- :func:`unavailable_reason`: ``None`` when Triton kernels can run on a tensor of this device, else why not
  (CUDA tensors need Triton; CPU tensors need the interpreter too);
- :func:`record_fallback` / :func:`fallback_counts`: when a codec set to ``kernel="auto"`` takes the PyTorch
  path on a CUDA tensor, it warns once per reason and counts every time.

Nothing here imports the kernels themselves: Triton decides between compiling and interpreting a kernel when
the kernel's module is imported, so that import waits until a kernel is first needed.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from collections import Counter

import torch

from actzip.errors import KernelUnavailableError, MissingDependencyError

_KERNEL_MODULES = ("actzip.kernels.sparse", "actzip.kernels.quant_tiles")  # each defines INTERPRETED
_TRUE = {"1", "true", "on", "yes"}


@functools.lru_cache(maxsize=None)
def triton_import_error() -> str | None:
    """``None`` when ``import triton`` works, else the error it raised (as text). Checked once."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing in some other way
        return f"{type(e).__name__}: {e}"
    return None


def missing_triton(cause: BaseException) -> MissingDependencyError:
    """The error a kernel module raises when ``import triton`` fails with ``cause``."""
    return MissingDependencyError(
        f"actzip's Triton kernels need Triton, which cannot be imported ({type(cause).__name__}: {cause}); "
        f"install it with pip install 'actzip[triton]'"
    )


def triton_available() -> bool:
    """Whether Triton can be imported."""
    return triton_import_error() is None


def _env_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUE


def _kernels_interpreted() -> bool | None:
    """Whether actzip's kernels were defined under the interpreter; ``None`` while none is imported."""
    for name in _KERNEL_MODULES:
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "INTERPRETED"):
            return bool(mod.INTERPRETED)
    return None


def interpreter_enabled() -> bool:
    """Whether actzip's Triton kernels run under Triton's interpreter (on the CPU, or slowly on CUDA).

    Triton reads ``TRITON_INTERPRET`` when a kernel is defined, and the interpreter needs it still set while
    the kernel runs. So this is true when the variable is set now and actzip's kernel module was either not
    imported yet or imported under the interpreter.
    """
    mode = _kernels_interpreted()
    return _env_interpret() and mode is not False


_INTERPRETED_GONE = (
    "actzip's Triton kernels were loaded under Triton's interpreter (TRITON_INTERPRET=1), which is no longer set"
)


def unavailable_reason(device: torch.device | str) -> str | None:
    """``None`` if Triton kernels can run on tensors of ``device``, else the reason, as a sentence fragment."""
    device = torch.device(device)
    err = triton_import_error()
    if err is not None:
        return f"Triton is not installed or cannot be imported ({err}); install it with pip install 'actzip[triton]'"
    mode = _kernels_interpreted()
    if device.type == "cuda":  # the hot path (each encode and decode asks): one environment lookup at most
        return _INTERPRETED_GONE if mode is True and not _env_interpret() else None
    env = _env_interpret()
    if mode is True and not env:
        return _INTERPRETED_GONE
    if device.type == "cpu":
        if interpreter_enabled():
            return None
        if mode is False and env:
            return (
                "the tensor is on the CPU, and actzip's Triton kernels were compiled for CUDA before "
                "TRITON_INTERPRET=1 was set (set it before they are first used to run them on the CPU)"
            )
        return (
            "the tensor is on the CPU; Triton kernels run on CUDA devices, or on the CPU under Triton's "
            "interpreter (set TRITON_INTERPRET=1 before actzip's kernels are first used)"
        )
    return f"the tensor is on a {device.type} device; Triton kernels run on CUDA devices"


_lock = threading.Lock()
_fallbacks: Counter[str] = Counter()
_warned: set[str] = set()


def record_fallback(what: str, reason: str, *, stacklevel: int = 3,
                    instead: str = "using the PyTorch implementation instead of the Triton kernels") -> None:
    """Count one fallback (by default from the Triton kernels to PyTorch; ``instead`` says what runs in their
    place); warn the first time for each (what, reason)."""
    key = f"{what}: {reason}"
    with _lock:
        _fallbacks[key] += 1
        first = key not in _warned
        _warned.add(key)
    if first:
        warnings.warn(
            f"actzip {what}: {instead} because {reason} "
            f"(warned once; actzip.kernels.runtime.fallback_counts() counts every time)",
            RuntimeWarning,
            stacklevel=stacklevel,
        )


def fallback_counts() -> dict[str, int]:
    """How many times each ``"what: reason"`` fallback happened in this process."""
    with _lock:
        return dict(_fallbacks)


def reset_fallbacks() -> None:
    """Forget the counts and which fallbacks were already warned about."""
    with _lock:
        _fallbacks.clear()
        _warned.clear()
