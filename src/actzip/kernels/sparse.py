"""Triton kernels of the sparse codec's format (see :mod:`actzip.codecs.sparse` for the format itself): its two
encoding passes and its decoder.

One program per tile of ``T`` elements (``T`` a power of two, a compile-time constant). Elements are the
tensor's raw bits in memory order, read through a same-width integer view (uint8 for fp8, int16 for
fp16/bf16, int32 for fp32, int64 for fp64), so the kernels move bits and never do float arithmetic.

Encoding is two passes over the input with a device-side scan between them:

1. :func:`count_kernel` writes each tile's mask bytes and its size in the values buffer (values, or int32
   words with sign packing);
2. ``torch.cumsum`` of the sizes gives every tile's exclusive offset (``tile_offsets``), on the device;
3. :func:`compact_kernel` writes each tile's stored values, whole, at its offset (or, for sign packing, into
   scratch room that :mod:`actzip.kernels.sparse_signpack` packs into words).

Both passes can apply a ReLU to a float input themselves (``relu=True``), and the compact pass can write the
activation (``relu(h)`` or ``relu(h)²``) as it goes. :func:`actzip.kernels.sparse_encode.encode`, the one
encoder every caller runs (the codec and the fused MLPs), puts these passes together with an arena
reservation and sign packing between them.

:func:`decompress_kernel` rebuilds the raw bits, one tile per program, through :func:`load_tile_bits`, a
``@triton.jit`` helper that other kernels can call to read one tile of a payload without a dense copy. It
loads each stored value on its own (``values[base + rank]``); :func:`decompress` runs by default the decoder of
:mod:`actzip.kernels.sparse_decode` (``variant="run"``), which reads a tile's values as one contiguous run.

Python entry points: :func:`count` and :func:`compact` (the two passes) and :func:`decompress`. The PyTorch
codec ``actzip.codecs.get("sparse", kernel="torch")`` is the oracle: both make the same buffers bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from actzip.errors import ConfigError
from actzip.kernels import sparse_decode
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse_launch import (
    DEFAULT_TILE_SIZE,
    NBITS,
    TL_BITS,
    bits_dtype,
    check_bits,
    check_tile_size,
    num_warps,
    value_width,
    values_base,
)

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["DECODE_VARIANTS", "INTERPRETED", "TileCounts", "compact", "compact_kernel", "count", "count_kernel",
           "decompress", "decompress_kernel", "load_relu", "load_tile_bits", "relu_bits"]

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
    pass reads it, see :mod:`actzip.kernels.sparse_signpack`).

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


class TileCounts(NamedTuple):
    """Pass 1 and the scan: everything but the values (all tensors on the input's device)."""

    mask: torch.Tensor  # uint8 [n_tiles * T / 8]: the payload's mask
    sizes: torch.Tensor  # int32 [n_tiles]: values per tile (int32 words with sign packing)
    tile_offsets: torch.Tensor  # int32 [n_tiles]: exclusive prefix sum of sizes (the payload's tile_offsets)
    total: torch.Tensor  # int64 [1]: sum of sizes, the values buffer's length
    nnz: torch.Tensor  # int64 [1]: stored elements
    sign_set: torch.Tensor | None  # int64 [1]: elements with the sign bit set (sign packing only), else None
    nvals: torch.Tensor  # int32 [n_tiles]: values per tile (sizes itself without sign packing)


RELU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what relu=True takes
DECODE_VARIANTS = ("gather", "run")  # decompress's decoders: values loaded one by one, or as a run per tile


def _relu_source(src: torch.Tensor, n: int) -> torch.Tensor:
    if src.dtype not in RELU_DTYPES:
        raise ConfigError(f"sparse Triton kernels: relu=True takes float32, float16 or bfloat16, got {src.dtype}")
    check_bits(src, n)
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
    bits = check_bits(bits, n)
    width = value_width(bits.dtype, sign_pack)
    dev = bits.device
    n_tiles = -(-n // tile_size)
    mask = torch.empty(n_tiles * tile_size // 8, dtype=torch.uint8, device=dev)
    sizes = torch.empty(n_tiles, dtype=torch.int32, device=dev)
    nvals = torch.empty(n_tiles, dtype=torch.int32, device=dev) if sign_pack else sizes
    nsign = torch.empty(n_tiles, dtype=torch.int32, device=dev) if sign_pack else sizes
    if n_tiles:
        count_kernel[(n_tiles,)](
            src if relu else bits, mask, sizes, nvals, nsign, n,
            T=tile_size, NBITS=NBITS[bits.dtype], WIDTH=width, SIGN_PACK=sign_pack, RELU=relu,
            BITS_DTYPE=TL_BITS[bits.dtype], num_warps=num_warps(tile_size),
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
    out: torch.Tensor,
    tile_size: int = DEFAULT_TILE_SIZE,
    *,
    offsets: torch.Tensor | None = None,
    slots: bool = False,
    out_offset: torch.Tensor | None = None,
    ok: torch.Tensor | None = None,
    relu: bool = False,
    act: torch.Tensor | None = None,
    square: bool = False,
) -> None:
    """Pass 2 (:func:`compact_kernel`): write every tile's stored values, whole (sign bits kept), into ``out``
    (the bit-view dtype). No host synchronization.

    A tile's values go to ``out_offset + offsets[tile]`` (``offsets``: any int per tile, default
    ``counts.tile_offsets``; ``out_offset``: one-element int64 device tensor, default 0), or with ``slots`` to
    slot ``tile * tile_size`` (``out`` then holds at least ``n`` elements: the scratch of sign packing, which
    may be the input itself). ``out`` must be large enough (not checked: that would synchronize) and needs no
    zeroing. ``ok`` (one-element int device tensor): write only if nonzero. ``relu=True`` (``bits`` a float
    tensor, as :func:`count` was given): store ``relu(bits)``, and write ``relu(bits)`` (or its square,
    ``square=True``) into ``act`` if given.
    """
    check_tile_size(tile_size)
    src = _relu_source(bits, n) if relu else None
    bits = check_bits(bits, n)
    dev = bits.device
    if out.dtype != bits.dtype or out.device != dev or (slots and out.numel() < n):
        raise ConfigError(f"sparse compact: out must be a {bits.dtype} tensor on {dev}"
                          f"{f' of at least {n} elements' if slots else ''}, got {out.dtype} on {out.device}, "
                          f"{out.numel()} elements")  # fmt: skip
    n_tiles = counts.sizes.numel()
    if not n_tiles:
        return
    # An int32 flag: bool pointers are not loadable everywhere (Triton's interpreter refuses them as masks).
    okp = ok.to(torch.int32) if ok is not None else counts.tile_offsets  # unused without HAS_OK
    compact_kernel[(n_tiles,)](
        src if relu else bits, counts.tile_offsets if offsets is None else offsets, out,
        values_base(out_offset, dev), okp, act if act is not None else bits, n,
        T=tile_size, HAS_OK=ok is not None, VEC=16 // bits.element_size(), SLOT=slots, RELU=relu,
        ACT_OUT=0 if act is None else 2 if square else 1, BITS_DTYPE=TL_BITS[bits.dtype],
        num_warps=num_warps(tile_size),
    )  # fmt: skip


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
    *,
    variant: str = "run",
) -> torch.Tensor:
    """Decode ``n`` elements from sparse buffers into the raw bits (1-D, the integer view of ``dtype``).

    ``dtype``: the encoded tensor's dtype or its integer view. ``out``: optional contiguous 1-D buffer of at
    least ``n`` elements of that integer dtype. ``values_offset``: one-element int64 device tensor, where the
    payload's values start in ``values`` (default 0). ``variant``: the decoder, one of
    :data:`DECODE_VARIANTS`: ``"run"`` (the default: :func:`actzip.kernels.sparse_decode.decode_run`, with its
    default knobs, the faster on an H200) or ``"gather"`` (:func:`decompress_kernel`); sign-packed payloads, and masks
    not 4-byte aligned, always take ``"gather"``. Both give the same bits. No host synchronization.
    """
    if variant not in DECODE_VARIANTS:
        raise ConfigError(f"sparse decompress: variant must be one of {DECODE_VARIANTS}, got {variant!r}")
    check_tile_size(tile_size)
    view = bits_dtype(dtype)
    width = value_width(view, sign_pack)
    dev = mask.device
    if out is None:
        out = torch.empty(n, dtype=view, device=dev)
    elif out.dtype != view or out.dim() != 1 or not out.is_contiguous() or out.numel() < n:
        raise ConfigError(f"out must be a contiguous 1-D {view} tensor of at least {n} elements")
    n_tiles = -(-n // tile_size)
    if mask.numel() < n_tiles * tile_size // 8 or tile_offsets.numel() < n_tiles:
        raise ConfigError(
            f"sparse buffers too small for {n} elements in tiles of {tile_size}: mask has {mask.numel()} bytes, "
            f"tile_offsets {tile_offsets.numel()} entries"
        )
    base = values_base(values_offset, dev)
    run = variant == "run" and not sign_pack and values.element_size() == out.element_size()
    if n_tiles and run and sparse_decode.run_supported(mask):
        sparse_decode.decode_run(mask, tile_offsets, values.view(view), base, out, n, tile_size)
    elif n_tiles:
        decompress_kernel[(n_tiles,)](
            mask, tile_offsets, values, base, out, n,
            T=tile_size, WIDTH=width, SIGN_PACK=sign_pack, num_warps=num_warps(tile_size),
        )  # fmt: skip
    return out
