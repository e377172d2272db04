"""CARE-LoRA's fitted reconstruction: ``M = (ZᵀZ + λI)⁻¹·Zᵀ·X``, so that ``Z·M`` stands in for ``X`` in grad_A.

The moments ``ZᵀZ`` and ``ZᵀX`` are taken in forward, while ``X`` is at hand (float32, float64 for float64
input; one fit per call or one per group of rows); the ridge systems of all layers of a step are solved together,
in one batched float64 Cholesky factorization per shape, when a backward first needs one of them.
"""

from __future__ import annotations

import math
import threading
import weakref

import torch
import torch.nn.functional as F

__all__ = [
    "PendingFits",
    "cached_gaussian_projection",
    "fit_dtype",
    "fit_group_moments",
    "fit_moments",
    "fit_reconstruction",
    "orthonormal_rows",
    "pending_fits",
    "solve_ridge",
]


def fit_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype the fit of ``t`` runs in: float64 for float64, float32 otherwise."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _solve_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "mps" else torch.float64  # the r x r solve, where float64 exists


def fit_moments(z: torch.Tensor, h: torch.Tensor, rows: torch.Tensor | None = None,
                chunk_rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ZᵀWZ, ZᵀWH)`` in float32 (float64 for float64 input), ``W`` the row mask; ``z`` ``[N, r]``, ``h``
    ``[N, d]``. A 16-bit ``h`` is cast ``chunk_rows`` rows at a time, never all of it at once."""
    work = fit_dtype(z)
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
    n, work = z.shape[0], fit_dtype(z)
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
    return rows.masked_fill_(info != 0, math.nan).to(fit_dtype(a))


class PendingFits:
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


def pending_fits() -> PendingFits:
    """The group of systems a layer's fit joins now: the open one, or a new one once the open one was solved."""
    group = _OPEN_FITS[0]() if _OPEN_FITS[0] is not None else None
    if group is None or group.solutions is not None:
        group = PendingFits()
        _OPEN_FITS[0] = weakref.ref(group)
    return group


_PROJECTIONS: dict[tuple, torch.Tensor] = {}


def cached_gaussian_projection(d: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fixed Gaussian ``[k, d]`` matrix (seed 0, scaled by ``1/sqrt(d)``), one per shape, dtype and device.

    Fixed, not redrawn: ``M`` is refitted every step, so any full-rank ``Ω`` serves, and a cached one costs no
    kernel per step. Unlike :func:`actzip.codecs.sketch.sketch_matrix` (``d x k``, ``E[S·Sᵀ] = I``, a codec's
    unbiased sketch), nothing is decoded through it: only its span matters, and the ``1/sqrt(d)`` scale keeps
    the entries of ``S = X·Ωᵀ`` at the scale of ``X``'s.
    """
    key = (d, k, dtype, device)
    if key not in _PROJECTIONS:
        g = torch.Generator().manual_seed(0)
        _PROJECTIONS[key] = (torch.randn(k, d, generator=g, dtype=torch.float64) / math.sqrt(d)).to(device, dtype)
    return _PROJECTIONS[key]
