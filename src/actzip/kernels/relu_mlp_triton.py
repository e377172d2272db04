"""Triton kernels that use a sparse payload of ``r = relu(h)`` directly in backward.

- :func:`relu_grad_kernel`: the gradient w.r.t. ``h`` from the gradient w.r.t. ``relu(h)`` (or
  ``relu(h)²``) and the payload, with no dense ``r`` in memory. Oracle:
  :func:`actzip.memory.relu_mlp.relu_grad_from_payload`.
- :func:`activation_kernel`: ``r`` or ``r²`` rebuilt from the payload in one pass (for the weight gradient
  of the down projection). Oracle: :func:`actzip.memory.relu_mlp.activation_from_payload`.

Both reproduce PyTorch's arithmetic exactly: for 16-bit floats PyTorch computes an elementwise product in
float32 and rounds once to the storage type (round to nearest even), and so do these kernels; ``2 * r`` is
exact. The threshold is ``r <= 0 -> 0`` as in ``threshold_backward`` (so NaN passes, -0.0 gives 0).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from actzip.core.errors import ConfigError
from actzip.kernels.sparse_triton import _base, _num_warps, _width, check_tile_size, load_tile_bits

_FLOAT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
_BITS = {torch.float32: tl.int32, torch.float16: tl.int16, torch.bfloat16: tl.int16}


@triton.jit
def relu_grad_kernel(
    grad_ptr,
    out_ptr,
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base_ptr,
    n,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
    FLOAT_DTYPE: tl.constexpr,
    SQUARE: tl.constexpr,
):
    tile = tl.program_id(0)
    bits, stored = load_tile_bits(
        mask_ptr, tile_offsets_ptr, values_ptr, tl.load(values_base_ptr), tile, T, WIDTH, SIGN_PACK, BITS_DTYPE
    )
    r = bits.to(FLOAT_DTYPE, bitcast=True)
    local = tl.arange(0, T)  # 32-bit per element; the tile's start is a scalar offset
    start = tile.to(tl.int64) * T
    inb = local < tl.minimum(n - start, T).to(tl.int32)
    g = tl.load(grad_ptr + start + local, mask=inb, other=0.0)
    if SQUARE:
        two_r = (r.to(tl.float32) * 2.0).to(FLOAT_DTYPE)  # exact: a power-of-two scale
        g = (g.to(tl.float32) * two_r.to(tl.float32)).to(FLOAT_DTYPE)
    out = tl.where(r <= 0, tl.zeros_like(g), g)
    tl.store(out_ptr + start + local, out, mask=inb)


@triton.jit
def activation_kernel(
    out_ptr,
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base_ptr,
    n,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
    FLOAT_DTYPE: tl.constexpr,
    SQUARE: tl.constexpr,
):
    tile = tl.program_id(0)
    bits, stored = load_tile_bits(
        mask_ptr, tile_offsets_ptr, values_ptr, tl.load(values_base_ptr), tile, T, WIDTH, SIGN_PACK, BITS_DTYPE
    )
    r = bits.to(FLOAT_DTYPE, bitcast=True)
    if SQUARE:
        r = (r.to(tl.float32) * r.to(tl.float32)).to(FLOAT_DTYPE)
    local = tl.arange(0, T)
    start = tile.to(tl.int64) * T
    tl.store(out_ptr + start + local, r, mask=local < tl.minimum(n - start, T).to(tl.int32))


def _check(dtype: torch.dtype) -> None:
    if dtype not in _FLOAT:
        raise ConfigError(f"relu MLP kernels take float32, float16 or bfloat16 activations, got {dtype}")


def _launch(kernel, tensors: tuple, n: int, dtype: torch.dtype, tile_size: int, sign_pack: bool, square: bool,
            values_offset: torch.Tensor | None, device: torch.device) -> None:
    n_tiles = -(-n // tile_size)
    if n_tiles:
        kernel[(n_tiles,)](
            *tensors, _base(values_offset, device), n,
            T=tile_size, WIDTH=_width(_bits_torch(dtype), sign_pack), SIGN_PACK=sign_pack,
            BITS_DTYPE=_BITS[dtype], FLOAT_DTYPE=_FLOAT[dtype], SQUARE=square, num_warps=_num_warps(tile_size),
        )  # fmt: skip


def relu_grad(
    grad: torch.Tensor,
    mask: torch.Tensor,
    tile_offsets: torch.Tensor,
    values: torch.Tensor,
    dtype: torch.dtype,
    tile_size: int,
    sign_pack: bool,
    square: bool,
    values_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient w.r.t. ``h`` (contiguous, ``grad``'s shape) from ``grad`` w.r.t. ``relu(h)`` or ``relu(h)²``."""
    _check(dtype)
    check_tile_size(tile_size)
    grad = grad.contiguous()
    if grad.dtype != dtype:
        raise ConfigError(f"relu_grad: grad has dtype {grad.dtype}, the payload {dtype}")
    out = torch.empty_like(grad)
    _launch(relu_grad_kernel, (grad, out, mask, tile_offsets, values), grad.numel(), dtype, tile_size, sign_pack,
            square, values_offset, grad.device)
    return out


def activation(
    mask: torch.Tensor,
    tile_offsets: torch.Tensor,
    values: torch.Tensor,
    shape: torch.Size,
    dtype: torch.dtype,
    tile_size: int,
    sign_pack: bool,
    square: bool,
    values_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    """``relu(h)`` or ``relu(h)²`` (contiguous, ``shape``) from the payload of ``relu(h)``."""
    _check(dtype)
    check_tile_size(tile_size)
    out = torch.empty(shape, dtype=dtype, device=mask.device)
    _launch(activation_kernel, (out, mask, tile_offsets, values), out.numel(), dtype, tile_size, sign_pack, square,
            values_offset, mask.device)
    return out


def _bits_torch(dtype: torch.dtype) -> torch.dtype:
    return {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
