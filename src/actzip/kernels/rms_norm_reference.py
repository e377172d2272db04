"""The PyTorch references of :mod:`actzip.kernels.rms_norm` (importable without Triton): the ops transformers'
RMSNorm forward and autograd's backward of it run, in their order, under the kernels' names and signatures.

``x`` and ``gy``: ``[N, D]``; ``w``: ``[D]``; ``r`` and ``g_p``: ``[N]`` float32 (one value a row). The forms
(:data:`FORMS`): ``w * (float(x) * r).to(dt)`` (Llama's, and Nemotron-H's in older transformers) and
``(float(w) * (float(x) * r)).to(dt)`` (Nemotron-H's in newer ones).
"""

from __future__ import annotations

import torch

__all__ = ["FORMS", "grad_input", "grad_parts", "squares", "tail"]

FORMS = ("weight_times_cast", "cast_of_weight_times")


def squares(x: torch.Tensor) -> torch.Tensor:
    """``float(x)²``: what transformers' ``mean`` reduces."""
    return x.to(torch.float32).pow(2)


def tail(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, form: str) -> torch.Tensor:
    """The norm's output from its input, the per-row scale and the weight."""
    n = x.to(torch.float32) * r[:, None]
    if form == FORMS[0]:
        return w * n.to(x.dtype)
    return (w.to(torch.float32) * n).to(x.dtype)


def _g_n(gy: torch.Tensor, w: torch.Tensor, form: str) -> torch.Tensor:
    """The gradient of ``float(x) * r``."""
    if form == FORMS[0]:
        return (gy * w).to(torch.float32)
    return gy.to(torch.float32) * w.to(torch.float32)


def grad_parts(x, r, w, gy, form) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gy * n, g_n * float(x))``: what autograd's multiplications make before their broadcast sums (the
    weight's gradient over rows, the scale's over columns)."""
    x32 = x.to(torch.float32)
    n32 = x32 * r[:, None]
    prod_w = gy * n32.to(x.dtype) if form == FORMS[0] else gy.to(torch.float32) * n32
    return prod_w, _g_n(gy, w, form) * x32


def grad_input(x, r, w, gy, g_p, form) -> torch.Tensor:
    """The input's gradient: the scale's path ``g_n * r`` plus the squares' path ``g_p * (2 * float(x))``, summed
    in float32 and cast back, as autograd accumulates them."""
    x32 = x.to(torch.float32)
    return (_g_n(gy, w, form) * r[:, None] + g_p[:, None] * (2.0 * x32.pow(1.0))).to(x.dtype)
