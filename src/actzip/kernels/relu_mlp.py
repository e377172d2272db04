"""Triton kernels that use a sparse payload of ``r = relu(h)`` directly in backward.

- :func:`relu_grad_kernel`: the gradient w.r.t. ``h`` from the gradient w.r.t. ``relu(h)`` (or
  ``relu(h)²``) and the payload, with no dense ``r`` in memory. Oracle:
  :func:`actzip.memory.modules.relu_mlp.relu_grad_from_payload`.
- :func:`activation_kernel`: ``r`` or ``r²`` rebuilt from the payload in one pass (for the weight gradient
  of the down projection). Oracle: :func:`actzip.memory.modules.relu_mlp.activation_from_payload`.

Both reproduce PyTorch's arithmetic exactly: for 16-bit floats PyTorch computes an elementwise product in
float32 and rounds once to the storage type (round to nearest even), and so do these kernels; ``2 * r`` is
exact. The threshold is ``r <= 0 -> 0`` as in ``threshold_backward`` (so NaN passes, -0.0 gives 0).

A payload whose values an arena refused (see :mod:`actzip.memory.modules.arena`) may be passed when nobody can ask
the host (a captured CUDA graph): the wrappers fold its device ``ok`` flag into the values base, and a
negative base makes every program write NaN and read no value (the values were never written and may lie
past the buffer's end). Gradients from such a payload are NaN, never silently wrong.
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse import load_tile_bits
from actzip.kernels.sparse_launch import check_tile_size, num_warps, value_width, values_base

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

_FLOAT = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}
_BITS = {torch.float32: tl.int32, torch.float16: tl.int16, torch.bfloat16: tl.int16}
_BITS_TORCH = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


@triton.jit
def _nan(T: tl.constexpr, FLOAT_DTYPE: tl.constexpr):
    return tl.full((T,), 0x7FC00000, tl.int32).to(tl.float32, bitcast=True).to(FLOAT_DTYPE)


# values_base_ptr is not specialized on alignment: it is a slice of the encoder's results eagerly and a fresh
# tensor (the ok flag folded in) under capture, and a new specialization must not be compiled while capturing.
@triton.jit(do_not_specialize=["values_base_ptr"])
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
    base = tl.load(values_base_ptr)
    local = tl.arange(0, T)  # 32-bit per element; the tile's start is a scalar offset
    start = tile.to(tl.int64) * T
    inb = local < tl.minimum(n - start, T).to(tl.int32)
    if base < 0:  # refused payload (see the module docstring): read nothing, write NaN
        tl.store(out_ptr + start + local, _nan(T, FLOAT_DTYPE), mask=inb)
    else:
        bits, stored = load_tile_bits(
            mask_ptr, tile_offsets_ptr, values_ptr, base, tile, T, WIDTH, SIGN_PACK, BITS_DTYPE
        )
        r = bits.to(FLOAT_DTYPE, bitcast=True)
        g = tl.load(grad_ptr + start + local, mask=inb, other=0.0)
        if SQUARE:
            two_r = (r.to(tl.float32) * 2.0).to(FLOAT_DTYPE)  # exact: a power-of-two scale
            g = (g.to(tl.float32) * two_r.to(tl.float32)).to(FLOAT_DTYPE)
        out = tl.where(r <= 0, tl.zeros_like(g), g)
        tl.store(out_ptr + start + local, out, mask=inb)


@triton.jit(do_not_specialize=["values_base_ptr"])
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
    base = tl.load(values_base_ptr)
    local = tl.arange(0, T)
    start = tile.to(tl.int64) * T
    inb = local < tl.minimum(n - start, T).to(tl.int32)
    if base < 0:  # refused payload: read nothing, write NaN
        tl.store(out_ptr + start + local, _nan(T, FLOAT_DTYPE), mask=inb)
    else:
        bits, stored = load_tile_bits(
            mask_ptr, tile_offsets_ptr, values_ptr, base, tile, T, WIDTH, SIGN_PACK, BITS_DTYPE
        )
        r = bits.to(FLOAT_DTYPE, bitcast=True)
        if SQUARE:
            r = (r.to(tl.float32) * r.to(tl.float32)).to(FLOAT_DTYPE)
        tl.store(out_ptr + start + local, r, mask=inb)


def _check(dtype: torch.dtype) -> None:
    if dtype not in _FLOAT:
        raise ConfigError(f"relu MLP kernels take float32, float16 or bfloat16 activations, got {dtype}")


def _values_base(values_offset: torch.Tensor | None, ok: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    base = values_base(values_offset, device)
    if ok is None:
        return base
    if ok.numel() != 1 or ok.device != device:
        raise ConfigError(f"ok must be a one-element tensor on {device}, got {ok.numel()} elements on {ok.device}")
    return torch.where(ok.view(1) != 0, base, -1)  # a device op: no host decision, capturable


def _launch(kernel, tensors: tuple, n: int, dtype: torch.dtype, tile_size: int, sign_pack: bool, square: bool,
            values_offset: torch.Tensor | None, ok: torch.Tensor | None, device: torch.device) -> None:
    n_tiles = -(-n // tile_size)
    if n_tiles:
        kernel[(n_tiles,)](
            *tensors, _values_base(values_offset, ok, device), n,
            T=tile_size, WIDTH=value_width(_BITS_TORCH[dtype], sign_pack), SIGN_PACK=sign_pack,
            BITS_DTYPE=_BITS[dtype], FLOAT_DTYPE=_FLOAT[dtype], SQUARE=square, num_warps=num_warps(tile_size),
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
    ok: torch.Tensor | None = None,
    in_place: bool = False,
) -> torch.Tensor:
    """Gradient w.r.t. ``h`` (contiguous, ``grad``'s shape) from ``grad`` w.r.t. ``relu(h)`` or ``relu(h)²``.

    ``ok``: the payload's one-element flag on the device (an arena reservation's); where it is false the
    result is all NaN and no value is read. ``in_place``: written over ``grad`` (contiguous; each program
    reads its tile before writing it), which the caller owns and no longer needs."""
    _check(dtype)
    check_tile_size(tile_size)
    if in_place and not grad.is_contiguous():
        raise ConfigError("relu_grad: in_place needs a contiguous grad")
    grad = grad.contiguous()
    if grad.dtype != dtype:
        raise ConfigError(f"relu_grad: grad has dtype {grad.dtype}, the payload {dtype}")
    out = grad if in_place else torch.empty_like(grad)
    _launch(relu_grad_kernel, (grad, out, mask, tile_offsets, values), grad.numel(), dtype, tile_size, sign_pack,
            square, values_offset, ok, grad.device)
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
    ok: torch.Tensor | None = None,
) -> torch.Tensor:
    """``relu(h)`` or ``relu(h)²`` (contiguous, ``shape``) from the payload of ``relu(h)``; ``ok`` as in
    :func:`relu_grad`."""
    _check(dtype)
    check_tile_size(tile_size)
    out = torch.empty(shape, dtype=dtype, device=mask.device)
    _launch(activation_kernel, (out, mask, tile_offsets, values), out.numel(), dtype, tile_size, sign_pack, square,
            values_offset, ok, mask.device)
    return out
