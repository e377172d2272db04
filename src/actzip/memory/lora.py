"""LoRA linear layers that keep the low-rank ``Z = X·Aᵀ`` for backward instead of the input ``X``.

A LoRA linear computes ``y = base(X) + s·(Z·Bᵀ + b_B)`` with ``Z = drop(X)·Aᵀ``. With the base weight frozen,
backward needs ``X`` only for ``grad_A = dZᵀ·drop(X)`` (``dZ = s·dY·B``): ``grad_X = dY·W + drop'(dZ·A)`` and
``grad_B = s·dYᵀ·Z`` need no ``X``. :class:`LoRALinearFunction` runs the whole layer (base and branch) as one
autograd function, so that autograd keeps, besides the parameters, only:

- ``"lora"``: the branch input ``drop(X)``; every gradient exact (the reference);
- ``"fa"`` (LoRA-FA, ``A`` frozen): ``Z`` only;
- ``"care"`` (CARE-LoRA): ``Z`` and what ``M = (ZᵀZ + λI)⁻¹·Zᵀ·drop(X)`` (``r x d_in``, float32) needs:
  ``ZᵀZ`` and ``Zᵀ·drop(X)``, computed in forward while ``X`` is at hand; the ridge systems of all layers are solved
  together when backward first needs one. ``grad_A ≈ (dZᵀ·Z)·M``, the exact gradient with ``drop(X)`` replaced by
  its least-squares reconstruction ``Z·M`` from ``Z``. Exact when the rows of ``drop(X)`` lie in an
  ``r``-dimensional space that ``A`` maps one to one (up to the ridge ``λ``). ``extra_rank=k`` also keeps a
  ``k``-column sketch ``S = drop(X)·Ω`` and reconstructs from ``[Z, S]`` (``power_iters`` turns ``Ω`` toward
  ``X``'s strongest directions first); ``fit_group_rows=g`` fits one ``M`` per ``g`` tokens.

In all three, the output, ``grad_X``, ``grad_B`` and the bias gradients are bit-identical to peft's
``lora_B(lora_A(dropout(x))) * scaling`` added to ``base(x)`` under autograd: the backward issues the same matmuls
in the same order and layout. The dropout mask (same draws as ``F.dropout``) is kept as 1 bit per element, as
1 byte (``dropout_mask="bool"``), or not at all (``"regenerate"``: the RNG state is kept and backward draws the
mask again).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from actzip.codecs.bitpack import pack_bool, unpack_bool
from actzip.errors import ConfigError
from actzip.memory.saved import record_external

METHODS = ("lora", "fa", "care")
DROPOUT_MASKS = ("bitmask", "bool", "regenerate")

# Rows of the current batch that are real tokens (1) or padding (0), flattened; None: all rows count.
_ROW_MASK: contextvars.ContextVar[torch.Tensor | None] = contextvars.ContextVar("actzip_lora_row_mask", default=None)


@dataclass
class LoRACompression:
    """How a LoRA linear keeps what its backward needs."""

    method: str = "care"  # "care": Z and M; "fa": Z only, A frozen (LoRA-FA); "lora": the branch input (exact)
    lam: float = 1e-6  # ridge of the M fit, relative to the mean eigenvalue trace(ZᵀZ)/r (> 0: robust when singular)
    fit_chunk_rows: int = 4096  # rows of X cast to float32 at a time while fitting M (bounds the temporary)
    extra_rank: int = 0  # "care": also keep S = X·Ω (k Gaussian columns, X's dtype) and fit M on [Z, S]
    # "care" with extra_rank: passes of X·(Xᵀ·) that turn the sketch's Gaussian directions toward X's top right
    # singular vectors before S is kept (each pass two N x d x k products; 0: the plain Gaussian sketch)
    power_iters: int = 0
    # "care": 0 fits one M to all rows of a call; g > 0 fits one M to every g consecutive rows (tokens), which
    # reconstructs X from r dimensions per g rows instead of r in all, for r·d float32 numbers per g rows
    fit_group_rows: int = 0
    # dropout mask kept as "bitmask" (1 bit per element), "bool" (1 byte, no packing passes) or not at all:
    # "regenerate" keeps the RNG state and draws the mask again in backward
    dropout_mask: str = "bitmask"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"LoRA method {self.method!r} is unknown; choose one of {list(METHODS)}")
        if isinstance(self.lam, bool) or not isinstance(self.lam, (int, float)) or not (0 < self.lam < math.inf):
            raise ConfigError(f"LoRA option lam must be a positive finite number (the ridge keeps the fit solvable "
                              f"when ZᵀZ is singular), got {self.lam!r}")
        if isinstance(self.fit_chunk_rows, bool) or not isinstance(self.fit_chunk_rows, int) or self.fit_chunk_rows < 1:
            raise ConfigError(f"LoRA option fit_chunk_rows must be a positive int, got {self.fit_chunk_rows!r}")
        if isinstance(self.extra_rank, bool) or not isinstance(self.extra_rank, int) or self.extra_rank < 0:
            raise ConfigError(f"LoRA option extra_rank must be an int >= 0, got {self.extra_rank!r}")
        if self.extra_rank and self.method != "care":
            raise ConfigError(f"LoRA option extra_rank applies to method 'care' only, not {self.method!r}")
        q = self.power_iters
        if isinstance(q, bool) or not isinstance(q, int) or q < 0:
            raise ConfigError(f"LoRA option power_iters must be an int >= 0, got {q!r}")
        if q and not self.extra_rank:
            raise ConfigError("LoRA option power_iters refines the extra_rank sketch: set extra_rank > 0 with it")
        g = self.fit_group_rows
        if isinstance(g, bool) or not isinstance(g, int) or g < 0:
            raise ConfigError(f"LoRA option fit_group_rows must be an int >= 0 (0: one fit per call), got {g!r}")
        if g and self.method != "care":
            raise ConfigError(f"LoRA option fit_group_rows applies to method 'care' only, not {self.method!r}")
        if self.dropout_mask not in DROPOUT_MASKS:
            raise ConfigError(f"LoRA option dropout_mask must be one of {list(DROPOUT_MASKS)}, got "
                              f"{self.dropout_mask!r}")


@contextlib.contextmanager
def row_mask(mask: torch.Tensor | None):
    """Within the block, fit ``M`` on the rows where ``mask`` is non-zero (padding rows left out).

    ``mask`` is a ``[batch, seq]`` attention mask (1 = token, 0 = padding); a layer whose input has a different
    number of rows fits on all of them and counts a ``mask_mismatch`` in its stats.
    """
    token = _ROW_MASK.set(None if mask is None else mask.reshape(-1).float())  # converted once, not per layer
    try:
        yield
    finally:
        _ROW_MASK.reset(token)


def current_row_mask() -> torch.Tensor | None:
    """The flattened mask set by the innermost :func:`row_mask` block, if any."""
    return _ROW_MASK.get()


# -- the fit ------------------------------------------------------------------------------------------------


def _fit_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _solve_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # the r x r solve, where float64 exists


def fit_moments(z: torch.Tensor, h: torch.Tensor, rows: torch.Tensor | None = None,
                chunk_rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ZᵀWZ, ZᵀWH)`` in float32 (float64 for float64 input), ``W`` the row mask; ``z`` ``[N, r]``, ``h``
    ``[N, d]``. A 16-bit ``h`` is cast ``chunk_rows`` rows at a time, never all of it at once."""
    work = _fit_dtype(z)
    zf = z.to(work)
    zw = zf if rows is None else zf * rows.to(work)[:, None]
    gram = zw.t().mm(zf)
    if h.dtype == work:
        return gram, zw.t().mm(h)
    cross = torch.zeros(zf.shape[1], h.shape[1], dtype=work, device=h.device)
    for i in range(0, h.shape[0], chunk_rows):
        cross.addmm_(zw[i:i + chunk_rows].t(), h[i:i + chunk_rows].to(work))
    return gram, cross


def fit_group_moments(z: torch.Tensor, h: torch.Tensor, group: int, rows: torch.Tensor | None = None,
                      chunk_rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fit_moments` of every ``group`` consecutive rows: ``[G, r, r]`` and ``[G, r, d]``, ``G =
    ceil(N / group)`` (the last group may be short). 16-bit ``h`` is cast about ``chunk_rows`` rows at a time."""
    n, work = z.shape[0], _fit_dtype(z)
    pad = -n % group
    zf = F.pad(z.to(work), (0, 0, 0, pad))
    zw = zf if rows is None else zf * F.pad(rows.to(work), (0, pad))[:, None]
    zf, zw = zf.view(-1, group, zf.shape[1]), zw.view(-1, group, zf.shape[1])
    gram = zw.transpose(1, 2).bmm(zf)
    hp = F.pad(h, (0, 0, 0, pad)).view(-1, group, h.shape[1])
    cross = torch.empty(hp.shape[0], zf.shape[2], h.shape[1], dtype=work, device=h.device)
    step = max(1, chunk_rows // group)
    for i in range(0, hp.shape[0], step):
        torch.bmm(zw[i:i + step].transpose(1, 2), hp[i:i + step].to(work), out=cross[i:i + step])
    return gram, cross


def solve_ridge(grams: torch.Tensor, crosses: torch.Tensor, lam: float) -> torch.Tensor:
    """``(G + λI)⁻¹·C`` for a batch ``grams`` ``[n, r, r]``, ``crosses`` ``[n, r, d]``; ``λ = lam·trace(G)/r``
    plus the smallest normal float64, so the system is positive definite even for a zero or rank-deficient ``Z``.

    One batched ``cholesky_ex`` in float64 (no host synchronization); a system it still cannot factor (non-finite
    input) gives NaN, never a finite guess. The result has ``crosses``' dtype.
    """
    solve = _solve_dtype(grams.device)
    g = grams.to(solve, copy=True)  # the ridge is added in place
    r = g.shape[-1]
    ridge = torch.add(torch.finfo(solve).tiny, g.diagonal(dim1=-2, dim2=-1).sum(-1), alpha=lam / r)
    g.diagonal(dim1=-2, dim2=-1).add_(ridge[:, None])
    chol, info = torch.linalg.cholesky_ex(g)
    m = torch.cholesky_solve(crosses.to(solve), chol)
    return m.masked_fill_((info != 0)[:, None, None], math.nan).to(crosses.dtype)


def fit_reconstruction(z: torch.Tensor, h: torch.Tensor, lam: float, rows: torch.Tensor | None = None,
                       chunk_rows: int = 4096) -> torch.Tensor:
    """``M = (ZᵀWZ + λI)⁻¹·ZᵀWH`` ``[r, d]`` (``W`` the row mask): :func:`fit_moments` then :func:`solve_ridge`."""
    gram, cross = fit_moments(z, h, rows, chunk_rows)
    return solve_ridge(gram[None], cross[None], lam)[0]


def orthonormal_rows(a: torch.Tensor) -> torch.Tensor:
    """Rows spanning the row space of ``a`` (``[k, d]``, k <= d), orthonormal: Cholesky QR in float64 (float32
    where float64 is missing), ``L⁻¹·a`` with ``L·Lᵀ = a·aᵀ`` (plus a ridge of 1e-12 of its trace, for rank
    deficiency). No host synchronization; a factorization that fails gives NaN. Returns float32 (float64 for
    float64 input)."""
    solve = _solve_dtype(a.device)
    x = a.to(solve)
    g = x.mm(x.t())
    g.diagonal().add_(torch.finfo(solve).tiny + 1e-12 * g.diagonal().sum())
    chol, info = torch.linalg.cholesky_ex(g)
    rows = torch.linalg.solve_triangular(chol, x, upper=False)
    return rows.masked_fill_(info != 0, math.nan).to(_fit_dtype(a))


class _PendingFits:
    """The ridge systems of the layers run since the last solve, solved together (one batched factorization per
    shape) when a backward first needs one of them: a few kernels per step instead of a dozen per layer."""

    def __init__(self) -> None:
        self.items: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self.solutions: list[torch.Tensor] | None = None
        self.lock = threading.Lock()

    def add(self, gram: torch.Tensor, cross: torch.Tensor, lam: float) -> int:
        """One layer call's systems: ``gram`` ``[G, r, r]``, ``cross`` ``[G, r, d]`` (G fits of its rows)."""
        with self.lock:
            self.items.append((gram, cross, lam))
            return len(self.items) - 1

    def solution(self, i: int) -> torch.Tensor:
        """Item ``i``'s ``M``: ``[G, r, d]``."""
        with self.lock:
            if self.solutions is None:
                self.solutions = [None] * len(self.items)
                groups: dict[tuple, list[int]] = {}
                for j, (g, c, lam) in enumerate(self.items):
                    groups.setdefault((tuple(c.shape[1:]), c.dtype, c.device, lam), []).append(j)
                for (_, _, _, lam), idx in groups.items():
                    ms = solve_ridge(torch.cat([self.items[j][0] for j in idx]),
                                     torch.cat([self.items[j][1] for j in idx]), lam)
                    for j, m in zip(idx, ms.split([self.items[j][0].shape[0] for j in idx])):
                        self.solutions[j] = m
                self.items = []  # the moments are no longer needed here (each layer's backward still holds its own)
            return self.solutions[i]


_OPEN_FITS: list = [None]  # weak reference to the group new fits join, until it is solved


def _pending_fits() -> _PendingFits:
    group = _OPEN_FITS[0]() if _OPEN_FITS[0] is not None else None
    if group is None or group.solutions is not None:
        group = _PendingFits()
        _OPEN_FITS[0] = weakref.ref(group)
    return group


_SKETCHES: dict[tuple, torch.Tensor] = {}


def sketch_matrix(d: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fixed Gaussian ``[k, d]`` matrix (seed 0, scaled by ``1/sqrt(d)``), one per shape, dtype and device.

    Fixed, not redrawn: ``M`` is refitted every step, so any full-rank ``Ω`` serves, and a cached one costs no
    kernel per step.
    """
    key = (d, k, dtype, device)
    if key not in _SKETCHES:
        g = torch.Generator().manual_seed(0)
        _SKETCHES[key] = (torch.randn(k, d, generator=g, dtype=torch.float64) / math.sqrt(d)).to(device, dtype)
    return _SKETCHES[key]


# -- dropout masks: kept as bits, or drawn again from the saved RNG state -------------------------------------


def _rng_module(device: torch.device):
    if device.type == "cpu":
        return torch
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "get_rng_state") or not hasattr(mod, "set_rng_state"):
        raise ConfigError(f"LoRA dropout on device {device}: its RNG state cannot be saved, so the mask could not "
                          "be regenerated in backward; use lora_dropout=0 there")
    return mod


def _rng_state(device: torch.device) -> torch.Tensor:
    mod = _rng_module(device)
    return mod.get_rng_state() if device.type == "cpu" else mod.get_rng_state(device)


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    mod = _rng_module(device)
    if device.type == "cpu":
        mod.set_rng_state(state)
    else:
        mod.set_rng_state(state, device)


_FUSED_DROPOUT = ("cuda", "xpu", "lazy", "privateuseone")  # where F.dropout runs native_dropout (ATen's choice)


def dropout_with_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.dropout(x, p, True)``, the same draws and output, and its keep-mask (bool).

    It runs what ``F.dropout`` runs: ``native_dropout`` where ATen fuses it, elsewhere ATen's composite
    ``x * (bernoulli(1 - p) / (1 - p))``.
    """
    if x.device.type in _FUSED_DROPOUT and x.numel() > 0:
        return torch.native_dropout(x, p, True)
    noise = torch.empty_like(x).bernoulli_(1 - p)
    mask = noise != 0
    return x * noise.div_(1 - p), mask


def dropout_backward_from_mask(grad: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """The gradient through :func:`dropout_with_mask`, computed as autograd computes it for ``F.dropout``."""
    if grad.device.type in _FUSED_DROPOUT:
        return torch.ops.aten.native_dropout_backward(grad, mask, 1.0 / (1.0 - p))
    return grad * mask.to(grad.dtype).div_(1 - p)


def _pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """The keep-mask as bits (:func:`actzip.codecs.bitpack.pack_bool`'s layout; :func:`unpack_bool` reads it back)."""
    flat = mask.reshape(-1)
    return pack_bool(F.pad(flat, (0, -flat.numel() % 8)) if flat.numel() % 8 else flat)


def _dropout_backward(grad: torch.Tensor, p: float, state: torch.Tensor, like: tuple) -> torch.Tensor:
    """The gradient through ``F.dropout(·, p)`` as it ran in forward, from the RNG state saved before it.

    Re-running the same dropout call on a zero tensor of the input's shape, dtype and strides draws the same mask
    (the draw does not depend on the values), and autograd's own dropout backward applies it: bit-identical.
    The generator is put back as it was afterwards.
    """
    shape, stride, dtype, device = like
    current = _rng_state(device)
    _set_rng_state(device, state)
    try:
        with torch.enable_grad():
            t = torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_().requires_grad_()
            (g,) = torch.autograd.grad(F.dropout(t, p, True), t, grad)
    finally:
        _set_rng_state(device, current)
    return g


# -- the autograd function ------------------------------------------------------------------------------------


class LoRALinearFunction(torch.autograd.Function):
    """``base(x) + scale·lora_B(lora_A(dropout(x)))``, saving what ``method`` keeps (see the module docstring).

    Positional arguments: ``x, x_again, weight, bias, a, b, b_bias`` (tensors; biases may be None; ``x_again`` is
    ``x`` itself, or its autocast copy: the two edges return the branch's and the base's input gradients
    separately, branch first, so autograd's engine sums them with the other users of ``x`` in the order it sums
    plain LoRA's), ``scale`` (float), ``p`` (dropout probability, 0 when not training), ``cast_to`` (dtype that
    ``x`` is cast to before dropout, as peft does, or None; the dropped input is then cast to ``a``'s dtype if it
    differs, as autocast does), ``cfg`` (:class:`LoRACompression`), ``rows`` (flattened row mask or None),
    ``stats`` (dict of counters or None).
    """

    @staticmethod
    def forward(ctx, x, x_again, weight, bias, a, b, b_bias, scale, p, cast_to, cfg, rows, stats):
        base = F.linear(x_again, weight, bias)
        xa = x.to(cast_to) if cast_to is not None and x.dtype != cast_to else x
        state = packed = None
        if p > 0 and cfg.dropout_mask == "regenerate":
            state = _rng_state(x.device)
            dropped = F.dropout(xa, p, True)
        elif p > 0:
            dropped, mask = dropout_with_mask(xa, p)
            packed = mask if cfg.dropout_mask == "bool" else _pack_mask(mask)
            del mask
        else:
            dropped = xa
        h = dropped.to(a.dtype)
        z = F.linear(h, a)
        u = F.linear(z, b, b_bias)
        us = u * scale
        total = base + us
        out = total.to(base.dtype)

        ctx.scale, ctx.p, ctx.state = scale, p, state
        ctx.like = (xa.shape, xa.stride(), xa.dtype, xa.device)
        ctx.dtypes = (x.dtype, dropped.dtype, base.dtype, us.dtype, total.dtype)
        ctx.has_b_bias = b_bias is not None
        method = cfg.method
        keep = gram = sketch = None
        if method == "lora" and ctx.needs_input_grad[4]:
            keep = h
        elif method == "care" and ctx.needs_input_grad[4]:
            n = z.numel() // z.shape[-1]
            if rows is not None and rows.numel() != n:
                rows = None
                if stats is not None:
                    stats["mask_mismatch"] = stats.get("mask_mismatch", 0) + 1
            h2, basis = h.reshape(n, -1), z.reshape(n, -1)
            if cfg.extra_rank:
                sketch = F.linear(h2, sketch_matrix(h2.shape[1], cfg.extra_rank, h.dtype, h.device))
                for _ in range(cfg.power_iters):  # S = X·W, W's rows an orthonormal basis of the rows of SᵀX
                    sketch = F.linear(h2, orthonormal_rows(sketch.t().mm(h2)).to(h.dtype))
                basis = torch.cat([basis.to(_fit_dtype(z)), sketch.to(_fit_dtype(z))], 1)
            if cfg.fit_group_rows:
                gram, keep = fit_group_moments(basis, h2, cfg.fit_group_rows, rows, cfg.fit_chunk_rows)
            else:
                gram, keep = (t[None] for t in fit_moments(basis, h2, rows, cfg.fit_chunk_rows))
            ctx.fits = _pending_fits()
            ctx.fit_index = ctx.fits.add(gram, keep, cfg.lam)
        ctx.method = method if keep is not None else "fa"
        ctx.group = cfg.fit_group_rows
        # for "care", keep = [Z, S]ᵀX and gram = [Z, S]ᵀ[Z, S] (the solve's inputs, also held by the pending group)
        ctx.save_for_backward(weight, a, b, z, keep, gram, sketch, packed)
        if stats is not None:
            stats["calls"] = stats.get("calls", 0) + 1
        if method != "lora":
            # what plain LoRA would have kept of X and is not kept here (Z and M are accounted by the cache's hooks)
            record_external(f"lora_{method}:input_not_kept", h.numel() * h.element_size(), 0)
        return out

    @staticmethod
    def backward(ctx, grad):
        weight, a, b, z, keep, _, sketch, packed = ctx.saved_tensors
        x_dtype, dropped_dtype, base_dtype, us_dtype, total_dtype = ctx.dtypes
        need = ctx.needs_input_grad
        # The casts below are the ones autograd's engine inserts (ToCopyBackward, and an input's dtype check).
        g_total = grad.to(total_dtype)
        g_base = g_total.to(base_dtype).reshape(-1, weight.shape[0])
        g_u = (g_total.to(us_dtype) * ctx.scale).reshape(-1, b.shape[0])
        z2 = z.reshape(-1, z.shape[-1])
        grad_x = grad_x_base = grad_w = grad_bias = grad_a = grad_b = grad_b_bias = None
        if need[5]:
            grad_b = g_u.t().mm(z2)
        if ctx.has_b_bias and need[6]:
            grad_b_bias = g_u.sum(0)
        if need[0] or need[4]:
            dz = g_u.mm(b)
            if need[4]:
                if ctx.method == "lora":
                    grad_a = dz.t().mm(keep.reshape(dz.shape[0], -1))
                else:  # Σ over fit groups of (dZᵀZ)·M: r x r first, never N x d
                    m = ctx.fits.solution(ctx.fit_index)
                    basis = z2.to(m.dtype)
                    if sketch is not None:
                        basis = torch.cat([basis, sketch.to(m.dtype)], 1)
                    dzf = dz.to(m.dtype)
                    if m.shape[0] == 1:
                        k = dzf.t().mm(basis)
                    else:
                        pad = m.shape[0] * ctx.group - dzf.shape[0]
                        k = torch.bmm(F.pad(dzf, (0, 0, 0, pad)).view(m.shape[0], ctx.group, -1).transpose(1, 2),
                                      F.pad(basis, (0, 0, 0, pad)).view(m.shape[0], ctx.group, -1))
                        k = k.transpose(0, 1).reshape(dz.shape[1], -1)  # [r, G·r'], matching M stacked below
                    grad_a = k.mm(m.reshape(-1, m.shape[-1])).to(a.dtype)
            if need[0]:
                shape = ctx.like[0]
                g_h = dz.mm(a).reshape(shape).to(dropped_dtype)
                if packed is not None:
                    mask = packed if packed.dtype == torch.bool else unpack_bool(packed, g_h.numel()).reshape(shape)
                    g_h = dropout_backward_from_mask(g_h, mask, ctx.p)
                elif ctx.p > 0:
                    g_h = _dropout_backward(g_h, ctx.p, ctx.state, ctx.like)
                grad_x = g_h.to(x_dtype)
        if need[1]:
            grad_x_base = g_base.mm(weight).reshape(ctx.like[0])
        if need[3]:
            grad_bias = g_base.sum(0)
        return (grad_x, grad_x_base, grad_w, grad_bias, grad_a, grad_b, grad_b_bias,
                None, None, None, None, None, None)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor,
                b_bias: torch.Tensor | None = None, *, scale: float, p: float = 0.0, cast: bool = True,
                config: LoRACompression | None = None, rows: torch.Tensor | None = None,
                stats: dict | None = None) -> torch.Tensor:
    """Functional form of a compressed LoRA linear (``weight`` and ``bias`` of the frozen base layer).

    ``p`` is the dropout probability applied to the branch input (pass 0 outside training). ``rows`` defaults to
    the mask of the enclosing :func:`row_mask` block. The base weight must be frozen: its gradient would need X.
    """
    cfg = config or LoRACompression()
    if weight.requires_grad:
        raise ConfigError("lora_linear: the base weight requires grad; its gradient needs X, which a compressed "
                          "LoRA layer does not keep (freeze it, or use plain LoRA for this layer)")
    if rows is None:
        rows = current_row_mask()
    if cfg.method == "fa" and a.requires_grad:
        raise ConfigError("lora_linear: method 'fa' (LoRA-FA) keeps no input for grad_A, but lora_A requires grad; "
                          "freeze lora_A or choose method 'care'")
    cast_to = a.dtype if cast else None  # peft's cast of the branch input to the adapter's dtype
    kind = x.device.type
    if torch.is_autocast_enabled(kind):  # run the function in the autocast dtype, as F.linear would, with casts
        dt = torch.get_autocast_dtype(kind)  # outside it (so lora_A / lora_B get float32 gradients back)

        def low(t):
            return t.to(dt) if t is not None and t.is_floating_point() and t.dtype not in (dt, torch.float64) else t

        with torch.autocast(kind, enabled=False):
            # as under peft: the base gets a cast copy of x; the branch casts after dropout (same masks, and the
            # two input gradients meet in x's own dtype, in the same order)
            return LoRALinearFunction.apply(x, low(x), low(weight), low(bias), low(a), low(b), low(b_bias),
                                            float(scale), float(p), cast_to, cfg, rows, stats)
    return LoRALinearFunction.apply(x, x, weight, bias, a, b, b_bias, float(scale), float(p), cast_to, cfg, rows,
                                    stats)


# -- the standalone module ------------------------------------------------------------------------------------


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a LoRA adapter, trained with compressed activations; no peft needed.

    Parameters follow peft's names and shapes (``lora_A.weight`` ``[r, in]``, ``lora_B.weight`` ``[out, r]``,
    ``scaling = alpha / r``, ``A`` Kaiming-uniform and ``B`` zero at init), so state dicts load into a peft
    ``lora.Linear`` and back.

    Args:
      base: the layer to adapt (frozen here, and shared, not copied).
      rank, alpha: LoRA rank ``r`` and ``alpha`` (default ``alpha = r``).
      dropout: dropout probability on the branch input.
      method, lam, fit_chunk_rows, extra_rank, dropout_mask: see :class:`LoRACompression`. ``"fa"`` freezes
        ``lora_A``.
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float | None = None, dropout: float = 0.0,
                 method: str = "care", lam: float = 1e-6, fit_chunk_rows: int = 4096, extra_rank: int = 0,
                 dropout_mask: str = "bitmask") -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ConfigError(f"LoRALinear adapts an nn.Linear, got {type(base).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ConfigError(f"LoRALinear: rank must be a positive int, got {rank!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ConfigError(f"LoRALinear: dropout must be in [0, 1), got {dropout!r}")
        self.config = LoRACompression(method=method, lam=lam, fit_chunk_rows=fit_chunk_rows, extra_rank=extra_rank,
                                      dropout_mask=dropout_mask)
        self.base = base.requires_grad_(False)
        dd = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **dd)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **dd)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        if method == "fa":
            self.lora_A.requires_grad_(False)
        self.rank, self.scaling, self.dropout = rank, (rank if alpha is None else alpha) / rank, float(dropout)
        self.stats: dict[str, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        a, b = self.lora_A.weight, self.lora_B.weight
        if not (torch.is_grad_enabled() and (x.requires_grad or a.requires_grad or b.requires_grad)):
            h = F.dropout(x, p, True) if p > 0 else x
            return self.base(x) + F.linear(F.linear(h, a), b) * self.scaling
        return lora_linear(x, self.base.weight, self.base.bias, a, b, scale=self.scaling, p=p,
                           config=self.config, stats=self.stats)

    def delta_weight(self) -> torch.Tensor:
        """``scaling · B·A``, what merging adds to the base weight."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}, dropout={self.dropout}, method={self.config.method!r}"


# -- accounting -----------------------------------------------------------------------------------------------


def saved_bytes_by_module(model: nn.Module, run: Callable[[], object], modules: dict[str, nn.Module] | None = None):
    """Run ``run()`` (a forward) and attribute every tensor autograd saves to the innermost module of ``modules``
    (default: all named submodules) being called; return ``(bytes by module name, output of run)``.

    Each storage counts once, in full (a saved view keeps its whole storage alive), at the first module that
    saved it; parameters and buffers of ``model`` are left out. Tensors saved outside any listed module go under
    ``""``. Saved tensors are kept as they are: backward on the output works as usual.
    """
    if modules is None:
        modules = dict(model.named_modules())
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    stack: list[str] = []
    seen: set[int] = set()
    totals: dict[str, int] = {}

    def pack(t: torch.Tensor):
        if t.layout == torch.strided and not t.is_nested and t.device.type != "meta":
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in skip and ptr not in seen:
                seen.add(ptr)
                name = stack[-1] if stack else ""
                totals[name] = totals.get(name, 0) + s.nbytes()
        # Not t itself: a tensor saved as an output of its own node would then hold that node through its grad_fn,
        # a cycle no collector sees, and the whole graph would never be freed. The alias shares storage and version.
        return t.detach()

    def enter(name):
        return lambda mod, args: stack.append(name)

    def leave(mod, args, out):
        stack.pop()

    handles = []
    for name, mod in modules.items():
        handles.append(mod.register_forward_pre_hook(enter(name)))
        handles.append(mod.register_forward_hook(leave, always_call=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run()
    finally:
        for hd in handles:
            hd.remove()
    return totals, out
