"""Triton kernels of the exact RMSNorm (:mod:`actzip.memory.modules.rms_norm`): the elementwise parts of
transformers' RMSNorm forward and of autograd's backward of it, fused, each giving the very bits that PyTorch's
own sequence of ops gives (:mod:`actzip.kernels.rms_norm_reference`, beside it, under the same names).

The norm is ``y = tail(x, r, w)`` with ``r = rsqrt(mean(float(x)², -1) + eps)`` per row, in one of two forms
(:data:`FORMS`): ``w * (float(x) * r).to(dt)`` (Llama's, and Nemotron-H's in older transformers) or
``(float(w) * (float(x) * r)).to(dt)`` (Nemotron-H's in newer ones). The reductions (the mean of squares, the
weight gradient's sum over rows, the per-row sum of the scale's gradient) stay PyTorch's own calls on tensors with
the same bits as autograd's intermediates, so their order of summation is PyTorch's; the kernels do only
elementwise work:

- :func:`squares`: ``float(x)²``, what ``mean`` reduces (one pass instead of a cast and a square);
- :func:`tail`: the output from ``x``, ``r`` and ``w`` (the forward, and the rebuild of the output in backward);
- :func:`grad_parts`: the two products that backward reduces: ``gy * n`` (for the weight's gradient) and
  ``g_n * float(x)`` (for the scale's), ``n`` and ``g_n`` made on the fly;
- :func:`grad_input`: the input's gradient, ``(g_n * r + g_p * (2 * float(x))).to(dt)``, with ``g_p`` the
  per-row gradient of the squares.

Every product and sum is rounded once, as PyTorch rounds it: the kernels are compiled without fused
multiply-adds (``enable_fp_fusion=False``) and round to bf16/fp16 to nearest even, as PyTorch does. Exact on
CUDA (checked against the references on an H200); Triton's CPU interpreter computes in NumPy, which need not
round alike, so there the tests check closeness only.

Inputs: ``x`` and ``gy`` contiguous ``[N, D]`` (bf16 or fp16), ``w`` ``[D]`` of ``x``'s dtype, ``r`` and
``g_p`` ``[N]`` float32. No host synchronization.
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError
from actzip.kernels.rms_norm_reference import FORMS
from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["FORMS", "grad_input", "grad_parts", "squares", "tail"]

_DTYPES = (torch.bfloat16, torch.float16)


# -- device code ------------------------------------------------------------------------------------------


@triton.jit
def _block(pid, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_D)
    inb = (rows[:, None] < N) & (cols[None, :] < D)
    return rows, cols, inb, rows[:, None].to(tl.int64) * D + cols[None, :]


@triton.jit
def _g_n(gy, w, FORM: tl.constexpr, DT: tl.constexpr):
    """The gradient of ``float(x) * r``: ``float((gy * w).to(dt))`` or ``float(gy) * float(w)``."""
    if FORM == 0:
        return (gy * w).to(DT).to(tl.float32)
    return gy * w


@triton.jit
def squares_kernel(x_ptr, p_ptr, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows, cols, inb, offs = _block(tl.program_id(0), N, D, BLOCK_N, BLOCK_D)
    x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    tl.store(p_ptr + offs, x * x, mask=inb)


@triton.jit
def tail_kernel(x_ptr, r_ptr, w_ptr, y_ptr, N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                FORM: tl.constexpr):
    rows, cols, inb, offs = _block(tl.program_id(0), N, D, BLOCK_N, BLOCK_D)
    DT: tl.constexpr = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows, mask=rows < N, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    n = x * r[:, None]
    if FORM == 0:
        y = w[None, :] * n.to(DT).to(tl.float32)
    else:
        y = w[None, :] * n
    tl.store(y_ptr + offs, y.to(DT), mask=inb)


@triton.jit
def grad_parts_kernel(x_ptr, r_ptr, w_ptr, gy_ptr, pw_ptr, pr_ptr, N, D, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, FORM: tl.constexpr):
    rows, cols, inb, offs = _block(tl.program_id(0), N, D, BLOCK_N, BLOCK_D)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows, mask=rows < N, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    gy = tl.load(gy_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    n = x * r[:, None]
    if FORM == 0:
        pw = (gy * n.to(DT).to(tl.float32)).to(DT)
    else:
        pw = gy * n
    tl.store(pw_ptr + offs, pw, mask=inb)
    tl.store(pr_ptr + offs, _g_n(gy, w[None, :], FORM, DT) * x, mask=inb)


@triton.jit
def grad_input_kernel(x_ptr, r_ptr, w_ptr, gy_ptr, gp_ptr, gx_ptr, N, D, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, FORM: tl.constexpr):
    rows, cols, inb, offs = _block(tl.program_id(0), N, D, BLOCK_N, BLOCK_D)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows, mask=rows < N, other=0.0)
    gp = tl.load(gp_ptr + rows, mask=rows < N, other=0.0)
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    gy = tl.load(gy_ptr + offs, mask=inb, other=0.0).to(tl.float32)
    by_scale = _g_n(gy, w[None, :], FORM, DT) * r[:, None]
    by_squares = gp[:, None] * (2.0 * x)
    tl.store(gx_ptr + offs, (by_scale + by_squares).to(DT), mask=inb)


# -- host side --------------------------------------------------------------------------------------------


def _launch(kernel, x: torch.Tensor, *args, **meta) -> None:
    n, d = x.shape
    block_d = triton.next_power_of_2(d)
    block_n = max(1, min(64, 4096 // block_d))
    if n:
        kernel[(triton.cdiv(n, block_n),)](x, *args, n, d, BLOCK_N=block_n, BLOCK_D=block_d,
                                           num_warps=8 if block_n * block_d >= 4096 else 4,
                                           enable_fp_fusion=False, **meta)  # fmt: skip


def _check(x: torch.Tensor, w: torch.Tensor, *rest: torch.Tensor) -> None:
    if x.dim() != 2 or x.dtype not in _DTYPES or not x.is_contiguous():
        raise ConfigError(f"rms_norm kernels: x must be a contiguous [N, D] bf16 or fp16 tensor, got "
                          f"{x.dtype} of shape {tuple(x.shape)}")
    if w.shape != (x.shape[1],) or w.dtype != x.dtype or not w.is_contiguous():
        raise ConfigError(f"rms_norm kernels: w must be [{x.shape[1]}] of {x.dtype}, got {w.dtype} {tuple(w.shape)}")
    for t in rest:
        if t.device != x.device or not t.is_contiguous():
            raise ConfigError("rms_norm kernels: every tensor must be contiguous and on x's device")


def _form(form: str) -> int:
    if form not in FORMS:
        raise ConfigError(f"rms_norm kernels: form must be one of {FORMS}, got {form!r}")
    return FORMS.index(form)


def squares(x: torch.Tensor) -> torch.Tensor:
    """``float(x)²`` of a contiguous ``[N, D]`` bf16/fp16 tensor (float32)."""
    _check(x, torch.empty(x.shape[1], dtype=x.dtype, device=x.device))
    p = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _launch(squares_kernel, x, p)
    return p


def tail(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, form: str) -> torch.Tensor:
    """The norm's output from ``x`` ``[N, D]``, ``r`` ``[N]`` and ``w`` ``[D]``."""
    f = _form(form)
    _check(x, w, r)
    y = torch.empty_like(x)
    _launch(tail_kernel, x, r, w, y, FORM=f)
    return y


def grad_parts(x, r, w, gy, form) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gy * n, g_n * float(x))``, ``[N, D]`` each (the first of ``x``'s dtype in the first form, else float32)."""
    f = _form(form)
    _check(x, w, r, gy)
    pw = torch.empty(x.shape, dtype=x.dtype if f == 0 else torch.float32, device=x.device)
    pr = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _launch(grad_parts_kernel, x, r, w, gy, pw, pr, FORM=f)
    return pw, pr


def grad_input(x, r, w, gy, g_p, form) -> torch.Tensor:
    """The input's gradient ``[N, D]`` (``x``'s dtype), ``g_p`` ``[N]`` float32."""
    f = _form(form)
    _check(x, w, r, gy, g_p)
    gx = torch.empty_like(x)
    _launch(grad_input_kernel, x, r, w, gy, g_p, gx, FORM=f)
    return gx
