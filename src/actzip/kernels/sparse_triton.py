"""Triton kernels for the sparse codec's format (see :mod:`actzip.codecs.sparse` for the format itself).

One program per tile of ``T`` elements (``T`` a power of two, a compile-time constant). Elements are the
tensor's raw bits in memory order, read through a same-width integer view (uint8 for fp8, int16 for
fp16/bf16, int32 for fp32, int64 for fp64), so the kernels move bits and never do float arithmetic.

Encoding is two passes over the input with a device-side scan between them, and no host synchronization
except, optionally, to size the values buffer:

1. :func:`count_kernel` writes each tile's mask bytes and its size in the values buffer (values, or int32
   words with sign packing);
2. ``torch.cumsum`` of the sizes gives every tile's exclusive offset (``tile_offsets``), on the device;
3. :func:`compact_kernel` writes each tile's stored values at its offset; with sign packing it writes them
   whole into scratch room and :mod:`actzip.kernels.sparse_signpack_triton` packs them into words.

Both passes can apply a ReLU to a float input themselves (``relu=True``), and the compact pass can write the
activation (``relu(h)`` or ``relu(h)²``) as it goes: the fused MLPs' encoder
(:func:`actzip.kernels.sparse_encode_triton.encode`) is these passes with an arena reservation between them.

:func:`decompress_kernel` rebuilds the raw bits, one tile per program, through :func:`load_tile_bits`, a
``@triton.jit`` helper that other kernels can call to read one tile of a payload without a dense copy.

Python entry points: :func:`compress` (with :func:`count` and :func:`compact`, its two halves) and
:func:`decompress`. The PyTorch codec ``actzip.codecs.get("sparse", kernel="torch")`` is the oracle: both
make the same buffers bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from actzip.core.dtypes import bit_view_dtype
from actzip.errors import ConfigError

DEFAULT_TILE_SIZE = 4096
MIN_TILE_SIZE = 64
MAX_TILE_SIZE = 1 << 16

# Integer view dtype -> bits per element.
_NBITS = {torch.uint8: 8, torch.int16: 16, torch.int32: 32, torch.int64: 64}
_TL_DTYPE = {torch.uint8: tl.uint8, torch.int16: tl.int16, torch.int32: tl.int32, torch.int64: tl.int64}


# -- device code ------------------------------------------------------------------------------------------


@triton.jit
def relu_bits(h, BITS_DTYPE: tl.constexpr):
    """``relu(h)`` as raw bits (``BITS_DTYPE``) the way torch computes it on CUDA: NaN passes with its payload,
    -0.0 gives +0.0. Also returns ``h`` in float32 and the kept flags (for an activation computed next to it).

    The flags come from the bits, not from float compares: a float select of ``h`` or 0 on ``h > 0 or h is
    NaN`` is what the compiler turns into a NaN-propagating max, which returns the canonical NaN, not ``h``'s
    (seen on an H200 for float32).
    """
    hb = h.to(BITS_DTYPE, bitcast=True)
    if h.dtype == tl.float32:
        keep = (hb > 0) | ((hb & 0x7FFFFFFF) > 0x7F800000)  # sign clear and nonzero, or NaN of either sign
    elif h.dtype == tl.float16:
        keep = (hb > 0) | ((hb & 0x7FFF) > 0x7C00)
    else:
        keep = (hb > 0) | ((hb & 0x7FFF) > 0x7F80)
    return tl.where(keep, hb, tl.zeros_like(hb)), h.to(tl.float32), keep


@triton.jit
def load_relu(src_ptr, act_ptr, offs, inb, ACT_OUT: tl.constexpr, BITS_DTYPE: tl.constexpr):
    """The bits of ``relu(h)`` for ``h`` at ``src_ptr + offs`` (``inb``: which exist); ``ACT_OUT`` 1 or 2 also
    writes ``relu(h)`` or ``relu(h)²`` (float32 product, rounded once) to ``act_ptr + offs``."""
    h = tl.load(src_ptr + offs, mask=inb, other=0.0)
    x, h32, keep = relu_bits(h, BITS_DTYPE)
    if ACT_OUT == 1:
        tl.store(act_ptr + offs, x.to(h.dtype, bitcast=True), mask=inb)
    if ACT_OUT == 2:
        r32 = tl.where(keep, h32, 0.0)
        tl.store(act_ptr + offs, (r32 * r32).to(h.dtype), mask=inb)
    return x


@triton.jit
def count_kernel(
    bits_ptr,
    mask_ptr,
    sizes_ptr,
    nvals_ptr,
    nsign_ptr,
    n,
    T: tl.constexpr,
    NBITS: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    RELU: tl.constexpr = False,
    BITS_DTYPE: tl.constexpr = tl.int16,
):
    """Pass 1: mask bytes and stored size of one tile.

    Oracle: ``pack_bool`` of the padded ``bits != 0`` flags (``mask``) and the per-tile counts of
    ``SparseCodec.encode`` (``sizes``: values per tile, or with ``SIGN_PACK`` words per tile,
    ``ceil(count * WIDTH / 32)``). With ``SIGN_PACK`` it also writes the tile's value count (``nvals``) and how
    many of its elements have the sign bit set (``nsign``), so the caller can refuse a negative input.
    The tile is read as ``[T // 8, 8]``: row ``a`` holds the 8 elements of mask byte ``a``. With ``RELU``,
    ``bits_ptr`` points to a float tensor ``h`` and the tile counted is ``relu(h)``'s (bits ``BITS_DTYPE``).
    """
    tile = tl.program_id(0)
    rows = tl.arange(0, T // 8)
    cols = tl.arange(0, 8)
    local = rows[:, None] * 8 + cols[None, :]  # 32-bit per element; the tile's start is a scalar pointer
    start = tile.to(tl.int64) * T
    inb = local < tl.minimum(n - start, T).to(tl.int32)
    if RELU:
        x = load_relu(bits_ptr + start, bits_ptr, local, inb, 0, BITS_DTYPE)
    else:
        x = tl.load(bits_ptr + start + local, mask=inb, other=0)
    f = (x != 0).to(tl.int32)
    byte = tl.sum(f << cols[None, :], axis=1)
    tl.store(mask_ptr + tile.to(tl.int64) * (T // 8) + rows, byte.to(tl.uint8))
    count = tl.sum(tl.sum(f, axis=1), axis=0)
    if SIGN_PACK:
        tl.store(sizes_ptr + tile, (count * WIDTH + 31) // 32)
        tl.store(nvals_ptr + tile, count)
        neg = ((x >> (NBITS - 1)) & 1).to(tl.int32)
        tl.store(nsign_ptr + tile, tl.sum(tl.sum(neg, axis=1), axis=0))
    else:
        tl.store(sizes_ptr + tile, count)


@triton.jit
def compact_kernel(
    bits_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base_ptr,
    ok_ptr,
    act_ptr,
    n,
    T: tl.constexpr,
    HAS_OK: tl.constexpr,
    VEC: tl.constexpr = 1,
    SLOT: tl.constexpr = False,
    RELU: tl.constexpr = False,
    ACT_OUT: tl.constexpr = 0,
    BITS_DTYPE: tl.constexpr = tl.int16,
):
    """Pass 2: the stored values of one tile, whole (sign bits kept), at ``values_base + tile_offsets[tile]``,
    or with ``SLOT`` at ``values_base + tile * T`` (a scratch buffer as large as the input; the sign-packing
    pass reads it, see :mod:`actzip.kernels.sparse_signpack_triton`).

    With ``HAS_OK``, no value is written unless ``*ok_ptr`` is true (an arena refused the reservation). With
    ``RELU`` (as in :func:`count_kernel`) the values are ``relu(h)``'s, and ``ACT_OUT`` 1 or 2 writes
    ``relu(h)`` or ``relu(h)²`` to ``act_ptr`` (always, whatever ``ok`` says). With ``SLOT`` the scratch may
    be the input itself: the whole tile is read before the first store (the ranks need all of it).

    Oracle: ``SparseCodec.encode``'s ``values`` (``masked_select``). The rank of a stored element inside its
    tile is the exclusive ``tl.cumsum`` of the flags; each value goes to ``values[base + rank]``. ``VEC``
    (elements in 16 bytes) tells the layout pass that the store's offsets come in aligned runs of ``VEC``,
    which they do not: it is there so that each thread keeps ``VEC`` neighbouring elements (one 16-byte load,
    a scan inside the thread) instead of one element per thread and a warp scan for each. The store stays
    correct because its mask differs from element to element, so it is never vectorized and each element is
    written through its own address (checked on the compiled code by the sm_90 compile test). Measured on an
    H200 (256M bf16 elements, tiles of 4096, count + scan + this pass): 0.52 ms instead of 0.78 at density
    0.5, 0.41 instead of 0.77 at density 0.2.
    """
    tile = tl.program_id(0)
    idx = tl.arange(0, T)
    start = tile.to(tl.int64) * T
    if RELU:
        x = load_relu(bits_ptr + start, act_ptr + start, idx, idx < tl.minimum(n - start, T).to(tl.int32), ACT_OUT,
                      BITS_DTYPE)
        if HAS_OK:  # refused: nothing is stored
            x = tl.where(tl.load(ok_ptr) != 0, x, tl.zeros_like(x))
    else:
        if HAS_OK:
            n = tl.where(tl.load(ok_ptr) != 0, n, 0)  # refused: read nothing, so nothing is stored
        x = tl.load(bits_ptr + start + idx, mask=idx < tl.minimum(n - start, T).to(tl.int32), other=0)
    stored = x != 0
    f = stored.to(tl.int32)
    rank = tl.cumsum(f, axis=0) - f
    if SLOT:
        base = tl.load(values_base_ptr) + start
    else:
        base = tl.load(values_base_ptr) + tl.load(tile_offsets_ptr + tile).to(tl.int64)
    off = base + rank
    if VEC > 1:
        off = tl.max_contiguous(tl.multiple_of(off, VEC), VEC)
    tl.store(values_ptr + off, x, mask=stored)


@triton.jit
def _load_tile_bits_2d(
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base,
    tile,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
):
    # load_tile_bits on a [T // 8, 8] block (element 8*a + b at [a, b]): the layout of the mask bytes, so
    # the ranks come from one scan over T // 8 byte counts plus a scan across 8 lanes.
    rows = tl.arange(0, T // 8)
    cols = tl.arange(0, 8)
    byte = tl.load(mask_ptr + tile.to(tl.int64) * (T // 8) + rows).to(tl.int32)
    f = (byte[:, None] >> cols[None, :]) & 1
    stored = f != 0
    per_byte = tl.sum(f, axis=1)
    rank = (tl.cumsum(per_byte, axis=0) - per_byte)[:, None] + (tl.cumsum(f, axis=1) - f)
    base = values_base + tl.load(tile_offsets_ptr + tile).to(tl.int64)
    if SIGN_PACK:
        start = rank * WIDTH
        j = start >> 5
        o = start & 31
        w0 = tl.load(values_ptr + base + j, mask=stored, other=0)
        w1 = tl.load(values_ptr + base + j + 1, mask=stored & (o + WIDTH > 32), other=0)
        w0 = w0.to(tl.uint32, bitcast=True).to(tl.uint64)
        w1 = w1.to(tl.uint32, bitcast=True).to(tl.uint64)
        v = ((w0 | (w1 << 32)) >> o.to(tl.uint64)) & ((1 << WIDTH) - 1)
        bits = v.to(BITS_DTYPE)
    else:
        bits = tl.load(values_ptr + base + rank, mask=stored, other=0).to(BITS_DTYPE)
    return bits, stored


@triton.jit
def load_tile_bits(
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base,
    tile,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
):
    """Decode one tile of a sparse payload in registers: ``(bits, stored)``, both of shape ``[T]``.

    For use inside other ``@triton.jit`` kernels (fused consumers read a payload tile without a dense copy).

    Arguments:
      mask_ptr: uint8 pointer to the payload's ``mask`` (``T // 8`` bytes per tile).
      tile_offsets_ptr: int32 pointer to the payload's ``tile_offsets``.
      values_ptr: pointer to the payload's ``values``: the bit-view integer dtype, or int32 words with
        ``SIGN_PACK``.
      values_base: int64 scalar added to every tile offset (0 for a payload's own buffer; the payload's start
        when ``values_ptr`` points into a shared arena).
      tile: the tile's index.
      T: tile size, a power of two >= 64 (constexpr).
      WIDTH: bits stored per value (constexpr): the element's bit width, one less with ``SIGN_PACK``
        (must then be <= 31).
      SIGN_PACK: whether values are sign-packed into words (constexpr).
      BITS_DTYPE: the integer view dtype to return, e.g. ``tl.int16`` for bf16 (constexpr).

    Returns ``bits`` (``BITS_DTYPE``: element ``i`` of the tile's raw bits, zero where not stored, the sign
    bit 0 with ``SIGN_PACK``) and ``stored`` (int1: the mask bit of element ``i``). Elements past the tensor's
    end decode as not stored; the caller masks its stores with its own bound. Bitcast ``bits`` to the float
    dtype (``bits.to(tl.bfloat16, bitcast=True)``) to compute with it. Oracle: ``SparseCodec.decode``.
    """
    bits, stored = _load_tile_bits_2d(
        mask_ptr, tile_offsets_ptr, values_ptr, values_base, tile, T, WIDTH, SIGN_PACK, BITS_DTYPE
    )
    return tl.reshape(bits, (T,)), tl.reshape(stored, (T,))


@triton.jit
def decompress_kernel(
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base_ptr,
    out_ptr,
    n,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    SIGN_PACK: tl.constexpr,
):
    """Decode one tile into ``out`` (the raw bits, elements ``< n`` only). Oracle: ``SparseCodec.decode``."""
    tile = tl.program_id(0)
    bits, stored = _load_tile_bits_2d(
        mask_ptr,
        tile_offsets_ptr,
        values_ptr,
        tl.load(values_base_ptr),
        tile,
        T,
        WIDTH,
        SIGN_PACK,
        out_ptr.dtype.element_ty,
    )
    local = tl.arange(0, T // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]
    start = tile.to(tl.int64) * T
    tl.store(out_ptr + start + local, bits, mask=local < tl.minimum(n - start, T).to(tl.int32))


# Triton picks between compiling and interpreting when a kernel is defined (TRITON_INTERPRET=1).
INTERPRETED = type(count_kernel).__name__ == "InterpretedFunction"


# -- host code --------------------------------------------------------------------------------------------


def check_tile_size(tile_size: int) -> int:
    """Raise :class:`ConfigError` unless ``tile_size`` suits the kernels: a power of two in [64, 65536]."""
    ok = isinstance(tile_size, int) and MIN_TILE_SIZE <= tile_size <= MAX_TILE_SIZE
    if not ok or tile_size & (tile_size - 1):
        raise ConfigError(
            f"sparse Triton kernels: tile_size must be a power of two from {MIN_TILE_SIZE} to {MAX_TILE_SIZE}, "
            f"got {tile_size!r}"
        )
    return tile_size


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in _NBITS else bit_view_dtype(dtype)


def _width(bits_dtype: torch.dtype, sign_pack: bool) -> int:
    nbits = _NBITS[bits_dtype]
    if sign_pack and nbits > 32:
        raise ConfigError(
            "sparse Triton kernels: sign packing of 64-bit elements is not implemented (use kernel='torch')"
        )
    return nbits - 1 if sign_pack else nbits


def _num_warps(tile_size: int) -> int:
    # Measured on an H200 (64M elements, bf16/fp8/fp32): 4 warps are best or within noise from 1024 to 4096
    # elements a tile; with 2 warps the sign-packing scan of a 4096-element tile ran 10x slower.
    return 8 if tile_size > 4096 else max(1, min(4, tile_size // 256))


def _base(values_offset: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    if values_offset is None:
        return torch.zeros(1, dtype=torch.int64, device=device)
    if values_offset.dtype != torch.int64 or values_offset.numel() != 1 or values_offset.device != device:
        raise ConfigError(
            f"values_offset must be a one-element int64 tensor on {device}, got {values_offset.dtype} "
            f"of {values_offset.numel()} elements on {values_offset.device}"
        )
    return values_offset


def _check_bits(bits: torch.Tensor, n: int) -> torch.Tensor:
    if bits.dtype not in _NBITS:
        bits = bits.view(bit_view_dtype(bits.dtype))
    if bits.dim() != 1 or not bits.is_contiguous() or bits.numel() < n:
        raise ConfigError(
            f"sparse Triton kernels: the input must be a contiguous 1-D tensor of at least n={n} elements, got "
            f"shape {tuple(bits.shape)}{'' if bits.is_contiguous() else ' (not contiguous)'}"
        )
    return bits


class TileCounts(NamedTuple):
    """Pass 1 and the scan: everything but the values (all tensors on the input's device)."""

    mask: torch.Tensor  # uint8 [n_tiles * T / 8]: the payload's mask
    sizes: torch.Tensor  # int32 [n_tiles]: values per tile (int32 words with sign packing)
    tile_offsets: torch.Tensor  # int32 [n_tiles]: exclusive prefix sum of sizes (the payload's tile_offsets)
    total: torch.Tensor  # int64 [1]: sum of sizes, the values buffer's length
    nnz: torch.Tensor  # int64 [1]: stored elements
    sign_set: torch.Tensor | None  # int64 [1]: elements with the sign bit set (sign packing only), else None
    nvals: torch.Tensor  # int32 [n_tiles]: values per tile (sizes itself without sign packing)


class Compressed(NamedTuple):
    """The sparse payload's buffers, plus device-side counts."""

    mask: torch.Tensor  # uint8
    tile_offsets: torch.Tensor  # int32, relative to the start of this payload's values
    values: torch.Tensor  # the values buffer (bit-view dtype, or int32 words with sign packing)
    total: torch.Tensor  # int64 [1]: elements of ``values`` this payload uses
    nnz: torch.Tensor  # int64 [1]: stored elements
    sign_set: torch.Tensor | None  # int64 [1]: elements with the sign bit set (sign packing only)


_RELU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _relu_source(src: torch.Tensor, n: int) -> torch.Tensor:
    if src.dtype not in _RELU_DTYPES:
        raise ConfigError(f"sparse Triton kernels: relu=True takes float32, float16 or bfloat16, got {src.dtype}")
    _check_bits(src, n)
    return src


def count(
    bits: torch.Tensor, n: int, tile_size: int = DEFAULT_TILE_SIZE, sign_pack: bool = False, *, relu: bool = False
) -> TileCounts:
    """Pass 1 (:func:`count_kernel`) and the device-side scan. No host synchronization.

    ``bits``: the first ``n`` elements of a contiguous 1-D tensor, in an integer view dtype (uint8, int16,
    int32, int64) or a float dtype (viewed as its integer dtype). ``relu=True``: count ``relu(bits)`` of a
    float ``bits``.
    """
    check_tile_size(tile_size)
    src = _relu_source(bits, n) if relu else None
    bits = _check_bits(bits, n)
    width = _width(bits.dtype, sign_pack)
    dev = bits.device
    n_tiles = -(-n // tile_size)
    mask = torch.empty(n_tiles * tile_size // 8, dtype=torch.uint8, device=dev)
    sizes = torch.empty(n_tiles, dtype=torch.int32, device=dev)
    nvals = torch.empty(n_tiles, dtype=torch.int32, device=dev) if sign_pack else sizes
    nsign = torch.empty(n_tiles, dtype=torch.int32, device=dev) if sign_pack else sizes
    if n_tiles:
        count_kernel[(n_tiles,)](
            src if relu else bits, mask, sizes, nvals, nsign, n,
            T=tile_size, NBITS=_NBITS[bits.dtype], WIDTH=width, SIGN_PACK=sign_pack, RELU=relu,
            BITS_DTYPE=_TL_DTYPE[bits.dtype], num_warps=_num_warps(tile_size),
        )  # fmt: skip
    incl = torch.cumsum(sizes, 0, dtype=torch.int64)
    tile_offsets = (incl - sizes).to(torch.int32)
    zero = torch.zeros(1, dtype=torch.int64, device=dev)
    total = incl[-1:] if n_tiles else zero
    if sign_pack:
        nnz = nvals.sum(dtype=torch.int64).reshape(1)
        sign_set = nsign.sum(dtype=torch.int64).reshape(1)
    else:
        nnz, sign_set = total, None
    return TileCounts(mask, sizes, tile_offsets, total, nnz, sign_set, nvals)


def compact(
    bits: torch.Tensor,
    n: int,
    counts: TileCounts,
    values: torch.Tensor,
    tile_size: int = DEFAULT_TILE_SIZE,
    sign_pack: bool = False,
    values_offset: torch.Tensor | None = None,
    ok: torch.Tensor | None = None,
    *,
    relu: bool = False,
    act: torch.Tensor | None = None,
    square: bool = False,
    scratch: torch.Tensor | None = None,
    scratch_slots: bool = True,
) -> None:
    """Pass 2 (:func:`compact_kernel`): write the stored values into ``values``. No host synchronization.

    ``values`` must hold ``values_offset + counts.total`` elements (not checked: that would synchronize); it
    needs no zeroing. ``values_offset`` (one-element int64 tensor on the device, default 0) is where this
    payload's values start in ``values``. ``ok`` (one-element bool tensor on the device): write only if true.
    ``relu=True`` (``bits`` a float tensor, as :func:`count` was given): store ``relu(bits)``, and write
    ``relu(bits)`` (or its square, ``square=True``) into ``act`` if given.

    With ``sign_pack`` the values are compacted whole into ``scratch`` (the bit-view dtype), then packed
    (:mod:`actzip.kernels.sparse_signpack_triton`): with ``scratch_slots`` it needs one element per input
    element (the input itself will do when nothing reads it afterwards; ``None``: allocated), else
    ``counts.nnz`` elements.
    """
    check_tile_size(tile_size)
    src = _relu_source(bits, n) if relu else None
    bits = _check_bits(bits, n)
    width = _width(bits.dtype, sign_pack)
    want = torch.int32 if sign_pack else bits.dtype
    if values.dtype != want or values.device != bits.device:
        raise ConfigError(f"values must be a {want} tensor on {bits.device}, got {values.dtype} on {values.device}")
    n_tiles = counts.sizes.numel()
    if not n_tiles:
        return
    dev = bits.device
    # An int32 flag: bool pointers are not loadable everywhere (Triton's interpreter refuses them as masks).
    okp = ok.to(torch.int32) if ok is not None else counts.tile_offsets  # unused without HAS_OK
    if sign_pack:
        if scratch is None:
            if not scratch_slots:
                raise ConfigError("sign packing with scratch_slots=False needs a scratch buffer of counts.nnz elements")
            scratch = torch.empty(n_tiles * tile_size, dtype=bits.dtype, device=dev)
        if scratch.dtype != bits.dtype or scratch.device != dev or (scratch_slots and scratch.numel() < n):
            raise ConfigError(f"scratch must be a {bits.dtype} tensor on {dev}"
                              f"{f' of at least {n} elements' if scratch_slots else ''}, got {scratch.dtype} on "
                              f"{scratch.device}, {scratch.numel()} elements")
        value_offsets = None if scratch_slots else torch.cumsum(counts.nvals, 0, dtype=torch.int64) - counts.nvals
        target, offsets, base = scratch, value_offsets if value_offsets is not None else counts.tile_offsets, None
    else:
        target, offsets, base = values, counts.tile_offsets, values_offset
    compact_kernel[(n_tiles,)](
        src if relu else bits, offsets, target, _base(base, dev), okp, act if act is not None else bits, n,
        T=tile_size, HAS_OK=ok is not None, VEC=16 // bits.element_size(), SLOT=sign_pack and scratch_slots,
        RELU=relu, ACT_OUT=0 if act is None else 2 if square else 1, BITS_DTYPE=_TL_DTYPE[bits.dtype],
        num_warps=_num_warps(tile_size),
    )  # fmt: skip
    if sign_pack:
        from actzip.kernels.sparse_signpack_triton import pack

        pack(scratch, counts.nvals, counts.tile_offsets, values, width, tile_size, value_offsets=value_offsets,
             words_base=_base(values_offset, dev), ok=okp if ok is not None else None)


def compress(
    bits: torch.Tensor,
    n: int,
    tile_size: int = DEFAULT_TILE_SIZE,
    sign_pack: bool = False,
    values: torch.Tensor | None = None,
    values_offset: torch.Tensor | None = None,
) -> Compressed:
    """Encode the first ``n`` elements of ``bits`` (contiguous 1-D; see :func:`count`) in the sparse format.

    With ``values=None`` the values buffer is allocated here, which needs its length on the host: that is the
    one host synchronization (one ``.item()``). Pass a preallocated ``values`` buffer (the bit-view dtype, or
    int32 with ``sign_pack``; no zeroing needed) and optionally ``values_offset``, a one-element int64 tensor
    on the device saying where this payload starts in it, to encode with no synchronization at all; the
    returned ``total`` (on the device) says how many elements were used. The sign bit is dropped with
    ``sign_pack`` whether set or not: ``sign_set`` counts the elements that had it. Sign packing needs scratch
    room for the values before packing: as many elements as stored values when the sizes are read, else as
    many as the input has, for the duration of the call.
    """
    c = count(bits, n, tile_size, sign_pack)
    bits_dtype = _check_bits(bits, n).dtype
    scratch = None
    if values is None:
        if sign_pack:
            total, nnz = torch.cat([c.total, c.nnz]).tolist()  # the one host synchronization
            scratch = torch.empty(nnz, dtype=bits_dtype, device=bits.device)
        else:
            total = int(c.total.item())
        values = torch.empty(total, dtype=torch.int32 if sign_pack else bits_dtype, device=bits.device)
    compact(bits, n, c, values, tile_size, sign_pack, values_offset, scratch=scratch, scratch_slots=scratch is None)
    return Compressed(c.mask, c.tile_offsets, values, c.total, c.nnz, c.sign_set)


def decompress(
    mask: torch.Tensor,
    tile_offsets: torch.Tensor,
    values: torch.Tensor,
    n: int,
    dtype: torch.dtype,
    tile_size: int = DEFAULT_TILE_SIZE,
    sign_pack: bool = False,
    out: torch.Tensor | None = None,
    values_offset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``n`` elements from sparse buffers into the raw bits (1-D, the integer view of ``dtype``).

    ``dtype``: the encoded tensor's dtype or its integer view. ``out``: optional contiguous 1-D buffer of at
    least ``n`` elements of that integer dtype. ``values_offset``: as in :func:`compress`. No host
    synchronization.
    """
    check_tile_size(tile_size)
    bits_dtype = _bits_dtype(dtype)
    width = _width(bits_dtype, sign_pack)
    dev = mask.device
    if out is None:
        out = torch.empty(n, dtype=bits_dtype, device=dev)
    elif out.dtype != bits_dtype or out.dim() != 1 or not out.is_contiguous() or out.numel() < n:
        raise ConfigError(f"out must be a contiguous 1-D {bits_dtype} tensor of at least {n} elements")
    n_tiles = -(-n // tile_size)
    if mask.numel() < n_tiles * tile_size // 8 or tile_offsets.numel() < n_tiles:
        raise ConfigError(
            f"sparse buffers too small for {n} elements in tiles of {tile_size}: mask has {mask.numel()} bytes, "
            f"tile_offsets {tile_offsets.numel()} entries"
        )
    if n_tiles:
        decompress_kernel[(n_tiles,)](
            mask, tile_offsets, values, _base(values_offset, dev), out, n,
            T=tile_size, WIDTH=width, SIGN_PACK=sign_pack, num_warps=_num_warps(tile_size),
        )  # fmt: skip
    return out
