"""Dense bit packing in pure PyTorch: booleans to bytes, and w-bit integers to a byte stream.

Bit order is little-endian throughout: bit ``i`` of byte ``j`` is element ``8*j + i``; a w-bit value's bit
``k`` sits at stream position ``w*index + k``. The Triton kernels use the same order, so these functions are
their oracle.
"""

from __future__ import annotations

import torch

# Elements handled per chunk when packing integers, bounding the temporary (chunk * width) bit tensor.
_CHUNK = 1 << 20


def _byte_weights(device: torch.device) -> torch.Tensor:
    return torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)


def pack_bool(bits: torch.Tensor) -> torch.Tensor:
    """Pack a 1-D bool tensor whose length is a multiple of 8 into uint8 (8 flags per byte)."""
    if bits.numel() % 8:
        raise ValueError(f"pack_bool needs a multiple of 8 flags, got {bits.numel()}")
    b = bits.reshape(-1, 8).to(torch.uint8)
    # Sum of distinct powers of two never exceeds 255, so uint8 accumulation is exact.
    return (b * _byte_weights(bits.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bool(packed: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_bool`; keep the first ``n`` flags (all when ``None``)."""
    bits = (packed.reshape(-1, 1) & _byte_weights(packed.device)) != 0
    bits = bits.reshape(-1)
    return bits if n is None else bits[:n]


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack the low ``width`` bits of each integer in 1-D ``values`` into a dense uint8 stream.

    The stream has ``ceil(len(values) * width / 8)`` bytes; the trailing pad bits are zero.
    """
    if not 1 <= width <= 64:
        raise ValueError(f"width must be in 1..64, got {width}")
    n = values.numel()
    nbytes = (n * width + 7) // 8
    out = torch.empty(nbytes, dtype=torch.uint8, device=values.device)
    wide = torch.int64 if width > 31 else torch.int32
    shifts = torch.arange(width, dtype=wide, device=values.device)
    # Chunks hold a multiple of 8 values, so each chunk starts on a byte boundary.
    for start in range(0, n, _CHUNK):
        v = values[start : start + _CHUNK].to(wide)
        bits = ((v.unsqueeze(1) >> shifts) & 1).to(torch.bool).reshape(-1)
        pad = (-bits.numel()) % 8
        if pad:
            bits = torch.cat([bits, bits.new_zeros(pad)])
        b0 = start * width // 8
        chunk_bytes = pack_bool(bits)
        out[b0 : b0 + chunk_bytes.numel()] = chunk_bytes
    return out


def unpack_bits(packed: torch.Tensor, n: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: ``n`` values of ``width`` bits, returned as ``dtype``."""
    wide = torch.int64 if width > 31 else torch.int32
    shifts = torch.arange(width, dtype=wide, device=packed.device)
    out = torch.empty(n, dtype=dtype, device=packed.device)
    for start in range(0, n, _CHUNK):
        m = min(_CHUNK, n - start)
        b0 = start * width // 8
        b1 = (start * width + m * width + 7) // 8
        bits = unpack_bool(packed[b0:b1], m * width).reshape(m, width).to(wide)
        v = (bits << shifts).sum(dim=1, dtype=wide)
        # Values of the full width of a signed dtype come back in two's complement: view, not cast.
        out[start : start + m] = _to_dtype_bits(v, dtype, width)
    return out


def _to_dtype_bits(v: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    bits = dtype.itemsize * 8
    if width == bits and dtype.is_signed and v.dtype.itemsize * 8 > bits:
        # Fold values >= 2**(bits-1) into the negative range, as the bit pattern would read.
        v = torch.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v.to(dtype)
