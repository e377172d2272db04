"""Which implementation a codec runs (its ``kernel`` option): the PyTorch reference or the Triton kernels.

``"auto"`` runs the kernels on CUDA tensors when they can run and the PyTorch code otherwise, warning once per
reason (and counting every time, in ``actzip.kernels.runtime.fallback_counts()``) when a CUDA tensor falls
back; ``"torch"`` always runs the PyTorch code; ``"triton"`` always runs the kernels, or raises
:class:`~actzip.errors.KernelUnavailableError` (a ``ConfigError``) saying why they cannot.
"""

from __future__ import annotations

import torch

from actzip.errors import KernelUnavailableError

__all__ = ["KERNELS", "use_triton"]

KERNELS = ("auto", "torch", "triton")


def use_triton(owner: str, kernel: str, device: torch.device, problem: str | None = None) -> bool:
    """Whether codec ``owner`` set to ``kernel`` runs its Triton kernels for a tensor on ``device``.

    ``problem``: why the kernels cannot take this tensor (its dtype, tile or group size), or ``None``. A
    fallback under ``"auto"`` is announced once and counted; under ``"triton"`` it raises.
    """
    if kernel == "torch" or (kernel == "auto" and device.type != "cuda"):
        return False
    # Not at module level: runtime is cheap to import, but the codecs reach the kernels' side only when asked.
    from actzip.kernels import runtime

    reason = runtime.unavailable_reason(device) or problem
    if reason is None:
        return True
    if kernel == "triton":
        raise KernelUnavailableError(f"{owner}(kernel='triton') cannot run: {reason}")
    # The warning points at the caller of the codec's encode or decode: record_fallback, here, the codec's
    # uses_triton, its encode or decode, then the caller.
    runtime.record_fallback(f"{owner} codec (kernel='auto')", reason, stacklevel=5)
    return False
