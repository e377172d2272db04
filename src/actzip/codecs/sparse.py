"""Lossless sparse codec: a bitmask of non-zero elements plus the non-zero values, compacted, in tiles.

Format (the BitSparse layout), over the tensor's elements in memory order, padded to whole tiles:

- ``mask``: one bit per element (1 = stored), ``tile_size / 8`` bytes per tile, little-endian bit order;
- ``tile_offsets``: int32 per tile, the number of stored values in all earlier tiles (an exclusive prefix
  sum), so any tile can be decoded on its own;
- ``values``: the stored elements' raw bits, in order. With ``sign_pack=True`` the sign bit is dropped and
  the remaining ``bits - 1`` bits of each value are packed densely into bytes (15-bit bf16, 7-bit fp8).

An element counts as zero only if all its bits are zero (+0.0): -0.0, subnormals, inf and NaN payloads are
stored like any other value, so ``decode(encode(x))`` is bit-identical to ``x``. The decoded tensor also has
``x``'s strides whenever ``x`` is dense in some dimension order (contiguous, transposed, channels-last, ...);
other layouts come back contiguous.

This pure-PyTorch version is the reference every faster kernel is tested against. It moves bits only, never
arithmetic on values, and it synchronizes with the host once per encode (the number of stored values sizes
the value buffer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from actzip.codecs.base import Codec
from actzip.codecs.bitpack import pack_bits, pack_bool, unpack_bits, unpack_bool
from actzip.core.dtypes import FLOAT_DTYPES, bit_view_dtype, bit_width
from actzip.core.errors import ConfigError, InvalidValueError
from actzip.core.payload import Payload
from actzip.core.registry import register_codec

DEFAULT_TILE_SIZE = 4096  # elements per tile: a 64x64 tile, a 512-byte mask, as in the public BitSparse code


def _sign_set(bits: torch.Tensor) -> torch.Tensor:
    """Elementwise: is the sign bit set in these raw float bits?"""
    if bits.dtype == torch.uint8:
        return bits >= 0x80
    return bits < 0


def memory_order(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """A 1-D view of ``x`` in memory order, and the dimension order that undoes it.

    Returns ``(flat, perm)``: ``x.permute(perm)`` is contiguous and ``flat`` is it flattened, so no copy is
    made. ``perm`` is ``None`` when ``x`` is contiguous or has no dense order (then ``flat`` is a copy in
    row-major order).
    """
    if x.is_contiguous():
        return x.reshape(-1), None
    # Largest stride first; for ties (size-1 dims) keep the original order so the permutation is stable.
    perm = tuple(sorted(range(x.dim()), key=lambda d: (-x.stride(d), d)))
    xp = x.permute(perm)
    if xp.is_contiguous():
        return xp.reshape(-1), perm
    return x.contiguous().reshape(-1), None


def restore_order(flat: torch.Tensor, shape: torch.Size, perm: tuple[int, ...] | None) -> torch.Tensor:
    """Inverse of :func:`memory_order` on a contiguous 1-D tensor."""
    if perm is None:
        return flat.reshape(shape)
    permuted = flat.reshape([shape[d] for d in perm])
    inverse = [0] * len(perm)
    for i, d in enumerate(perm):
        inverse[d] = i
    return permuted.permute(inverse)


@register_codec("sparse")
class SparseCodec(Codec):
    """Bitmask + compacted values, lossless. See the module docstring for the format.

    Options:
      tile_size: elements per tile (a positive multiple of 8). Smaller tiles cost more offset bytes.
      sign_pack: drop the sign bit of every stored value; the tensor must have no sign bit set (no negative
        value, no -0.0, no negative NaN).
      check: with ``sign_pack``, verify the tensor has no sign bit set and raise if it does. Without the check
        the sign is dropped silently: the caller guarantees non-negative input.
    """

    lossless = True
    unbiased = True
    dtypes = FLOAT_DTYPES

    def __init__(self, *, tile_size: int = DEFAULT_TILE_SIZE, sign_pack: bool = False, check: bool = True) -> None:
        if not isinstance(tile_size, int) or tile_size <= 0 or tile_size % 8:
            raise ConfigError(f"sparse: option tile_size must be a positive multiple of 8, got {tile_size!r}")
        self.tile_size = tile_size
        self.sign_pack = bool(sign_pack)
        self.check_values = bool(check)

    def options(self) -> dict:
        return {"tile_size": self.tile_size, "sign_pack": self.sign_pack, "check": self.check_values}

    def value_bits(self, dtype: torch.dtype) -> int:
        """Bits stored per non-zero value of ``dtype``."""
        return bit_width(dtype) - (1 if self.sign_pack else 0)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        flat, perm = memory_order(x)
        bits = flat.view(bit_view_dtype(x.dtype))
        n = bits.numel()
        n_tiles = -(-n // self.tile_size)
        stored = bits != 0
        if self.sign_pack and self.check_values:
            negative = _sign_set(bits)
            if bool(negative.any()):
                count = int(negative.sum())
                raise InvalidValueError(
                    f"sparse(sign_pack=True): {name} has {count} of {n} elements with the sign bit set "
                    f"(negative values, -0.0 or negative NaN); sign packing needs a non-negative tensor "
                    f"(e.g. a ReLU output), or use sign_pack=False"
                )
        padded = torch.zeros(n_tiles * self.tile_size, dtype=torch.bool, device=x.device)
        padded[:n] = stored
        counts = padded.view(n_tiles, self.tile_size).sum(dim=1, dtype=torch.int64)
        tile_offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32)
        values = torch.masked_select(bits, stored)  # the one host sync: the buffer's size depends on the data
        nnz = values.numel()
        if self.sign_pack:
            width = self.value_bits(x.dtype)
            low = values.to(torch.int64) & ((1 << width) - 1) if width < 63 else values & ((1 << 63) - 1)
            values = pack_bits(low, width)
        return Payload(
            self.name,
            x.shape,
            x.dtype,
            x.device,
            buffers={"mask": pack_bool(padded), "tile_offsets": tile_offsets, "values": values},
            meta={"nnz": nnz, "perm": perm, "tile_size": self.tile_size, "sign_pack": self.sign_pack},
        )

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        n = p.shape.numel()
        int_dtype = bit_view_dtype(p.dtype)
        stored = unpack_bool(p.buffers["mask"], n)
        values = p.buffers["values"]
        if p.meta["sign_pack"]:
            values = unpack_bits(values, p.meta["nnz"], bit_width(p.dtype) - 1, int_dtype)
        # masked_scatter, not index_put: index_put is sort-based (slow) under deterministic algorithms.
        out = torch.zeros(n, dtype=int_dtype, device=p.device).masked_scatter_(stored, values)
        return restore_order(out.view(p.dtype), p.shape, p.meta["perm"])


@dataclass(frozen=True)
class EntropyBound:
    """How close the sparse format gets to the information-theoretic optimum for one tensor."""

    numel: int  # elements in the tensor
    density: float  # fraction of elements stored (any bit set)
    mask_bits: float  # binary entropy H(density): optimal bits per element to say which are stored
    value_bits: int  # bits per stored value (one less when no element has its sign bit set)
    bound_bits: float  # optimum bits per element: mask_bits + density * value_bits
    codec_bits: float  # bits per element the sparse codec actually uses (mask + offsets + values)
    dense_bits: int  # bits per element uncompressed

    @property
    def efficiency(self) -> float:
        """bound_bits / codec_bits: 1.0 means the codec meets the bound."""
        return self.bound_bits / self.codec_bits if self.codec_bits else 1.0


def entropy_bound(x: torch.Tensor, *, sign_pack: bool | None = None, tile_size: int = DEFAULT_TILE_SIZE) -> EntropyBound:
    """The entropy bound for ``x`` under the sparse model, beside the sparse codec's actual size.

    The bound is the mask's binary entropy at the empirical density plus the value bits of the stored
    elements. ``sign_pack=None`` drops the sign bit from the value bits (and from the codec's size) exactly
    when ``x`` has no element with its sign bit set.
    """
    codec = SparseCodec(tile_size=tile_size)
    codec.check(x, "x")
    flat, _ = memory_order(x.detach())
    bits = flat.view(bit_view_dtype(x.dtype))
    n = bits.numel()
    nnz = int((bits != 0).sum())
    if sign_pack is None:
        sign_pack = not bool(_sign_set(bits).any())
    width = bit_width(x.dtype) - (1 if sign_pack else 0)
    p = nnz / n if n else 0.0
    h = 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    n_tiles = -(-n // tile_size)
    value_bytes = (nnz * width + 7) // 8 if sign_pack else nnz * x.dtype.itemsize
    codec_bits = (n_tiles * tile_size + 32 * n_tiles + 8 * value_bytes) / n if n else 0.0
    return EntropyBound(n, p, h, width, h + p * width, codec_bits, bit_width(x.dtype))
