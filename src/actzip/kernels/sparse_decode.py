"""The sparse codec's "run" decoder (see :mod:`actzip.codecs.sparse` for the format): a Triton kernel that reads
each tile's stored values as one contiguous run instead of one scattered load per element.

:func:`actzip.kernels.sparse.decompress` runs it by default (``variant="run"``); ``"gather"`` is the
original decoder (:func:`actzip.kernels.sparse.decompress_kernel`: each element loads ``values[base + rank]``
from global memory). Sign-packed payloads always take the original decoder.

One program decodes ``G`` consecutive tiles as one block of ``G * T`` elements (a tile's values follow the
previous tile's, so the block's values start at its first tile's offset). It

1. reads the block's mask as 32-bit words and ranks every element: per-byte counts by bit arithmetic inside
   each word, a scan over the words, a scan over the 8 bits of each byte (``FLAT``: one scan over all
   elements instead);
2. loads the block's values, ``values[base : base + count]``, in 16-byte vectors from ``al``, ``base``
   rounded down to 16 bytes, into a source twice the block's size (a run of ``G * T`` values that does not
   start on 16 bytes spills into the second half);
3. picks each element's value from that source with ``tl.gather`` (through shared memory), zero where not
   stored, and stores the block with 16-byte stores.

The vector loads never read past the values' storage: a block whose run, rounded up to 16 bytes, would pass the
storage's last whole 16 bytes reads it from ``end``, a padded copy of the buffer's last values, which the
wrapper makes only when the storage ends inside the last value's 16 bytes. The mask must be 4-byte aligned
(it is read as int32 words); :func:`run_supported` says whether a payload can take this kernel.

Python entry point: :func:`decode_run`, with the launch knobs ``tiles`` (``G``), ``warps`` and ``layout``.
Oracle: the original decoder and ``SparseCodec.decode`` (``kernel="torch"``), bit for bit.
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse_launch import NBITS, check_tile_size, num_warps

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["LAYOUTS", "decode_run", "run_kernel", "run_supported"]

LAYOUTS = ("rows", "flat")  # ranks from [G*T // 8, 8] (a scan over bytes, then over bits) or from one scan


@triton.jit
def run_kernel(
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    values_base_ptr,
    end_ptr,
    out_ptr,
    n,
    n_tiles,
    values_len,
    end_start,
    whole_len,
    T: tl.constexpr,
    G: tl.constexpr,
    FLAT: tl.constexpr,
):
    """Decode tiles ``G * pid`` to ``G * pid + G - 1`` into ``out`` (raw bits, elements ``< n`` only).

    ``values_len``: elements in the values buffer; ``whole_len``: elements of its storage in whole 16-byte
    blocks; ``end_ptr``: ``values[end_start:]`` padded to whole blocks (``values`` itself, never read, when
    ``whole_len >= values_len``).
    """
    CH: tl.constexpr = G * T
    VEC: tl.constexpr = 128 // values_ptr.dtype.element_ty.primitive_bitwidth  # elements in 16 bytes
    first = tl.program_id(0) * G
    # The values' extent comes from the offsets alone, so their load does not wait for the mask; the last
    # block is bounded by the buffer.
    vb = tl.load(values_base_ptr)
    base = vb + tl.load(tile_offsets_ptr + first).to(tl.int64)
    last = first + G >= n_tiles
    nxt = vb + tl.load(tile_offsets_ptr + tl.minimum(first + G, n_tiles - 1)).to(tl.int64)
    count = tl.minimum(tl.where(last, values_len, nxt) - base, CH).to(tl.int32)
    s = (base % VEC).to(tl.int32)
    al = tl.multiple_of(base - s, VEC)
    lim = tl.multiple_of((count + s + VEC - 1) // VEC * VEC, VEC)
    if al + lim > whole_len:  # the rounded-up run would pass the storage's whole 16 bytes: read the copy
        run = end_ptr + tl.multiple_of(al - end_start, VEC)
    else:
        run = values_ptr + al
    src_idx = tl.arange(0, 2 * CH)
    src = tl.load(run + src_idx, mask=src_idx < lim, other=0)

    wi = tl.arange(0, CH // 32)
    w = tl.load(mask_ptr.to(tl.pointer_type(tl.int32)) + first.to(tl.int64) * (T // 32) + wi,
                mask=first + wi // (T // 32) < n_tiles, other=0)
    k4 = tl.arange(0, 4)
    byte = tl.reshape((w[:, None] >> (8 * k4[None, :])) & 0xFF, (CH // 8,))
    f = (byte[:, None] >> tl.arange(0, 8)[None, :]) & 1  # [CH // 8, 8]: element 8a + b at [a, b]
    if FLAT:
        fl = tl.reshape(f, (CH,))
        rank = tl.cumsum(fl, axis=0) - fl
    else:
        # c: each byte's bit count, in that byte; one multiply gives their exclusive prefix inside the word
        # (sums stay below 256). The scan runs over words, the scan over a byte's 8 bits within a thread.
        c = w - ((w >> 1) & 0x55555555)
        c = (c & 0x33333333) + ((c >> 2) & 0x33333333)
        c = (c + (c >> 4)) & 0x0F0F0F0F
        total = ((c * 0x01010101) >> 24) & 0xFF
        before = ((c * 0x01010100)[:, None] >> (8 * k4[None, :])) & 0xFF
        row = tl.reshape((tl.cumsum(total, axis=0) - total)[:, None] + before, (CH // 8,))
        rank = tl.reshape(row[:, None] + (tl.cumsum(f, axis=1) - f), (CH,))
    v = tl.gather(src, rank + s, 0)
    bits = tl.where(tl.reshape(f != 0, (CH,)), v, tl.zeros_like(v))
    start = first.to(tl.int64) * T
    idx = tl.arange(0, CH)
    tl.store(out_ptr + start + idx, bits, mask=idx < tl.minimum(n - start, CH).to(tl.int32))


def run_supported(mask: torch.Tensor) -> bool:
    """Whether a payload with this ``mask`` can take :func:`run_kernel` (its words are read as int32)."""
    return mask.data_ptr() % 4 == 0


def decode_run(
    mask: torch.Tensor,
    tile_offsets: torch.Tensor,
    values: torch.Tensor,
    values_base: torch.Tensor,
    out: torch.Tensor,
    n: int,
    tile_size: int,
    *,
    tiles: int = 1,
    warps: int | None = None,
    layout: str = "rows",
) -> torch.Tensor:
    """Decode ``n`` elements of an unpacked payload into ``out`` (the integer view, already checked by the
    caller, e.g. :func:`actzip.kernels.sparse.decompress`) with :func:`run_kernel`. No host synchronization.

    ``values_base``: the one-element int64 device tensor of where the payload's values start in ``values``.
    ``tiles``: tiles per program (a power of two); ``warps``: warps per program (default: as the other sparse
    kernels for this tile size); ``layout``: one of :data:`LAYOUTS`.
    """
    check_tile_size(tile_size)
    if not isinstance(tiles, int) or tiles < 1 or tiles & (tiles - 1):
        raise ConfigError(f"sparse decode: tiles must be a power of two, got {tiles!r}")
    if layout not in LAYOUTS:
        raise ConfigError(f"sparse decode: layout must be one of {LAYOUTS}, got {layout!r}")
    if values.dtype != out.dtype or values.dtype not in NBITS or not run_supported(mask):
        raise ConfigError("sparse decode: the run kernel needs values of out's integer dtype and a 4-byte aligned "
                          f"mask, got values {values.dtype}, out {out.dtype}, mask at {mask.data_ptr() % 4} mod 4")
    n_tiles = -(-n // tile_size)
    if not n_tiles:
        return out
    vec = 16 // values.element_size()
    values = values.reshape(-1)
    values_len = values.numel()
    readable = values.untyped_storage().nbytes() // values.element_size() - values.storage_offset()
    whole = readable - readable % vec  # in whole 16-byte blocks of the storage (from values' start)
    end, end_start = values, 0
    if whole < values_len:
        # A block that reads past `whole` starts its 16-byte aligned run less than tiles * T + 2 * vec values
        # before it (runs are at most tiles * T values long). The copy's pad is loaded, never picked.
        end_start = max(0, whole - tiles * tile_size - 2 * vec)
        end = values.new_empty(whole + vec - end_start)
        end[: values_len - end_start].copy_(values[end_start:])
    run_kernel[(-(-n_tiles // tiles),)](
        mask, tile_offsets, values, values_base, end, out, n, n_tiles, values_len, end_start, whole,
        T=tile_size, G=tiles, FLAT=layout == "flat", num_warps=warps or num_warps(tile_size),
    )  # fmt: skip
    return out
