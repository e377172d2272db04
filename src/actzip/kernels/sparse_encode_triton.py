"""Single-pass encoder for the sparse codec's format: one read of the input, no separate count pass.

The two-pass encoder (:mod:`actzip.kernels.sparse_triton`: count, scan, compact) reads its input twice, which
caps it near 60% of copy bandwidth. Here every program reads its tile once, publishes the tile's stored size,
and learns the sizes of all earlier tiles with a *decoupled look-back* (Merrill and Garland's single-pass
prefix scan, as in CUB): each tile keeps a status word in global memory,

    0                       not yet published,
    AGGREGATE | size        the tile's own size,
    INCLUSIVE | prefix      the sum of the sizes of this tile and every tile before it,

and a tile scans the status words of its predecessors, a window of ``LOOKBACK`` at a time, summing
aggregates until it meets an inclusive prefix. Tiles take their index from an atomic ticket, not from
``program_id``, so every tile a program waits for has already started: no deadlock, whatever order the GPU
schedules programs in.

The same kernel optionally

- applies the ReLU itself (``RELU``: the input is the pre-activation ``h``; what is stored is ``relu(h)``),
  and writes the activation the forward pass goes on with (``ACT_OUT``: ``relu(h)`` or ``relu(h)²``), so a
  fused MLP reads ``h`` once and never materializes ``relu(h)`` next to its output;
- reserves its values in an :class:`~actzip.memory.arena.Arena` on the device: tiles write only inside the
  capacity, and the last tile moves the arena's cursor and statistics (refusals counted, the step's
  overflow flag raised) and sets the ``ok`` flag.

Oracle: the PyTorch codec (``actzip.codecs.get("sparse", kernel="torch")``) and, for the ReLU, ``torch.relu``.
The buffers are the two-pass encoder's, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from actzip.core.dtypes import bit_view_dtype
from actzip.core.errors import ConfigError
from actzip.kernels.sparse_triton import (
    _NBITS,
    _TL_DTYPE as _TL_BITS,
    DEFAULT_TILE_SIZE,
    _check_bits,
    _num_warps,
    _width,
    _window_combine,
    check_tile_size,
)

AGGREGATE = tl.constexpr(1 << 61)
INCLUSIVE = tl.constexpr(1 << 62)
VALUE_MASK = tl.constexpr((1 << 61) - 1)
# Status words read per look-back step. 128 (one per thread at 4 warps) against 32: the ticket + count +
# look-back alone went from 0.41 to 0.28 ms on 256M bf16 elements in tiles of 4096 (H200), the whole encode
# from 0.79 to 0.75 ms.
LOOKBACK = tl.constexpr(128)
LOOKBACK_PACKED = tl.constexpr(32)  # sign packing's scan holds more registers: 128 was 4% slower there
ONE_F32_BITS = tl.constexpr(0x3F800000)  # float32 1.0, as actzip.memory.arena.ONE_F32_BITS

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _exclusive_prefix(status_ptr, tile, size, LB: tl.constexpr):
    """Publish ``size`` for ``tile``, wait for the sum of the sizes of all earlier tiles, publish the inclusive
    prefix, and return the exclusive one (int64)."""
    excl = size * 0
    if tile == 0:
        tl.atomic_xchg(status_ptr, size | INCLUSIVE, sem="release")
    else:
        tl.atomic_xchg(status_ptr + tile, size | AGGREGATE, sem="release")
        k = tl.arange(0, LB)
        j = tile - 1
        done = tile * 0
        while done == 0:
            idx = j - k
            valid = idx >= 0
            # Plain volatile loads, not atomics: a status word is one aligned 64-bit store, read whole, and
            # read-modify-write polling would serialize every tile on its predecessors' words in L2.
            s = tl.load(status_ptr + idx, mask=valid, other=INCLUSIVE, volatile=True)  # before tile 0: prefix 0
            not_ready = tl.min(tl.where(s == 0, k, LB), axis=0)
            first_inc = tl.min(tl.where(s >= INCLUSIVE, k, LB), axis=0)
            # Words before the first unpublished one are final: sum them up to and including the nearest
            # inclusive prefix if there is one (done), else all of them and look further back.
            found = first_inc < not_ready
            take = tl.where(found, first_inc + 1, not_ready)
            excl += tl.sum(tl.where(k < take, s & VALUE_MASK, 0), axis=0)
            j -= take
            done = found.to(tl.int64)
        tl.atomic_xchg(status_ptr + tile, (excl + size) | INCLUSIVE, sem="release")
    return excl


# capacity is not specialized (divisible by 16, equal to 1): Arena.fit() changes it between steps, and a new
# specialization must not be compiled while a CUDA graph is being captured.
@triton.jit(do_not_specialize=["capacity"])
def encode_kernel(
    src_ptr,
    act_ptr,
    mask_ptr,
    tile_offsets_ptr,
    values_ptr,
    work_ptr,
    start_ptr,
    counters_ptr,
    n,
    capacity,
    T: tl.constexpr,
    NBITS: tl.constexpr,
    WIDTH: tl.constexpr,
    ELEM_BYTES: tl.constexpr,
    SIGN_PACK: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
    RELU: tl.constexpr,
    ACT_OUT: tl.constexpr,
    ARENA: tl.constexpr,
    ROW: tl.constexpr,
):
    """Encode one tile; see the module docstring.

    ``src_ptr``: the tensor's raw bits (``BITS_DTYPE``), or with ``RELU`` the pre-activation in its float
    dtype. ``act_ptr`` (``ACT_OUT`` 1 or 2, with ``RELU``): where ``relu(h)`` or ``relu(h)²`` goes.
    ``work_ptr``: zeroed int64 ``[n_tiles + WORK_EXTRA]``: the tiles' status words, the ticket, then the
    results ``[total, nnz, sign_set, ok, start]`` (see :class:`Encoded`). ``start_ptr``: int64, the byte
    offset of this payload's values in ``values``. With ``ARENA``, ``counters_ptr`` is the arena's int64
    ``[cursor, wanted, high_water, overflows, step_overflows, step_flag]`` (see
    :mod:`actzip.memory.arena`) and values are written only below ``capacity`` elements; the last tile
    reserves ``total`` (16-byte aligned) or counts the refusal and raises the step flag. ``ROW``: the tile is
    handled as ``[T // ROW, ROW]``; with ``ROW`` 8 a thread holds whole mask bytes, with 2 neighbouring
    lanes hold neighbouring elements, so one store instruction of the compacted values covers one short,
    contiguous run of the output instead of a strided spread.
    """
    n_tiles = tl.cdiv(n, T)
    tile = tl.atomic_add(work_ptr + n_tiles, 1).to(tl.int64)
    res_ptr = work_ptr + n_tiles + 1
    rows = tl.arange(0, T // ROW)
    cols = tl.arange(0, ROW)
    # 64-bit arithmetic once per tile (scalar pointers), 32-bit offsets per element.
    local = rows[:, None] * ROW + cols[None, :]
    inb = local < tl.minimum(n - tile * T, T).to(tl.int32)
    if RELU:
        h = tl.load(src_ptr + tile * T + local, mask=inb, other=0.0)
        h32 = h.to(tl.float32)
        keep = (h32 > 0) | (h32 != h32)  # relu as torch computes it on CUDA: NaN passes, -0.0 gives +0.0
        hb = h.to(BITS_DTYPE, bitcast=True)
        x = tl.where(keep, hb, tl.zeros_like(hb))
        if ACT_OUT == 1:
            tl.store(act_ptr + tile * T + local, x.to(h.dtype, bitcast=True), mask=inb)
        if ACT_OUT == 2:
            r32 = tl.where(keep, h32, 0.0)
            tl.store(act_ptr + tile * T + local, (r32 * r32).to(h.dtype), mask=inb)
    else:
        x = tl.load(src_ptr + tile * T + local, mask=inb, other=0)
    f = (x != 0).to(tl.int32)
    f8 = tl.reshape(f, (T // 8, 8))
    tl.store(mask_ptr + tile * (T // 8) + tl.arange(0, T // 8),
             tl.sum(f8 << tl.arange(0, 8)[None, :], axis=1).to(tl.uint8))
    per_byte = tl.sum(f, axis=1)
    count = tl.sum(per_byte, axis=0)
    if SIGN_PACK:
        size = ((count * WIDTH + 31) // 32).to(tl.int64)
    else:
        size = count.to(tl.int64)
    start = tl.load(start_ptr) // ELEM_BYTES
    if SIGN_PACK:
        excl = _exclusive_prefix(work_ptr, tile, size, LOOKBACK_PACKED)
    else:
        excl = _exclusive_prefix(work_ptr, tile, size, LOOKBACK)
    base = start + excl
    vptr = values_ptr + base
    # Broadcast to a block: a scalar bool in a store mask is refused by Triton's interpreter.
    fits = (tl.zeros_like(f) + (base + size <= capacity).to(tl.int32)) != 0 if ARENA else f >= 0
    if SIGN_PACK:
        # One writer per word (see sparse_triton.compact_kernel): a scan keeps the last 64 bits of the tile's
        # bit stream at every value; the value that completes a word stores it.
        x1 = tl.reshape(x, (T,))
        f1 = tl.reshape(f, (T,))
        stored = f1 != 0
        v = (x1 & ((1 << WIDTH) - 1)).to(tl.uint64)
        win = tl.where(stored, v << (64 - WIDTH), tl.zeros_like(v))
        end, win = tl.associative_scan((f1 * WIDTH, win), 0, _window_combine)
        q = (end >> 5) - 1
        fits = tl.reshape(fits, (T,))
        done = stored & ((end >> 5) > ((end - WIDTH) >> 5)) & fits
        shift = tl.minimum(tl.maximum(64 - (end - 32 * q), 0), 63).to(tl.uint64)
        word = (win >> shift).to(tl.uint32).to(tl.int32, bitcast=True)
        tl.store(vptr + q, word, mask=done)
        tail = end & 31
        last = stored & (end == count * WIDTH) & (tail != 0) & fits
        shift = tl.minimum(64 - tail, 63).to(tl.uint64)
        word = (win >> shift).to(tl.uint32).to(tl.int32, bitcast=True)
        tl.store(vptr + (end >> 5), word, mask=last)
        neg = tl.sum(tl.sum(((x >> (NBITS - 1)) & 1).to(tl.int32), axis=1), axis=0)
        tl.atomic_add(res_ptr + 2, neg.to(tl.int64))
    else:
        rank = (tl.cumsum(per_byte, axis=0) - per_byte)[:, None] + (tl.cumsum(f, axis=1) - f)
        tl.store(vptr + rank, x, mask=(f != 0) & fits)
    tl.store(tile_offsets_ptr + tile, excl.to(tl.int32))
    if SIGN_PACK:  # words stored differ from values stored; without packing the last tile's total is nnz
        tl.atomic_add(res_ptr + 1, count.to(tl.int64))
    if tile == 0:
        tl.store(res_ptr + 4, start)
    if tile == n_tiles - 1:
        total = excl + size
        tl.store(res_ptr, total)
        if not SIGN_PACK:
            tl.store(res_ptr + 1, total)
        if ARENA:
            granted = start + total <= capacity
            tl.store(res_ptr + 3, granted.to(tl.int64))
            nbytes = (total * ELEM_BYTES + 15) // 16 * 16
            cursor = tl.load(counters_ptr)
            wanted = tl.load(counters_ptr + 1) + nbytes
            tl.store(counters_ptr, tl.where(granted, cursor + nbytes, cursor))
            tl.store(counters_ptr + 1, wanted)
            tl.store(counters_ptr + 2, tl.maximum(tl.load(counters_ptr + 2), wanted))
            refused = 1 - granted.to(tl.int64)
            tl.store(counters_ptr + 3, tl.load(counters_ptr + 3) + refused)
            step_refused = tl.load(counters_ptr + 4) + refused
            tl.store(counters_ptr + 4, step_refused)
            # The arena's float32 step_overflow (found_inf for an optimizer) in the low half of this word.
            tl.store(counters_ptr + 5, (step_refused > 0).to(tl.int64) * ONE_F32_BITS)
        else:
            tl.store(res_ptr + 3, 1)


WORK_EXTRA = 8  # ticket, total, nnz, sign_set, ok, start, a zero start, padding


class Encoded(NamedTuple):
    """A sparse payload's buffers from :func:`encode`, with its counts on the device (one-element int64)."""

    mask: torch.Tensor  # uint8: the payload's mask
    tile_offsets: torch.Tensor  # int32, relative to ``start``
    values: torch.Tensor  # the values buffer (the payload's own, or the arena's whole buffer)
    total: torch.Tensor  # elements of ``values`` this payload uses
    nnz: torch.Tensor  # stored elements
    sign_set: torch.Tensor | None  # elements with the sign bit set (sign packing only)
    ok: torch.Tensor  # 1 if the values were written (always, without an arena)
    start: torch.Tensor  # where this payload's values start in ``values`` (elements)
    act: torch.Tensor | None  # relu(h) or relu(h)² with ``act="relu"|"relu2"``


def values_capacity(n: int, tile_size: int, dtype: torch.dtype, sign_pack: bool) -> int:
    """Values-buffer elements that any ``n``-element tensor of ``dtype`` may need (no element zero)."""
    n_tiles = -(-n // tile_size)
    return n_tiles * tile_size * _width(bit_view_dtype(dtype), True) // 32 if sign_pack else n


def encode(
    src: torch.Tensor,
    tile_size: int = DEFAULT_TILE_SIZE,
    sign_pack: bool = False,
    *,
    relu: bool = False,
    act: str | None = None,
    values: torch.Tensor | None = None,
    arena=None,
    row: int = 8,
) -> Encoded:
    """Encode ``src`` (any dense float tensor; read in memory order if contiguous) in one pass.

    No host synchronization. ``relu=True``: encode ``relu(src)`` instead, and with ``act="relu"`` or ``"relu2"`` also return
    ``relu(src)`` or ``relu(src)²`` (``src``'s shape). ``values``: a values buffer (the bit-view dtype, or int32
    with ``sign_pack``) of at least :func:`values_capacity` elements (the worst case: nothing is zero), no
    zeroing needed; or ``arena``, an :class:`~actzip.memory.arena.Arena`: values go into its buffer at its
    cursor and are written only if they fit (``ok``).
    """
    check_tile_size(tile_size)
    if row not in (2, 8):
        raise ConfigError(f"sparse encode: row must be 2 or 8 elements, got {row!r}")
    if act not in (None, "relu", "relu2"):
        raise ConfigError(f"sparse encode: act must be None, 'relu' or 'relu2', got {act!r}")
    if act is not None and not relu:
        raise ConfigError("sparse encode: act needs relu=True (it is the activation of the ReLU it encodes)")
    src = src.contiguous()
    bits_dtype = bit_view_dtype(src.dtype)
    bits = _check_bits(src.view(-1).view(bits_dtype), src.numel())
    n = bits.numel()
    if relu and src.dtype not in _FLOAT:
        raise ConfigError(f"sparse encode: relu=True takes float32, float16 or bfloat16, got {src.dtype}")
    width = _width(bits_dtype, sign_pack)
    elem = 4 if sign_pack else bits.element_size()
    dev = src.device
    n_tiles = -(-n // tile_size)
    mask = torch.empty(n_tiles * tile_size // 8, dtype=torch.uint8, device=dev)
    tile_offsets = torch.empty(n_tiles, dtype=torch.int32, device=dev)
    work = torch.zeros(n_tiles + WORK_EXTRA, dtype=torch.int64, device=dev)
    res = work[n_tiles + 1:]
    out = torch.empty_like(src) if act is not None else None
    want = torch.int32 if sign_pack else bits_dtype
    if arena is not None:
        values = arena.view(want)
        start_bytes = arena.counters[:1].clone()
        capacity, counters = values.numel(), arena.counters
    else:
        if values is None:
            raise ConfigError("sparse encode: pass a values buffer (see values_capacity) or an arena")
        if values.dtype != want or values.device != dev:
            raise ConfigError(f"values must be a {want} tensor on {dev}, got {values.dtype} on {values.device}")
        if values.numel() < values_capacity(n, tile_size, src.dtype, sign_pack):
            raise ConfigError(f"values holds {values.numel()} elements; encoding {n} elements may need "
                              f"{values_capacity(n, tile_size, src.dtype, sign_pack)}")
        start_bytes, capacity, counters = res[5:6], values.numel(), res[5:6]
    if n_tiles:
        encode_kernel[(n_tiles,)](
            src.view(-1) if relu else bits, out if out is not None else bits, mask, tile_offsets, values, work,
            start_bytes, counters, n, capacity,
            T=tile_size, NBITS=_NBITS[bits_dtype], WIDTH=width, ELEM_BYTES=elem, SIGN_PACK=sign_pack,
            BITS_DTYPE=_TL_BITS[bits_dtype], RELU=relu, ACT_OUT={None: 0, "relu": 1, "relu2": 2}[act],
            ARENA=arena is not None, ROW=row, num_warps=_num_warps(tile_size),
        )  # fmt: skip
    else:
        res[3].fill_(1)
    return Encoded(mask, tile_offsets, values, res[0:1], res[1:2], res[2:3] if sign_pack else None, res[3:4],
                   res[4:5], out)
