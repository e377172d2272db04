"""Dense bit packing in pure PyTorch: booleans to bytes, w-bit integers to a byte stream, and w-bit
integers to per-tile streams of 32-bit words.

Bit order is little-endian throughout: bit ``i`` of byte ``j`` is element ``8*j + i``; a w-bit value's bit
``k`` sits at stream position ``w*index + k``; stream bit ``p`` of a word stream is bit ``p % 32`` of word
``p // 32``. The Triton kernels use the same order, so these functions are their oracle.
"""

from __future__ import annotations

import functools

import torch

# Elements handled per chunk when packing integers, bounding the temporary (chunk * width) bit tensor.
_CHUNK = 1 << 20


@functools.lru_cache(maxsize=None)
def _byte_weights(device: torch.device) -> torch.Tensor:
    # Cached per device: building it is a host-to-device copy, which would otherwise run on every call.
    return torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)


# Eight flags per 64-bit word, in elementwise passes over words (a reduction over groups of 8 is slow on GPUs).
# Packing: the flag bytes b_0..b_7 of a little-endian word, times this constant, land as b_i << (56 + i) in the
# top byte; every other product falls above bit 63 (dropped: the multiplication wraps) or on a distinct bit below
# 56, so nothing carries into the top byte.
_GATHER = 0x0102040810204080
_SPREAD = 0x0101010101010101  # the packed byte copied into all 8 bytes of a word
_SELECT = 0x8040201008040201 - (1 << 64)  # byte i keeps bit i (as an int64 constant)
_TOP_UP = 0x7F7F7F7F7F7F7F7F  # per byte: 0 stays below 0x80, any set bit reaches it; no carry between bytes
_LOW = 0x0101010101010101


def _word_view(flags: torch.Tensor) -> torch.Tensor | None:
    """``flags`` (bool, 1-D) seen as int64 words, or ``None`` where that view is not possible."""
    if flags.dtype != torch.bool or not flags.is_contiguous() or flags.storage_offset() % 8 or flags.numel() % 8:
        return None
    try:
        return flags.view(torch.int64)
    except RuntimeError:  # a storage the view cannot take (alignment)
        return None


def pack_bool(bits: torch.Tensor) -> torch.Tensor:
    """Pack a 1-D bool tensor whose length is a multiple of 8 into uint8 (8 flags per byte)."""
    if bits.numel() % 8:
        raise ValueError(f"pack_bool needs a multiple of 8 flags, got {bits.numel()}")
    words = _word_view(bits.reshape(-1))
    if words is not None:
        return ((words * _GATHER) >> 56).to(torch.uint8)  # the cast keeps the low byte: the flags
    b = bits.reshape(-1, 8).to(torch.uint8)
    # Sum of distinct powers of two never exceeds 255, so uint8 accumulation is exact.
    return (b * _byte_weights(bits.device)).sum(dim=1, dtype=torch.uint8)


def unpack_bool(packed: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_bool`; keep the first ``n`` flags (all when ``None``)."""
    words = (packed.reshape(-1).to(torch.int64) * _SPREAD).bitwise_and_(_SELECT)
    bits = words.add_(_TOP_UP).bitwise_right_shift_(7).bitwise_and_(_LOW).view(torch.bool)
    return bits if n is None else bits[:n]


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Pack the low ``width`` bits of each integer in 1-D ``values`` into a dense uint8 stream.

    The stream has ``ceil(len(values) * width / 8)`` bytes; the trailing pad bits are zero.
    """
    if not 1 <= width <= 64:
        raise ValueError(f"width must be in 1..64, got {width}")
    n = values.numel()
    if width in _NARROW and n % (8 // width) == 0:
        return _pack_narrow(values, width)
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
    if width in _NARROW and n % (8 // width) == 0:
        return _unpack_narrow(packed, width)[:n].to(dtype)
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


# Widths that divide a byte: packed in one vectorized step, without a bit-per-element temporary.
_NARROW = (1, 2, 4, 8)


def _pack_narrow(values: torch.Tensor, width: int) -> torch.Tensor:
    codes = (values & ((1 << width) - 1)).to(torch.uint8)
    if width == 8:
        return codes.reshape(-1)
    per = 8 // width
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=values.device)
    # Disjoint bit fields: the uint8 sum is an exact bitwise OR.
    return (codes.reshape(-1, per) << shifts).sum(dim=1, dtype=torch.uint8)


def _unpack_narrow(packed: torch.Tensor, width: int) -> torch.Tensor:
    if width == 8:
        return packed.reshape(-1)
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=packed.device)
    return ((packed.unsqueeze(1) >> shifts) & ((1 << width) - 1)).reshape(-1)


def _to_dtype_bits(v: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    bits = dtype.itemsize * 8
    if width == bits and dtype.is_signed and v.dtype.itemsize * 8 > bits:
        # Fold values >= 2**(bits-1) into the negative range, as the bit pattern would read.
        v = torch.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v.to(dtype)


# -- per-tile word streams ----------------------------------------------------------------------------------
#
# The values of each tile are packed into their own stream of int32 words: value ``r`` of a tile occupies bits
# ``[r*w, r*w + w)`` of that tile's stream, the stream has ``ceil(count*w / 32)`` words (pad bits zero), and
# the tiles' streams follow each other. Every tile thus starts on a word boundary, so tiles can be packed and
# unpacked independently (one GPU program per tile) with no two tiles writing the same word.

_M32 = (1 << 32) - 1


def tile_words(counts: torch.Tensor, width: int) -> torch.Tensor:
    """Words of each tile's stream: ``ceil(counts * width / 32)`` (int64)."""
    return (counts.to(torch.int64) * width + 31) // 32


def _low_mask(width: int) -> int:
    return (1 << width) - 1


def _to_int32_words(w: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit words -> int32 with the same bits."""
    return torch.where(w >= (1 << 31), w - (1 << 32), w).to(torch.int32)


def pack_tile_words(
    values: torch.Tensor, counts: torch.Tensor, width: int, total_words: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack the low ``width`` bits of ``values`` into per-tile word streams (see above).

    ``values`` holds the values of all tiles, tile after tile; ``counts[k]`` is how many belong to tile ``k``
    (``counts.sum() == values.numel()``). Returns ``(words, word_offsets)``: the int32 stream of all tiles and
    the int64 exclusive prefix sum of the tiles' word counts. ``total_words`` (the sum of
    :func:`tile_words`) is read from the device when not given: that is a host synchronization.

    Every word is gathered from the (at most ``ceil(32 / width) + 1``) values that touch it, so no two values
    are ever combined by a scatter: the result is deterministic on every device.
    """
    if not 1 <= width <= 63:
        raise ValueError(f"width must be in 1..63, got {width}")
    dev = values.device
    counts = counts.to(torch.int64)
    words = tile_words(counts, width)
    words_incl = torch.cumsum(words, 0)
    word_offsets = words_incl - words
    if total_words is None:
        total_words = int(words_incl[-1]) if words_incl.numel() else 0
    out = torch.empty(total_words, dtype=torch.int32, device=dev)
    nnz = values.numel()
    if total_words == 0:
        return out, word_offsets
    first = torch.cumsum(counts, 0) - counts  # index in ``values`` of each tile's value 0
    low = values.to(torch.int64) & _low_mask(width)
    touching = -(-32 // width) + 1  # values that can share one word
    chunk = max(1, _CHUNK // touching)
    for start in range(0, total_words, chunk):
        q = torch.arange(start, min(start + chunk, total_words), dtype=torch.int64, device=dev)
        tile = torch.searchsorted(words_incl, q, right=True)
        ql = q - word_offsets[tile]  # word index inside the tile's stream
        r0 = (32 * ql) // width  # first value of the tile touching this word
        acc = torch.zeros_like(q)
        for t in range(touching):
            r = r0 + t
            valid = r < counts[tile]
            g = (first[tile] + r).clamp_(max=max(nnz - 1, 0))
            v = torch.where(valid, low[g], 0)
            d = r * width - 32 * ql  # where the value starts, relative to the word's bit 0 (may be < 0)
            up = (v & (_M32 >> d.clamp(0, 31))) << d.clamp(0, 31)
            down = torch.where(d > -64, v >> (-d).clamp(0, 63), 0) & _M32
            acc |= torch.where(d >= 0, torch.where(d < 32, up, 0), down)
        out[start : start + q.numel()] = _to_int32_words(acc)
    return out, word_offsets


def unpack_tile_words(
    words: torch.Tensor,
    counts: torch.Tensor,
    word_offsets: torch.Tensor,
    width: int,
    dtype: torch.dtype,
    nnz: int | None = None,
) -> torch.Tensor:
    """Inverse of :func:`pack_tile_words`: the ``counts.sum()`` (``nnz`` if given) values, as ``dtype``.

    Each value is gathered from the two (three for ``width > 33``) words it can span.
    """
    if not 1 <= width <= 63:
        raise ValueError(f"width must be in 1..63, got {width}")
    dev = words.device
    counts = counts.to(torch.int64)
    word_offsets = word_offsets.to(torch.int64)
    counts_incl = torch.cumsum(counts, 0)
    if nnz is None:
        nnz = int(counts_incl[-1]) if counts_incl.numel() else 0
    out = torch.empty(nnz, dtype=dtype, device=dev)
    if nnz == 0:
        return out
    w64 = words.to(torch.int64) & _M32
    last = w64.numel() - 1
    spans = (31 + width - 1) // 32 + 1  # words one value can touch
    for start in range(0, nnz, _CHUNK):
        g = torch.arange(start, min(start + _CHUNK, nnz), dtype=torch.int64, device=dev)
        tile = torch.searchsorted(counts_incl, g, right=True)
        r = g - (counts_incl[tile] - counts[tile])
        pos = word_offsets[tile] * 32 + r * width
        j, o = pos >> 5, pos & 31
        v = w64[j] >> o
        for t in range(1, spans):
            wt = torch.where(j + t <= last, w64[(j + t).clamp_(max=last)], 0)
            sh = 32 * t - o  # in [1, 64]
            v |= torch.where(sh < 64, wt << sh.clamp(max=63), 0)
        out[start : start + g.numel()] = (v & _low_mask(width)).to(dtype)
    return out
