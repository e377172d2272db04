"""Host-side checks and launch settings shared by the kernels that read or write the sparse codec's format
(:mod:`actzip.kernels.sparse`, :mod:`actzip.kernels.sparse_signpack`, :mod:`actzip.kernels.sparse_encode`,
:mod:`actzip.kernels.relu_mlp`): tile sizes, element bit widths, warps per program and the values base."""

from __future__ import annotations

import torch

from actzip.core.dtypes import bit_view_dtype
from actzip.errors import ConfigError
from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["DEFAULT_TILE_SIZE", "MAX_TILE_SIZE", "MIN_TILE_SIZE", "NBITS", "TL_BITS", "bits_dtype", "check_bits",
           "check_tile_size", "num_warps", "value_width", "values_base"]

DEFAULT_TILE_SIZE = 4096
MIN_TILE_SIZE = 64
MAX_TILE_SIZE = 1 << 16

# Integer view dtype -> bits per element, and the Triton dtype of the same width.
NBITS = {torch.uint8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
TL_BITS = {torch.uint8: tl.uint8, torch.int16: tl.int16, torch.int32: tl.int32, torch.int64: tl.int64}


def check_tile_size(tile_size: int) -> int:
    """Raise :class:`ConfigError` unless ``tile_size`` suits the kernels: a power of two in [64, 65536]."""
    ok = isinstance(tile_size, int) and MIN_TILE_SIZE <= tile_size <= MAX_TILE_SIZE
    if not ok or tile_size & (tile_size - 1):
        raise ConfigError(
            f"sparse Triton kernels: tile_size must be a power of two from {MIN_TILE_SIZE} to {MAX_TILE_SIZE}, "
            f"got {tile_size!r}"
        )
    return tile_size


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer view the kernels move ``dtype``'s elements as (an integer view dtype stays itself)."""
    return dtype if dtype in NBITS else bit_view_dtype(dtype)


def value_width(bits: torch.dtype, sign_pack: bool) -> int:
    """Bits stored per value of integer view dtype ``bits``: all of them, one less with sign packing."""
    nbits = NBITS[bits]
    if sign_pack and nbits > 32:
        raise ConfigError(
            "sparse Triton kernels: sign packing of 64-bit elements is not implemented (use kernel='torch')"
        )
    return nbits - 1 if sign_pack else nbits


def num_warps(tile_size: int) -> int:
    """Warps per program for tiles of ``tile_size`` elements."""
    # Measured on an H200 (64M elements, bf16/fp8/fp32): 4 warps are best or within noise from 1024 to 4096
    # elements a tile; with 2 warps the sign-packing scan of a 4096-element tile ran 10x slower.
    return 8 if tile_size > 4096 else max(1, min(4, tile_size // 256))


def values_base(values_offset: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Where a payload's values start in its values buffer, as the one-element int64 device tensor the kernels
    read (0 when ``values_offset`` is ``None``)."""
    if values_offset is None:
        return torch.zeros(1, dtype=torch.int64, device=device)
    if values_offset.dtype != torch.int64 or values_offset.numel() != 1 or values_offset.device != device:
        raise ConfigError(
            f"values_offset must be a one-element int64 tensor on {device}, got {values_offset.dtype} "
            f"of {values_offset.numel()} elements on {values_offset.device}"
        )
    return values_offset


def check_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    """``bits`` as its integer view, after checking it is a contiguous 1-D tensor of at least ``n`` elements."""
    if bits.dtype not in NBITS:
        bits = bits.view(bit_view_dtype(bits.dtype))
    if bits.dim() != 1 or not bits.is_contiguous() or bits.numel() < n:
        raise ConfigError(
            f"sparse Triton kernels: the input must be a contiguous 1-D tensor of at least n={n} elements, got "
            f"shape {tuple(bits.shape)}{'' if bits.is_contiguous() else ' (not contiguous)'}"
        )
    return bits
