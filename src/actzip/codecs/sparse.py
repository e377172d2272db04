"""Lossless sparse codec: a bitmask of non-zero elements plus the non-zero values, compacted, in tiles.

Format (the BitSparse layout), over the tensor's elements in memory order, padded to whole tiles:

- ``mask``: one bit per element (1 = stored), ``tile_size / 8`` bytes per tile, little-endian bit order (bit
  ``i`` of byte ``j`` is element ``8*j + i``; pad elements past the end are 0);
- ``values``: the stored elements' raw bits, tile after tile, in memory order inside a tile;
- ``tile_offsets``: int32 per tile, where the tile's values start in ``values`` (an exclusive prefix sum), so
  any tile can be decoded on its own.

Without sign packing, ``values`` has the tensor's integer bit-view dtype (int16 for bf16/fp16, uint8 for fp8,
...) and ``tile_offsets[k]`` counts the values of the tiles before ``k``.

With ``sign_pack=True`` the sign bit is dropped and the remaining ``w = bits - 1`` bits of each value (15 for
bf16, 7 for fp8) are packed into int32 words, each tile into its own word stream: value ``r`` of a tile
occupies bits ``[r*w, r*w + w)`` of the tile's stream (little-endian: stream bit ``p`` is bit ``p % 32`` of
word ``p // 32``), the stream is ``ceil(count*w / 32)`` words with zero pad bits, and ``tile_offsets[k]``
counts the words of the tiles before ``k``. Starting every tile on a word boundary costs under 4 bytes per
tile and lets tiles be packed in parallel without two writers sharing a word.

An element counts as zero only if all its bits are zero (+0.0): -0.0, subnormals, inf and NaN payloads are
stored like any other value, so ``decode(encode(x))`` is bit-identical to ``x``. The decoded tensor also has
``x``'s strides whenever ``x`` is dense in some dimension order (contiguous, transposed, channels-last, ...);
other layouts come back contiguous.

Two implementations make the same payloads, buffer for buffer, and decode each other's (option ``kernel``):
this module's pure-PyTorch one, the reference every faster kernel is tested against, and the Triton kernels of
:mod:`actzip.kernels.sparse` (encoded through :func:`actzip.kernels.sparse_encode.encode`). Both move bits only,
never arithmetic on values. The PyTorch encoder synchronizes with the host once, to size the values buffer
(twice with sign packing: the word count, read together with the sign check, then the value count); the Triton
encoder once (all counts in one read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from actzip import compat
from actzip.codecs.base import Codec
from actzip.codecs.bitpack import pack_bool, pack_tile_words, tile_words, unpack_bool, unpack_tile_words
from actzip.codecs.kernel_choice import KERNELS, use_triton
from actzip.core import layout
from actzip.core.dtypes import FLOAT_DTYPES, bit_view_dtype, bit_width
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError, InvalidValueError

DEFAULT_TILE_SIZE = 4096  # elements per tile: a 64x64 tile, a 512-byte mask, as in the public BitSparse code

# Names this module held before the memory-order helpers moved to actzip.core.layout: still importable from
# here for one release, with a warning (so this module calls them through ``layout.``).
_MOVED = {name: layout for name in ("memory_order", "memory_rows", "restore_order")}


def __getattr__(name: str):
    if name in _MOVED:
        home = _MOVED[name]
        compat.warn_once(f"{__name__}.{name}", f"{home.__name__}.{name}")
        return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _sign_set(bits: torch.Tensor) -> torch.Tensor:
    """Elementwise: is the sign bit set in these raw float bits?"""
    if bits.dtype == torch.uint8:
        return bits >= 0x80
    return bits < 0


_TRITON_MIN_TILE, _TRITON_MAX_TILE = 64, 1 << 16  # the Triton kernels' tile sizes: powers of two in this range


def _triton_tile_problem(tile_size: int) -> str | None:
    if _TRITON_MIN_TILE <= tile_size <= _TRITON_MAX_TILE and not tile_size & (tile_size - 1):
        return None
    return f"tile_size={tile_size} is not a power of two from {_TRITON_MIN_TILE} to {_TRITON_MAX_TILE}"


def _tile_counts(stored_padded: torch.Tensor, tile_size: int) -> torch.Tensor:
    """int64 number of stored elements in each tile of a padded flag vector."""
    return stored_padded.view(-1, tile_size).sum(dim=1, dtype=torch.int64)


@register_codec("sparse")
class SparseCodec(Codec):
    """Bitmask + compacted values, lossless. See the module docstring for the format.

    Options:
      tile_size: elements per tile (a positive multiple of 8; a power of two from 64 to 65536 for the Triton
        kernels). Smaller tiles cost more offset bytes.
      sign_pack: drop the sign bit of every stored value; the tensor must have no sign bit set (no negative
        value, no -0.0, no negative NaN).
      check: with ``sign_pack``, verify the tensor has no sign bit set and raise if it does. Without the check
        the sign is dropped silently: the caller guarantees non-negative input.
      kernel: ``"auto"`` (default) runs the Triton kernels on CUDA tensors when Triton is installed and the
        PyTorch code otherwise (warning once, and counting in
        ``actzip.kernels.runtime.fallback_counts()``, when a CUDA tensor falls back); ``"torch"`` always runs
        the PyTorch code; ``"triton"`` always runs the Triton kernels, or raises
        :class:`~actzip.errors.KernelUnavailableError` (a ``ConfigError``) saying why they cannot
        run. Both make identical payloads and decode each other's. The kernels need a power-of-two
        ``tile_size`` (see above) and do not sign-pack float64; those cases run the PyTorch code.
    """

    lossless = True
    unbiased = True
    dtypes = FLOAT_DTYPES

    def __init__(
        self,
        *,
        tile_size: int = DEFAULT_TILE_SIZE,
        sign_pack: bool = False,
        check: bool = True,
        kernel: str = "auto",
    ) -> None:
        if not isinstance(tile_size, int) or tile_size <= 0 or tile_size % 8:
            raise ConfigError(f"sparse: option tile_size must be a positive multiple of 8, got {tile_size!r}")
        if kernel not in KERNELS:
            raise ConfigError(f"sparse: option kernel must be one of {', '.join(map(repr, KERNELS))}, got {kernel!r}")
        if kernel == "triton" and (problem := _triton_tile_problem(tile_size)):
            raise ConfigError(f"sparse(kernel='triton'): option {problem}")
        self.tile_size = tile_size
        self.sign_pack = bool(sign_pack)
        self.check_values = bool(check)
        self.kernel = kernel

    def options(self) -> dict:
        return {
            "tile_size": self.tile_size,
            "sign_pack": self.sign_pack,
            "check": self.check_values,
            "kernel": self.kernel,
        }

    def value_bits(self, dtype: torch.dtype) -> int:
        """Bits stored per non-zero value of ``dtype``."""
        return bit_width(dtype) - (1 if self.sign_pack else 0)

    # -- which implementation --------------------------------------------------------------------------

    def uses_triton(self, device: torch.device, dtype: torch.dtype, tile_size: int, sign_pack: bool) -> bool:
        """Whether this codec runs its Triton kernels for such a tensor (announces a fallback once)."""
        problem = _triton_tile_problem(tile_size)
        if problem is None and sign_pack and bit_width(dtype) > 32:
            problem = f"sign packing of {dtype} has no Triton kernel"
        return use_triton(self.name, self.kernel, device, problem)

    # -- encode / decode -------------------------------------------------------------------------------

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        flat, perm = layout.memory_order(x)
        bits = flat.view(bit_view_dtype(x.dtype))
        if self.uses_triton(x.device, x.dtype, self.tile_size, self.sign_pack):
            buffers, nnz = self._encode_triton(flat, name)
        else:
            buffers, nnz = self._encode_torch(bits, name)
        return Payload(
            self.name,
            x.shape,
            x.dtype,
            x.device,
            buffers=buffers,
            meta={"nnz": nnz, "perm": perm, "tile_size": self.tile_size, "sign_pack": self.sign_pack},
        )

    def _refuse_sign_bits(self, count: int, n: int, name: str) -> None:
        raise InvalidValueError(
            f"sparse(sign_pack=True): {name} has {count} of {n} elements with the sign bit set "
            f"(negative values, -0.0 or negative NaN); sign packing needs a non-negative tensor "
            f"(e.g. a ReLU output), or use sign_pack=False"
        )

    def _encode_torch(self, bits: torch.Tensor, name: str) -> tuple[dict[str, torch.Tensor], int]:
        n = bits.numel()
        n_tiles = -(-n // self.tile_size)
        stored = bits != 0
        padded = torch.zeros(n_tiles * self.tile_size, dtype=torch.bool, device=bits.device)
        padded[:n] = stored
        counts = _tile_counts(padded, self.tile_size)
        if not self.sign_pack:
            tile_offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32)
            values = torch.masked_select(bits, stored)  # the one host sync: the buffer's size depends on the data
            return {"mask": pack_bool(padded), "tile_offsets": tile_offsets, "values": values}, values.numel()
        width = self.value_bits(bits.dtype)
        words = tile_words(counts, width)
        negative = _sign_set(bits).sum(dtype=torch.int64) if self.check_values else counts.new_zeros(())
        # Host sync 1: the sign check and the word count, in one read.
        n_negative, total_words = torch.stack([negative, words.sum()]).tolist()
        if n_negative:
            self._refuse_sign_bits(n_negative, n, name)
        values = torch.masked_select(bits, stored)  # host sync 2: the value count
        packed, word_offsets = pack_tile_words(values, counts, width, total_words)
        buffers = {"mask": pack_bool(padded), "tile_offsets": word_offsets.to(torch.int32), "values": packed}
        return buffers, values.numel()

    def _encode_triton(self, flat: torch.Tensor, name: str) -> tuple[dict[str, torch.Tensor], int]:
        from actzip.kernels import sparse_encode

        e = sparse_encode.encode(flat, self.tile_size, self.sign_pack)  # sizes the values buffer: one host sync
        if e.host.sign_set and self.check_values:
            self._refuse_sign_bits(e.host.sign_set, flat.numel(), name)
        return {"mask": e.mask, "tile_offsets": e.tile_offsets, "values": e.values}, e.host.nnz

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        n = p.shape.numel()
        tile_size, sign_pack = p.meta["tile_size"], p.meta["sign_pack"]
        if self.uses_triton(p.device, p.dtype, tile_size, sign_pack):
            from actzip.kernels import sparse as sparse_kernels

            b = p.buffers
            out = sparse_kernels.decompress(
                b["mask"], b["tile_offsets"], b["values"], n, p.dtype, tile_size, sign_pack
            )
        else:
            out = self._decode_torch(p, n)
        return layout.restore_order(out.view(p.dtype), p.shape, p.meta["perm"])

    def _decode_torch(self, p: Payload, n: int) -> torch.Tensor:
        int_dtype = bit_view_dtype(p.dtype)
        stored = unpack_bool(p.buffers["mask"])
        values = p.buffers["values"]
        if p.meta["sign_pack"]:
            counts = _tile_counts(stored, p.meta["tile_size"])
            offsets = p.buffers["tile_offsets"]
            values = unpack_tile_words(values, counts, offsets, bit_width(p.dtype) - 1, int_dtype, p.meta["nnz"])
        # masked_scatter, not index_put: index_put is sort-based (slow) under deterministic algorithms.
        return torch.zeros(n, dtype=int_dtype, device=p.device).masked_scatter_(stored[:n], values)


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
    flat, _ = layout.memory_order(x.detach())
    bits = flat.view(bit_view_dtype(x.dtype))
    n = bits.numel()
    nnz = int((bits != 0).sum())
    if sign_pack is None:
        sign_pack = not bool(_sign_set(bits).any())
    width = bit_width(x.dtype) - (1 if sign_pack else 0)
    p = nnz / n if n else 0.0
    h = 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
    n_tiles = -(-n // tile_size)
    if sign_pack:  # each tile's values are packed into whole 32-bit words
        padded = torch.zeros(n_tiles * tile_size, dtype=torch.bool, device=bits.device)
        padded[:n] = bits != 0
        value_bytes = 4 * int(tile_words(_tile_counts(padded, tile_size), width).sum())
    else:
        value_bytes = nnz * x.dtype.itemsize
    codec_bits = (n_tiles * tile_size + 32 * n_tiles + 8 * value_bytes) / n if n else 0.0
    return EntropyBound(n, p, h, width, h + p * width, codec_bits, bit_width(x.dtype))
