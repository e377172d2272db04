"""transformers' RMSNorms made exact and lean: the same bits, forward and backward, from the input and one
float32 scale per row.

transformers' RMSNorms (``LlamaRMSNorm``, ``NemotronHRMSNorm``, ...) are a chain of PyTorch ops, and autograd keeps
for their backward a float32 copy of the input, the normalized activation and the per-row scale; the projections
after the norm keep its output too. :class:`ExactRMSNorm` computes the same forward (the same ops, or Triton
kernels that round alike) and does autograd's backward itself, op for op, from what it keeps: the input ``x``
(bf16 / fp16) and ``r = rsqrt(mean(float(x)²) + eps)``. Its output is marked as rebuildable
(:func:`~actzip.memory.cache.rebuild.mark_rebuildable`), so the fused MLPs and the projections hooked by
:func:`~actzip.memory.modules.norm_rebuild.rebuild_projection_inputs` keep a handle in place of it, rebuilt in
backward by one elementwise pass over ``x`` and ``r``.

Which forward a class computes is not taken on trust: :func:`exact_form` runs the module's own forward and
backward once on a random probe and compares them, bit for bit, with each of the forms of
:mod:`actzip.kernels.rms_norm` (cached per class, dtype and device). A class that matches none is left as it is.
At run time, an input that is not bf16 / fp16, a weight of another dtype, or autocast, send a call to the
original forward (announced once, counted; see :func:`actzip.kernels.runtime.fallback_counts`).

On CUDA with Triton the elementwise work runs in the kernels of :mod:`actzip.kernels.rms_norm`; elsewhere in
the PyTorch references beside them (the same ops as transformers' and autograd's). The reductions are PyTorch's
own calls either way. A gradient that reaches the norm non-contiguous takes the references too, so that every
product autograd would reduce has autograd's layout.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.autograd.function import once_differentiable

from actzip.kernels import rms_norm_reference, runtime
from actzip.kernels.rms_norm_reference import FORMS
from actzip.memory.cache.rebuild import mark_rebuildable, recompute
from actzip.memory.cache.roles import NORM, declared_role

__all__ = ["ExactRMSNorm", "exact_form", "is_hf_rms_norm"]

_DTYPES = (torch.bfloat16, torch.float16)


def _kernels(device: torch.device):
    """The Triton kernels where they run on ``device``, else their PyTorch references (the same functions)."""
    if device.type == "cuda" and runtime.unavailable_reason(device) is None:
        from actzip.kernels import rms_norm

        return rms_norm
    return rms_norm_reference


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """What autograd does to a gradient of a broadcast operand (``at::sum_to``): sum the leading dims and the
    dims ``shape`` broadcasts, keeping them, then view as ``shape``."""
    lead = t.dim() - len(shape)
    dims = [*range(lead), *(i for i in range(lead, t.dim()) if shape[i - lead] == 1 and t.shape[i] != 1)]
    if dims:
        t = t.sum(dims, keepdim=True)
    return t.view(shape) if lead > 0 else t


class _ExactRMSNormFunction(torch.autograd.Function):
    """``(y, r)`` of :class:`ExactRMSNorm`; ``r`` (``[..., 1]`` float32) carries no gradient."""

    @staticmethod
    def forward(ctx, x, weight, eps, form):
        k = _kernels(x.device)
        flat = x.reshape(-1, x.shape[-1])
        squares = k.squares(flat).view(x.shape)
        r = torch.rsqrt(squares.mean(-1, keepdim=True) + eps)  # transformers' reduction, on the same bits
        del squares
        y = k.tail(flat, r.view(-1), weight, form).view(x.shape)
        ctx.save_for_backward(x, r, weight)
        ctx.form = form
        ctx.mark_non_differentiable(r)
        return y, r

    @staticmethod
    @once_differentiable
    def backward(ctx, gy, _):
        x, r, w = ctx.saved_tensors
        k = _kernels(x.device) if gy.is_contiguous() else rms_norm_reference
        flat, rows = x.reshape(-1, x.shape[-1]), r.view(-1)
        gy_flat = gy.reshape(flat.shape)
        prod_w, prod_r = k.grad_parts(flat, rows, w, gy_flat, ctx.form)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = _sum_to(prod_w.view(x.shape), w.shape)
            if ctx.form == FORMS[1]:
                grad_w = grad_w.to(w.dtype)
        del prod_w
        g_r = _sum_to(prod_r.view(x.shape), r.shape)
        del prod_r
        g_v = -0.5 * g_r * r.pow(3)  # rsqrt's backward
        g_p = g_v / x.shape[-1]  # mean's backward, per row (autograd's is the same value at every column)
        grad_x = k.grad_input(flat, rows, w, gy_flat, g_p.view(-1), ctx.form).view(x.shape)
        return grad_x, grad_w, None, None


def is_hf_rms_norm(module: nn.Module) -> bool:
    """A transformers ``*RMSNorm`` (not a gated one) with a 1-D ``weight`` and a float ``variance_epsilon``."""
    cls = type(module)
    w = getattr(module, "weight", None)
    return (cls.__module__.startswith("transformers.") and cls.__name__.endswith("RMSNorm")
            and isinstance(w, nn.Parameter) and w.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float))


_FORM_OF: dict[tuple, str | None] = {}  # (class, dtype, device, width, eps) -> what _probe found


def _probe(module: nn.Module) -> str | None:
    """The form ``module``'s class computes, checked forward and backward through a copy of ``module`` with random
    weights on a random probe, or None."""
    w = module.weight
    g = torch.Generator(device="cpu").manual_seed(0)
    scale = torch.logspace(-3, 3, 5)[:, None]
    x0 = (torch.randn(2, 5, w.numel(), generator=g) * scale).to(device=w.device, dtype=w.dtype)
    w0 = (1 + torch.randn(w.numel(), generator=g) / 4).to(device=w.device, dtype=w.dtype)
    gy = torch.randn(2, 5, w.numel(), generator=g).to(device=w.device, dtype=w.dtype)
    x = x0.clone().requires_grad_()
    try:
        probe = copy.deepcopy(module)
        with torch.no_grad():
            probe.weight.copy_(w0)
        want = probe.forward(x)
        want_grads = torch.autograd.grad(want, (x, probe.weight), gy)
    except Exception:  # a module that cannot be copied, or whose forward needs more than an input: no form
        return None
    for form in FORMS:
        xx, ww = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        got, _ = _ExactRMSNormFunction.apply(xx, ww, module.variance_epsilon, form)
        grads = torch.autograd.grad(got, (xx, ww), gy)
        if torch.equal(got, want) and all(torch.equal(a, b) for a, b in zip(grads, want_grads)):
            return form
    return None


def exact_form(module: nn.Module) -> str | None:
    """The form of :mod:`actzip.kernels.rms_norm` that ``module`` (a transformers RMSNorm) computes bit for bit,
    forward and backward, at its weight's dtype and device; None if none does or its dtype is not bf16 / fp16.
    Probed once per class, dtype, device, width and eps."""
    if not is_hf_rms_norm(module) or module.weight.dtype not in _DTYPES:
        return None
    w = module.weight
    key = (type(module), w.dtype, str(w.device), w.numel(), module.variance_epsilon)
    if key not in _FORM_OF:
        _FORM_OF[key] = _probe(module)
    return _FORM_OF[key]


def _rebuild_output(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, form: str) -> torch.Tensor:
    return _kernels(x.device).tail(x.reshape(-1, x.shape[-1]), r.view(-1), w, form).view(x.shape)


class ExactRMSNorm(nn.Module):
    """A transformers RMSNorm's exact stand-in that keeps only its input and a float32 scale per row.

    ``original``: the module it replaces (its ``weight`` is shared); ``form``: what :func:`exact_form` found.
    """

    def __init__(self, original: nn.Module, form: str) -> None:
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = original.variance_epsilon
        self.form = form
        self._original_forward = original.forward  # for the inputs it does not take (see the module docstring)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, form={self.form}"

    def _fallback_reason(self, x: torch.Tensor) -> str | None:
        if x.dtype not in _DTYPES:
            return f"input of {x.dtype} (bf16 / fp16 only)"
        if self.weight.dtype != x.dtype:
            return f"weight of {self.weight.dtype} under an input of {x.dtype}"
        if torch.is_autocast_enabled(x.device.type):
            return "autocast is on"
        if not x.is_contiguous():
            return "a non-contiguous input"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        why = self._fallback_reason(x)
        if why is not None:
            runtime.record_fallback("ExactRMSNorm", why, instead="running transformers' forward of the norm "
                                    "(which keeps what its ops keep)")
            return self._original_forward(x)
        with declared_role(NORM):  # what it saves is a norm's for the cache's rules, as transformers' ops' would be
            y, r = _ExactRMSNormFunction.apply(x, self.weight, self.variance_epsilon, self.form)
        if torch.is_grad_enabled() and y.requires_grad:
            mark_rebuildable(y, recompute(_rebuild_output, x, r, self.weight, self.form))
        return y
