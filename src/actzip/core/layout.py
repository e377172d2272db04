"""Tensors in memory order: the 1-D view every codec and kernel reads, and the way back to the tensor's layout.

Codecs work over a tensor's elements in the order they lie in memory, so a transposed or channels-last tensor
needs no copy, and it comes back with its own strides. :func:`memory_order` gives that 1-D view (copying only a
view with gaps), :func:`memory_rows` the rows of such a view that a kernel can read in place, and
:func:`restore_order` the inverse of :func:`memory_order`.
"""

from __future__ import annotations

import torch

__all__ = ["memory_order", "memory_perm", "memory_rows", "restore_order"]


def _stride_order(x: torch.Tensor) -> tuple[int, ...]:
    # Largest stride first; for ties (size-1 dims) keep the original order so the permutation is stable.
    return tuple(sorted(range(x.dim()), key=lambda d: (-x.stride(d), d)))


def memory_perm(x: torch.Tensor) -> tuple[int, ...] | None:
    """The ``perm`` :func:`memory_order` (and :func:`memory_rows`) return for ``x``, from its strides alone."""
    if x.is_contiguous():
        return None
    perm = _stride_order(x)
    return None if perm == tuple(range(x.dim())) else perm


def memory_order(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """A 1-D view of ``x`` in memory order, and the dimension order that undoes it.

    Returns ``(flat, perm)``: ``x.permute(perm)`` in row-major order is ``flat``. For a dense layout (any
    order of dimensions) that is ``x``'s own memory, so no copy is made. A view with gaps (a slice of a wider
    tensor: attention's q, k and v cut from one projection) is copied, in its own order of strides, so that
    :func:`restore_order` gives back the same order of strides: a consumer that wanted the view's layout
    (cuDNN attention's backward) then needs no second copy. ``perm`` is ``None`` for row-major order.
    """
    if x.is_contiguous():
        return x.reshape(-1), None
    perm = _stride_order(x)
    xp = x.permute(perm)
    if perm == tuple(range(x.dim())):
        perm = None
    return (xp if xp.is_contiguous() else xp.contiguous()).reshape(-1), perm


def memory_rows(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, tuple[int, ...] | None] | None:
    """A view with gaps as ``(rows, L)`` rows that lie ``S > L`` elements apart, in its order of strides.

    Returns ``(rows, perm)`` when ``x`` is such a view (attention's q, k and v cut from one projection: rows of
    ``d`` elements, ``3 d`` apart) and ``L`` is a multiple of ``multiple``: ``rows`` read row after row is what
    :func:`memory_order` would copy, with the same ``perm``, so a kernel can read it in place. ``None`` otherwise.
    """
    if x.dim() < 2 or x.numel() == 0 or x.is_contiguous():
        return None
    perm = _stride_order(x)
    xp = x.permute(perm)
    if xp.is_contiguous():
        return None
    shape, stride = xp.shape, xp.stride()
    j, inner = xp.dim(), 1  # the dense block at the end: the row
    while j > 0 and (shape[j - 1] == 1 or stride[j - 1] == inner):
        inner *= shape[j - 1]
        j -= 1
    row_stride, rows = None, 1  # the dimensions before it: one run of rows, row_stride apart
    for d in range(j - 1, -1, -1):
        if shape[d] == 1:
            continue
        row_stride = stride[d] if row_stride is None else row_stride
        if stride[d] != row_stride * rows:
            return None
        rows *= shape[d]
    if row_stride is None or row_stride <= inner or inner % multiple:
        return None
    return x.as_strided((rows, inner), (row_stride, 1)), (None if perm == tuple(range(x.dim())) else perm)


def restore_order(flat: torch.Tensor, shape: torch.Size, perm: tuple[int, ...] | None) -> torch.Tensor:
    """Inverse of :func:`memory_order` on a contiguous 1-D tensor."""
    if perm is None:
        return flat.reshape(shape)
    permuted = flat.reshape([shape[d] for d in perm])
    inverse = [0] * len(perm)
    for i, d in enumerate(perm):
        inverse[d] = i
    return permuted.permute(inverse)
