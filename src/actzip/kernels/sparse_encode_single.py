"""The single-pass sparse encoder's kernels (``encode(..., passes=1)`` of :mod:`actzip.kernels.sparse_encode`),
and the arena reservation that both encoders make.

Every program reads its input once, publishes its stored size, and learns the sizes of everything before it
with a *decoupled look-back* (Merrill and Garland's single-pass prefix scan, as in CUB): each look-back unit
keeps a status word in global memory,

    0                       not yet published,
    AGGREGATE | size        the unit's own size,
    INCLUSIVE | prefix      the sum of the sizes of this unit and every unit before it,

and a unit scans the status words of its predecessors, a window of them at a time (``LOOKBACK``, or
:class:`OnePass`'s ``lookback``), summing aggregates until it meets an inclusive prefix. Units take their
index from an atomic ticket, not from ``program_id``, so every unit a program waits for belongs to a program
that is already running: no deadlock, whatever order the GPU schedules programs in (a persistent program
holds two tickets, but waits only on the lower one's predecessors).

Two kernels make the same buffers bit for bit (the format of :mod:`actzip.kernels.sparse`):

- :func:`encode_kernel` (the default): one program, one tile, one look-back unit;
- :func:`encode_tiles_kernel`, with the knobs of :class:`OnePass`: a program loads ``G`` tiles at once (a
  super-tile, one look-back unit: ``G`` times fewer status words to wait on, ``G`` times more bytes in
  flight per wait), optionally as a persistent grid (a few programs per SM taking tickets in a loop, each
  issuing its next super-tile's load before it waits on the current one's look-back), with a choice of
  layout (``ROW``, and ``VEC``: the store-offset hint of :func:`actzip.kernels.sparse.compact_kernel`), of
  warps and of look-back window. Per tile, the mask bytes, the tile offset and the arena's fit test stay
  exactly those of :func:`encode_kernel`.

In Triton's interpreter programs run one after another in ticket order: the first program of a persistent
grid takes every ticket itself, and the others find none left.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from actzip.errors import ConfigError
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse import load_relu
from actzip.kernels.sparse_launch import TL_BITS, num_warps

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["AGGREGATE", "INCLUSIVE", "LOOKBACK", "ONE_F32_BITS", "OnePass", "VALUE_MASK", "check_one_pass",
           "encode_kernel", "encode_tiles_kernel", "launch", "reserve"]

AGGREGATE = tl.constexpr(1 << 61)
INCLUSIVE = tl.constexpr(1 << 62)
VALUE_MASK = tl.constexpr((1 << 61) - 1)
# Status words read per look-back step of encode_kernel: one per thread at 4 warps (measured against 32).
LOOKBACK = tl.constexpr(128)
ONE_F32_BITS = tl.constexpr(0x3F800000)  # float32 1.0, as actzip.memory.modules.arena.ONE_F32_BITS


@triton.jit
def _publish(status_ptr, unit, size):
    """Publish ``size`` as ``unit``'s aggregate (unit 0's is its inclusive prefix already)."""
    if unit == 0:
        tl.atomic_xchg(status_ptr, size | INCLUSIVE, sem="release")
    else:
        tl.atomic_xchg(status_ptr + unit, size | AGGREGATE, sem="release")


@triton.jit
def _look_back(status_ptr, unit, size, WINDOW: tl.constexpr):
    """Wait for the sum of the sizes of all units before ``unit`` (published), publish ``unit``'s inclusive
    prefix, and return the exclusive one (int64)."""
    excl = size * 0
    if unit != 0:
        k = tl.arange(0, WINDOW)
        j = unit - 1
        done = unit * 0
        while done == 0:
            idx = j - k
            valid = idx >= 0
            # Plain volatile loads, not atomics: a status word is one aligned 64-bit store, read whole, and
            # read-modify-write polling would serialize every unit on its predecessors' words in L2.
            s = tl.load(status_ptr + idx, mask=valid, other=INCLUSIVE, volatile=True)  # before unit 0: prefix 0
            not_ready = tl.min(tl.where(s == 0, k, WINDOW), axis=0)
            first_inc = tl.min(tl.where(s >= INCLUSIVE, k, WINDOW), axis=0)
            # Words before the first unpublished one are final: sum them up to and including the nearest
            # inclusive prefix if there is one (done), else all of them and look further back.
            found = first_inc < not_ready
            take = tl.where(found, first_inc + 1, not_ready)
            excl += tl.sum(tl.where(k < take, s & VALUE_MASK, 0), axis=0)
            j -= take
            done = found.to(tl.int64)
        tl.atomic_xchg(status_ptr + unit, (excl + size) | INCLUSIVE, sem="release")
    return excl


@triton.jit
def reserve(res_ptr, counters_ptr, start, total, capacity, ELEM_BYTES: tl.constexpr, ARENA: tl.constexpr):
    """Record ``total`` and ``start`` in the results, and with ``ARENA`` reserve ``total`` elements at the
    arena's cursor (16-byte aligned) or count the refusal and raise the step flag; ``ok`` says which."""
    tl.store(res_ptr, total)
    tl.store(res_ptr + 4, start)
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
    ELEM_BYTES: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
    RELU: tl.constexpr,
    ACT_OUT: tl.constexpr,
    ARENA: tl.constexpr,
    ROW: tl.constexpr,
):
    """Encode one tile; see the module docstring.

    ``src_ptr``: the tensor's raw bits (``BITS_DTYPE``), or with ``RELU`` the pre-activation in its float
    dtype. ``act_ptr`` (``ACT_OUT`` 1 or 2, with ``RELU``): where ``relu(h)`` or ``relu(h)²`` goes.
    ``work_ptr``: zeroed int64 ``[n_tiles + WORK_EXTRA]`` (:mod:`actzip.kernels.sparse_encode`): the status
    words, the ticket, then the results ``[total, nnz, sign_set, ok, start]``. ``start_ptr``: int64, the byte
    offset of this payload's values in ``values``. With ``ARENA``, ``counters_ptr`` is the arena's int64
    ``[cursor, wanted, high_water, overflows, step_overflows, step_flag]`` (see
    :mod:`actzip.memory.modules.arena`) and values are written only below ``capacity`` elements; the last tile
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
        x = load_relu(src_ptr + tile * T, act_ptr + tile * T, local, inb, ACT_OUT, BITS_DTYPE)
    else:
        x = tl.load(src_ptr + tile * T + local, mask=inb, other=0)
    f = (x != 0).to(tl.int32)
    f8 = tl.reshape(f, (T // 8, 8))
    tl.store(mask_ptr + tile * (T // 8) + tl.arange(0, T // 8),
             tl.sum(f8 << tl.arange(0, 8)[None, :], axis=1).to(tl.uint8))
    per_byte = tl.sum(f, axis=1)
    size = tl.sum(per_byte, axis=0).to(tl.int64)
    start = tl.load(start_ptr) // ELEM_BYTES
    _publish(work_ptr, tile, size)
    excl = _look_back(work_ptr, tile, size, LOOKBACK)
    base = start + excl
    # Broadcast to a block: a scalar bool in a store mask is refused by Triton's interpreter.
    fits = (tl.zeros_like(f) + (base + size <= capacity).to(tl.int32)) != 0 if ARENA else f >= 0
    rank = (tl.cumsum(per_byte, axis=0) - per_byte)[:, None] + (tl.cumsum(f, axis=1) - f)
    tl.store(values_ptr + base + rank, x, mask=(f != 0) & fits)
    tl.store(tile_offsets_ptr + tile, excl.to(tl.int32))
    if tile == n_tiles - 1:
        total = excl + size
        tl.store(res_ptr + 1, total)  # without sign packing every value is one element
        reserve(res_ptr, counters_ptr, start, total, capacity, ELEM_BYTES, ARENA)


@triton.jit
def _load_super(src_ptr, act_ptr, unit, n, T: tl.constexpr, G: tl.constexpr, ROW: tl.constexpr,
                RELU: tl.constexpr, ACT_OUT: tl.constexpr, BITS_DTYPE: tl.constexpr):
    """Super-tile ``unit`` as ``[G, T // ROW, ROW]`` (zero past ``n``; nothing at all past the last one)."""
    local = (tl.arange(0, G)[:, None, None] * T + tl.arange(0, T // ROW)[None, :, None] * ROW
             + tl.arange(0, ROW)[None, None, :])
    first = unit * (G * T)
    inb = local < tl.minimum(n - first, G * T).to(tl.int32)
    if RELU:
        x = load_relu(src_ptr + first, act_ptr + first, local, inb, ACT_OUT, BITS_DTYPE)
    else:
        x = tl.load(src_ptr + first + local, mask=inb, other=0)
    return x


@triton.jit
def _count(x, mask_ptr, unit, n_tiles, T: tl.constexpr, G: tl.constexpr):
    """Store the super-tile's mask bytes (of the tiles that exist); return the tiles' sizes."""
    f = (x != 0).to(tl.int32)
    g = tl.arange(0, G)
    b = tl.arange(0, T // 8)
    byte = tl.sum(tl.reshape(f, (G, T // 8, 8)) << tl.arange(0, 8)[None, None, :], axis=2).to(tl.uint8)
    mine = (unit * G + g < n_tiles)[:, None] & (b >= 0)[None, :]
    tl.store(mask_ptr + unit * (G * (T // 8)) + (g[:, None] * (T // 8) + b[None, :]), byte, mask=mine)
    return tl.sum(tl.sum(f, axis=2), axis=1)


@triton.jit
def _store(x, per_tile, excl, unit, n_tiles, n_units, values_ptr, tile_offsets_ptr, res_ptr, counters_ptr,
           start, capacity, G: tl.constexpr, VEC: tl.constexpr, ELEM_BYTES: tl.constexpr,
           ARENA: tl.constexpr):  # fmt: skip
    """Store a super-tile's values at ``start + excl``, its tiles' offsets, and after the last, the results."""
    f = (x != 0).to(tl.int32)
    per_row = tl.sum(f, axis=2)
    rank = (tl.cumsum(per_row, axis=1) - per_row)[:, :, None] + (tl.cumsum(f, axis=2) - f)  # in its tile
    g = tl.arange(0, G)
    tile_excl = tl.cumsum(per_tile, axis=0) - per_tile
    base = start + excl
    off = base + (tile_excl[:, None, None] + rank)
    if VEC > 1:  # the layout claim of compact_kernel: per-element store masks keep every store scalar
        off = tl.max_contiguous(tl.multiple_of(off, (1, 1, VEC)), (1, 1, VEC))
    keep = f != 0
    if ARENA:  # as encode_kernel: a tile's values go only where the whole tile fits
        keep = keep & (base + tile_excl + per_tile <= capacity)[:, None, None]
    tl.store(values_ptr + off, x, mask=keep)
    tl.store(tile_offsets_ptr + unit * G + g, (excl + tile_excl).to(tl.int32), mask=unit * G + g < n_tiles)
    if unit == n_units - 1:
        total = excl + tl.sum(per_tile, axis=0)
        tl.store(res_ptr + 1, total)  # without sign packing every value is one element
        reserve(res_ptr, counters_ptr, start, total, capacity, ELEM_BYTES, ARENA)


@triton.jit(do_not_specialize=["capacity"])
def encode_tiles_kernel(
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
    ELEM_BYTES: tl.constexpr,
    BITS_DTYPE: tl.constexpr,
    RELU: tl.constexpr,
    ACT_OUT: tl.constexpr,
    ARENA: tl.constexpr,
    ROW: tl.constexpr,
    G: tl.constexpr,
    VEC: tl.constexpr,
    PERSISTENT: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """:func:`encode_kernel`'s buffers, ``G`` tiles (one super-tile, one status word) per ticket; with
    ``PERSISTENT``, tickets in a loop until none is left, the next super-tile loaded before the current one's
    look-back. ``VEC`` > 1 claims runs of ``VEC`` in the value stores' offsets (a layout choice, as in
    :func:`actzip.kernels.sparse.compact_kernel`); ``WINDOW``: status words read per look-back step. The status
    words are the first ``cdiv(n, G * T)`` of ``work``; the ticket and results sit where encode_kernel's do."""
    n_tiles = tl.cdiv(n, T)
    n_units = tl.cdiv(n, G * T)
    ticket_ptr = work_ptr + n_tiles
    res_ptr = ticket_ptr + 1
    start = tl.load(start_ptr) // ELEM_BYTES
    unit = tl.atomic_add(ticket_ptr, 1).to(tl.int64)
    x = _load_super(src_ptr, act_ptr, unit, n, T, G, ROW, RELU, ACT_OUT, BITS_DTYPE)
    if PERSISTENT:  # tickets until none is left
        while unit < n_units:
            nxt = tl.atomic_add(ticket_ptr, 1).to(tl.int64)
            per_tile = _count(x, mask_ptr, unit, n_tiles, T, G)
            size = tl.sum(per_tile, axis=0).to(tl.int64)
            _publish(work_ptr, unit, size)
            # The next super-tile's load goes out before the wait: its bytes arrive during the look-back.
            x_next = _load_super(src_ptr, act_ptr, nxt, n, T, G, ROW, RELU, ACT_OUT, BITS_DTYPE)
            excl = _look_back(work_ptr, unit, size, WINDOW)
            _store(x, per_tile, excl, unit, n_tiles, n_units, values_ptr, tile_offsets_ptr, res_ptr, counters_ptr,
                   start, capacity, G, VEC, ELEM_BYTES, ARENA)  # fmt: skip
            x = x_next
            unit = nxt
    else:  # one ticket: the grid has one program per super-tile
        per_tile = _count(x, mask_ptr, unit, n_tiles, T, G)
        size = tl.sum(per_tile, axis=0).to(tl.int64)
        _publish(work_ptr, unit, size)
        excl = _look_back(work_ptr, unit, size, WINDOW)
        _store(x, per_tile, excl, unit, n_tiles, n_units, values_ptr, tile_offsets_ptr, res_ptr, counters_ptr,
               start, capacity, G, VEC, ELEM_BYTES, ARENA)  # fmt: skip


class OnePass(NamedTuple):
    """The knobs of :func:`encode_tiles_kernel` (``encode(..., passes=1, one_pass=OnePass(...))``)."""

    group: int = 1  # tiles per super-tile (a power of two): one look-back unit, one load
    persistent: bool = False  # a grid of programs_per_sm programs per SM, looping over the tickets
    programs_per_sm: int = 4  # more than fit on an SM is harmless: the surplus starts late and finds no ticket
    row: int | None = None  # the [T // row, row] layout (a power of two, 2 to 32); None: encode()'s row
    vec: int = 1  # the store-offset layout hint (1: none; else a power of two dividing row)
    lookback: int = 128  # status words read per look-back step (a power of two)
    num_warps: int | None = None  # None: as encode_kernel's for tiles of group * tile_size elements


def _power_of_two(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and not v & (v - 1)


def check_one_pass(opt: OnePass, tile_size: int, row: int) -> OnePass:
    """``opt`` with its defaults filled in (``row``: encode()'s), or :class:`ConfigError` naming the bad knob."""
    row = opt.row if opt.row is not None else row
    bad = []
    if not _power_of_two(opt.group) or opt.group > 64:
        bad.append(f"group={opt.group!r} (a power of two up to 64)")
    warps = opt.num_warps
    if warps is None:
        warps = num_warps(opt.group * tile_size) if not bad else 4
    if not _power_of_two(row) or not 2 <= row <= min(32, tile_size):
        bad.append(f"row={row!r} (a power of two from 2 to 32)")
    if not _power_of_two(opt.vec) or (_power_of_two(row) and row % opt.vec):
        bad.append(f"vec={opt.vec!r} (a power of two dividing row)")
    if not _power_of_two(opt.lookback) or opt.lookback > 1024:
        bad.append(f"lookback={opt.lookback!r} (a power of two up to 1024)")
    if not _power_of_two(warps) or warps > 32:
        bad.append(f"num_warps={warps!r} (a power of two up to 32)")
    if not isinstance(opt.programs_per_sm, int) or opt.programs_per_sm < 1:
        bad.append(f"programs_per_sm={opt.programs_per_sm!r} (at least 1)")
    if bad:
        raise ConfigError("sparse encode: bad one_pass option " + ", ".join(bad))
    return opt._replace(row=row, num_warps=warps, persistent=bool(opt.persistent))


_SMS: dict[int, int] = {}


def _grid(n_units: int, opt: OnePass, device: torch.device) -> int:
    if not opt.persistent:
        return n_units
    if device.type != "cuda":  # the interpreter: the first program does everything
        return min(n_units, opt.programs_per_sm)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SMS:
        _SMS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return min(n_units, opt.programs_per_sm * _SMS[index])


def launch(code, act, mask, tile_offsets, values, work, start_bytes, counters, n, capacity, tile_size, elem, bits,
           relu, act_out, arena, row, opt: OnePass | None) -> None:  # fmt: skip
    """Run the single-pass encoder on ``n > 0`` elements: :func:`encode_kernel` when ``opt`` is None, else
    :func:`encode_tiles_kernel` with ``opt`` (checked by :func:`check_one_pass`). ``bits``: the integer view
    dtype; ``act_out``: 0, 1 (relu) or 2 (relu²); the buffers as the kernels' docstrings say."""
    args = (code, act, mask, tile_offsets, values, work, start_bytes, counters, n, capacity)
    common = dict(T=tile_size, ELEM_BYTES=elem, BITS_DTYPE=TL_BITS[bits], RELU=relu, ACT_OUT=act_out, ARENA=arena)
    n_tiles = -(-n // tile_size)
    if opt is None:
        encode_kernel[(n_tiles,)](*args, **common, ROW=row, num_warps=num_warps(tile_size))
        return
    n_units = -(-n // (opt.group * tile_size))
    encode_tiles_kernel[(_grid(n_units, opt, code.device),)](
        *args, **common, ROW=opt.row, G=opt.group, VEC=opt.vec, PERSISTENT=opt.persistent, WINDOW=opt.lookback,
        num_warps=opt.num_warps,
    )  # fmt: skip
