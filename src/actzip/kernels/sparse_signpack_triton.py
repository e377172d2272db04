"""Sign packing for the sparse codec's Triton encoder: a tile's compacted values -> its stream of ``WIDTH``-bit
fields in int32 words (the format is in :mod:`actzip.codecs.sparse`).

Packing while compacting needs, at every value, the bits of the values just before it in the tile's stream,
which sit in other threads. A scan that carried a 64-bit window of the stream did it in registers, at a third
of the unpacked encoder's speed (H200, 256M bf16 elements: 1.95 ms against 0.52); a separate packing kernel
after the compaction was no better (1.30 ms: one more launch over every tile, each waiting on two dependent
loads). Here one program per tile compacts its values whole into its own slot of a scratch buffer (the
unpacked encoder's work), waits at a barrier until the whole tile is there, and makes every output word from
the few values it covers: word ``j`` holds stream bits ``[32j, 32j + 32)``, i.e. parts of values
``32j // WIDTH`` to ``(32j + 31) // WIDTH``. The reads hit the cache lines the program has just written, the
word stores are contiguous, and no word has two writers.

The scratch needs a slot of ``T`` elements per tile (as many elements as the input). The input itself will do
when nothing reads it afterwards: each program reads its whole tile before writing its slot.

Oracle: ``actzip.codecs.bitpack.pack_tile_words`` (the PyTorch codec's packing).
"""

from __future__ import annotations

import triton
import triton.language as tl

from actzip.kernels.sparse_triton import tile_values


def lanes(tile_size: int, width: int) -> int:
    """The words a tile can fill, rounded up to a power of two (the packing loop's block)."""
    return triton.next_power_of_2(-(-tile_size * width // 32))


@triton.jit
def pack_words(src, count, WIDTH: tl.constexpr, LANES: tl.constexpr):
    """``(j, word, live)``: words ``j`` of the stream of the ``count`` values at ``src`` (sign bits ignored);
    ``live`` marks the ``ceil(count * WIDTH / 32)`` words that exist."""
    j = tl.arange(0, LANES)
    live = j < (count * WIDTH + 31) // 32
    first = (32 * j) // WIDTH
    word = tl.zeros([LANES], dtype=tl.uint32)
    # A word spans at most 32 // WIDTH + 2 values; a value's field starts `pos` bits into the word (negative:
    # it began in the word before). 32-bit arithmetic throughout, every shift in [0, 31].
    for k in tl.static_range(32 // WIDTH + 2):
        r = first + k
        pos = r * WIDTH - 32 * j
        v = tl.load(src + r, mask=live & (r < count) & (pos < 32), other=0)
        v = (v.to(tl.int32) & ((1 << WIDTH) - 1)).to(tl.uint32, bitcast=True)
        left = tl.minimum(tl.maximum(pos, 0), 31).to(tl.uint32)
        right = tl.minimum(tl.maximum(-pos, 0), 31).to(tl.uint32)
        word |= (v << left) >> right
    return j, word.to(tl.int32, bitcast=True), live


@triton.jit
def compact_pack_kernel(
    bits_ptr,
    tile_offsets_ptr,
    scratch_ptr,
    words_ptr,
    words_base_ptr,
    ok_ptr,
    act_ptr,
    n,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    LANES: tl.constexpr,
    HAS_OK: tl.constexpr,
    VEC: tl.constexpr = 1,
    RELU: tl.constexpr = False,
    ACT_OUT: tl.constexpr = 0,
    BITS_DTYPE: tl.constexpr = tl.int16,
):
    """One tile of a sign-packed payload: its words at ``words_base + tile_offsets[tile]`` (``tile_offsets`` in
    words). ``HAS_OK``, ``RELU``, ``ACT_OUT``: as in :func:`actzip.kernels.sparse_triton.tile_values`; ``VEC``:
    as in :func:`actzip.kernels.sparse_triton.compact_kernel`. ``LANES``: :func:`lanes` of ``T`` and
    ``WIDTH``."""
    tile = tl.program_id(0)
    x, stored, rank = tile_values(bits_ptr, ok_ptr, act_ptr, n, tile, T, HAS_OK, RELU, ACT_OUT, BITS_DTYPE)
    slot = scratch_ptr + tile.to(tl.int64) * T
    off = rank
    if VEC > 1:
        off = tl.max_contiguous(tl.multiple_of(off, VEC), VEC)
    tl.store(slot + off, x, mask=stored)
    # Every thread's values in the slot before any thread reads them (a CTA barrier orders global memory too).
    tl.debug_barrier()
    j, word, live = pack_words(slot, tl.sum(stored.to(tl.int32), axis=0), WIDTH, LANES)
    tl.store(words_ptr + tl.load(words_base_ptr) + tl.load(tile_offsets_ptr + tile).to(tl.int64) + j, word,
             mask=live)
