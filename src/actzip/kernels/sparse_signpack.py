"""Sign packing for the sparse codec's Triton encoders: compacted values -> each tile's stream of ``WIDTH``-bit
fields in int32 words (the format is in :mod:`actzip.codecs.sparse`).

Packing while compacting needs, at every value, the bits of the values just before it in the tile's stream,
which sit in other threads: a scan that carried a 64-bit window of the stream did it in one pass, at a third
of the unpacked encoder's speed (H200, 256M bf16 elements: 1.95 ms against 0.52). Here the values are first
compacted whole into a scratch buffer (the unpacked encoder's pass, at its speed), then :func:`pack_kernel`
makes every output word from the few values it covers: word ``j`` of a tile holds stream bits
``[32j, 32j + 32)``, i.e. parts of values ``32j // WIDTH`` to ``(32j + 31) // WIDTH``; it reads them (cached:
neighbouring words read neighbouring values) and writes the word once, so stores are contiguous and no word
has two writers. Measured on an H200 (256M bf16 elements, density 0.5, count + scan + compact + this pass):
1.30 ms with a first version of this pass that shifted each value into place and ran every tile over as many
lanes as a full tile has words (1363 PTX instructions a thread for W = 15). It now builds each word from a
64-bit window (903 for the same lanes) and makes only the words the tile has, 512 at a time (a tile at
density 0.5 needs half the lanes, at 0.2 a quarter); this version has not been timed on a GPU yet. Packing inside the compaction's own program instead (values into the tile's scratch slot, a CTA
barrier, then the words) measured 1.60 ms, so the passes stay apart.

The scratch holds a tile's values either at the tile's exclusive prefix of value counts (``value_offsets``:
as many elements as values stored) or in a slot of ``T`` elements per tile (``slot=True``: as many elements as
the input; no prefix needed, so the input itself can serve when nothing reads it afterwards).

Oracle: ``actzip.codecs.bitpack.pack_tile_words`` (the PyTorch codec's packing).
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse_launch import num_warps, values_base

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e


@triton.jit
def pack_kernel(
    scratch_ptr,
    value_offsets_ptr,
    nvals_ptr,
    tile_offsets_ptr,
    words_ptr,
    words_base_ptr,
    ok_ptr,
    T: tl.constexpr,
    WIDTH: tl.constexpr,
    LANES: tl.constexpr,
    SLOT: tl.constexpr,
    HAS_OK: tl.constexpr,
):
    """One tile: its ``nvals[tile]`` values (scratch, from ``value_offsets[tile]`` or with ``SLOT`` from
    ``tile * T``; sign bits ignored) packed into ``ceil(nvals * WIDTH / 32)`` words at
    ``words_base + tile_offsets[tile]``. ``LANES``: words made at a time (a power of two); a tile makes only
    the words it has, so a sparse tile costs less. With ``HAS_OK`` nothing is written unless ``*ok_ptr`` is
    true."""
    tile = tl.program_id(0)
    count = tl.load(nvals_ptr + tile)
    if HAS_OK:
        count = tl.where(tl.load(ok_ptr) != 0, count, 0)
    if SLOT:
        src = scratch_ptr + tile.to(tl.int64) * T
    else:
        src = scratch_ptr + tl.load(value_offsets_ptr + tile)
    dst = words_ptr + tl.load(words_base_ptr) + tl.load(tile_offsets_ptr + tile).to(tl.int64)
    n_words = (count * WIDTH + 31) // 32
    SPAN: tl.constexpr = (WIDTH + 30) // WIDTH + 1  # ceil((WIDTH - 1 + 32) / WIDTH)
    tl.static_assert(SPAN * WIDTH <= 64, "the window of one word must fit in 64 bits")
    for start in range(0, n_words, LANES):
        j = start + tl.arange(0, LANES)  # word index in the tile
        live = j < n_words
        # Word j starts `skip` bits into value `first`; the SPAN values from there hold its 32 bits. Laid side
        # by side in a 64-bit window (constant shifts), one variable shift takes the word out: about a third of
        # the instructions of shifting each value into place (sm_90 PTX, W = 15).
        first = (32 * j) // WIDTH
        skip = (32 * j - first * WIDTH).to(tl.uint64)
        window = tl.zeros([LANES], dtype=tl.uint64)
        for k in tl.static_range(SPAN):
            r = first + k
            v = tl.load(src + r, mask=live & (r < count), other=0)
            v = (v.to(tl.int32) & ((1 << WIDTH) - 1)).to(tl.uint32, bitcast=True).to(tl.uint64)
            window |= v << (k * WIDTH)
        word = ((window >> skip) & 0xFFFFFFFF).to(tl.uint32)
        tl.store(dst + j, word.to(tl.int32, bitcast=True), mask=live)


def pack(
    scratch: torch.Tensor,
    nvals: torch.Tensor,
    tile_offsets: torch.Tensor,
    words: torch.Tensor,
    width: int,
    tile_size: int,
    *,
    value_offsets: torch.Tensor | None = None,
    words_base: torch.Tensor | None = None,
    ok: torch.Tensor | None = None,
) -> None:
    """Pack the compacted values in ``scratch`` into ``words`` (int32) at ``words_base + tile_offsets``.

    ``value_offsets`` (int64 per tile): where each tile's values start in ``scratch``; ``None``: slot ``tile *
    tile_size``. ``nvals`` (int32 per tile): values per tile. ``words_base``: one-element int64 device tensor
    (default 0). ``ok``: one-element int32 device tensor; write only if nonzero. No host synchronization.
    """
    if words.dtype != torch.int32:
        raise ConfigError(f"sign packing: the words buffer must be int32, got {words.dtype}")
    if not 1 <= width <= 31:
        raise ConfigError(f"sign packing: width must be 1..31 bits, got {width}")
    n_tiles = nvals.numel()
    if not n_tiles:
        return
    dev = words.device
    base = values_base(words_base, dev)
    # 512 words at a time (4 a thread), fewer for a tile that cannot have as many
    lanes = min(512, triton.next_power_of_2(-(-tile_size * width // 32)))
    pack_kernel[(n_tiles,)](
        scratch, value_offsets if value_offsets is not None else nvals, nvals, tile_offsets, words, base,
        ok if ok is not None else nvals,
        T=tile_size, WIDTH=width, LANES=lanes, SLOT=value_offsets is None, HAS_OK=ok is not None,
        num_warps=num_warps(tile_size),
    )  # fmt: skip
