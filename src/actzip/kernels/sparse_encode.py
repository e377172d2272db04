"""The one encoder of the sparse codec's format on the GPU: :func:`encode`, what the codec and the fused MLPs run.

It encodes into a values buffer it allocates to fit (one host synchronization, to read the size), into a
preallocated buffer, or into an :class:`~actzip.memory.modules.arena.Arena`, the last two without any host
synchronization. Either encoder below can apply a ReLU on the fly (``relu``: the input is the pre-activation
``h``; what is stored is ``relu(h)``) and write the activation the forward pass goes on with as it goes
(``act``: ``relu(h)`` or ``relu(h)²``), so a fused MLP reads ``h`` and never materializes ``relu(h)`` next to
its output:

- two passes (the default): :mod:`actzip.kernels.sparse`'s count pass and device-side scan,
  :func:`reserve_kernel` (the arena reservation), its compact pass; with sign packing, the packing pass of
  :mod:`actzip.kernels.sparse_signpack` after it. Reading ``h`` twice was measured faster on an H200 than
  reading it once through the single-pass kernel (0.52 against 0.83 ms for 256M bf16 elements at density
  0.5): the count pass runs at copy speed, and the compaction's layout is the better one;
- one pass (:func:`encode_kernel`, no sign packing, into a given buffer or an arena): every program reads its
  tile once, publishes the tile's stored size, and learns the sizes of all earlier tiles with a *decoupled
  look-back* (Merrill and Garland's single-pass prefix scan, as in CUB): each tile keeps a status word in
  global memory,

      0                       not yet published,
      AGGREGATE | size        the tile's own size,
      INCLUSIVE | prefix      the sum of the sizes of this tile and every tile before it,

  and a tile scans the status words of its predecessors, a window of ``LOOKBACK`` at a time, summing
  aggregates until it meets an inclusive prefix. Tiles take their index from an atomic ticket, not from
  ``program_id``, so every tile a program waits for has already started: no deadlock, whatever order the
  GPU schedules programs in.

With an arena, values go into its buffer at its cursor: the reservation moves the cursor and the statistics
(refusals counted, the step's overflow flag raised) and sets the ``ok`` flag, and values are written only where
they fit.

Oracle: the PyTorch codec (``actzip.codecs.get("sparse", kernel="torch")``) and, for the ReLU, ``torch.relu``
on CUDA. Every mode makes the same buffers, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from actzip.errors import ConfigError
from actzip.kernels import sparse, sparse_signpack
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse import RELU_DTYPES, load_relu
from actzip.kernels.sparse_launch import (
    DEFAULT_TILE_SIZE,
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

__all__ = ["Encoded", "HostCounts", "WORK_EXTRA", "encode", "encode_kernel", "reserve_kernel", "values_capacity"]

AGGREGATE = tl.constexpr(1 << 61)
INCLUSIVE = tl.constexpr(1 << 62)
VALUE_MASK = tl.constexpr((1 << 61) - 1)
# Status words read per look-back step. 128 (one per thread at 4 warps) against 32: the ticket + count +
# look-back alone went from 0.41 to 0.28 ms on 256M bf16 elements in tiles of 4096 (H200), the whole encode
# from 0.79 to 0.75 ms.
LOOKBACK = tl.constexpr(128)
ONE_F32_BITS = tl.constexpr(0x3F800000)  # float32 1.0, as actzip.memory.modules.arena.ONE_F32_BITS

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _exclusive_prefix(status_ptr, tile, size):
    """Publish ``size`` for ``tile``, wait for the sum of the sizes of all earlier tiles, publish the inclusive
    prefix, and return the exclusive one (int64)."""
    excl = size * 0
    if tile == 0:
        tl.atomic_xchg(status_ptr, size | INCLUSIVE, sem="release")
    else:
        tl.atomic_xchg(status_ptr + tile, size | AGGREGATE, sem="release")
        k = tl.arange(0, LOOKBACK)
        j = tile - 1
        done = tile * 0
        while done == 0:
            idx = j - k
            valid = idx >= 0
            # Plain volatile loads, not atomics: a status word is one aligned 64-bit store, read whole, and
            # read-modify-write polling would serialize every tile on its predecessors' words in L2.
            s = tl.load(status_ptr + idx, mask=valid, other=INCLUSIVE, volatile=True)  # before tile 0: prefix 0
            not_ready = tl.min(tl.where(s == 0, k, LOOKBACK), axis=0)
            first_inc = tl.min(tl.where(s >= INCLUSIVE, k, LOOKBACK), axis=0)
            # Words before the first unpublished one are final: sum them up to and including the nearest
            # inclusive prefix if there is one (done), else all of them and look further back.
            found = first_inc < not_ready
            take = tl.where(found, first_inc + 1, not_ready)
            excl += tl.sum(tl.where(k < take, s & VALUE_MASK, 0), axis=0)
            j -= take
            done = found.to(tl.int64)
        tl.atomic_xchg(status_ptr + tile, (excl + size) | INCLUSIVE, sem="release")
    return excl


@triton.jit
def _reserve(res_ptr, counters_ptr, start, total, capacity, ELEM_BYTES: tl.constexpr, ARENA: tl.constexpr):
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


# capacity is not specialized (divisible by 16, equal to 1): Arena.fit() changes it between steps, and a new
# specialization must not be compiled while a CUDA graph is being captured.
@triton.jit(do_not_specialize=["capacity"])
def reserve_kernel(total_ptr, res_ptr, counters_ptr, start_ptr, capacity, ELEM_BYTES: tl.constexpr,
                   ARENA: tl.constexpr):
    """The two-pass encoder's reservation, between its passes: ``_reserve`` of ``*total_ptr`` elements."""
    _reserve(res_ptr, counters_ptr, tl.load(start_ptr) // ELEM_BYTES, tl.load(total_ptr), capacity, ELEM_BYTES,
             ARENA)


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
    ``work_ptr``: zeroed int64 ``[n_tiles + WORK_EXTRA]``: the tiles' status words, the ticket, then the
    results ``[total, nnz, sign_set, ok, start]`` (see :class:`Encoded`). ``start_ptr``: int64, the byte
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
    excl = _exclusive_prefix(work_ptr, tile, size)
    base = start + excl
    # Broadcast to a block: a scalar bool in a store mask is refused by Triton's interpreter.
    fits = (tl.zeros_like(f) + (base + size <= capacity).to(tl.int32)) != 0 if ARENA else f >= 0
    rank = (tl.cumsum(per_byte, axis=0) - per_byte)[:, None] + (tl.cumsum(f, axis=1) - f)
    tl.store(values_ptr + base + rank, x, mask=(f != 0) & fits)
    tl.store(tile_offsets_ptr + tile, excl.to(tl.int32))
    if tile == n_tiles - 1:
        total = excl + size
        tl.store(res_ptr + 1, total)  # without sign packing every value is one element
        _reserve(res_ptr, counters_ptr, start, total, capacity, ELEM_BYTES, ARENA)


WORK_EXTRA = 8  # ticket, total, nnz, sign_set, ok, start, a zero start, padding


class HostCounts(NamedTuple):
    """The counts read on the host when :func:`encode` allocates the values buffer (its one synchronization)."""

    total: int  # elements of the values buffer
    nnz: int  # stored elements
    sign_set: int  # elements with the sign bit set (sign packing only; else 0)


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
    host: HostCounts | None = None  # the counts as read on the host, when the values buffer was allocated here


def values_capacity(n: int, tile_size: int, dtype: torch.dtype, sign_pack: bool) -> int:
    """Values-buffer elements that any ``n``-element tensor of ``dtype`` may need (no element zero)."""
    n_tiles = -(-n // tile_size)
    return n_tiles * tile_size * value_width(bits_dtype(dtype), True) // 32 if sign_pack else n


def _check_options(src: torch.Tensor, sign_pack: bool, relu: bool, act, row: int, passes: int,
                   overwrite_input: bool, allocate: bool) -> None:  # fmt: skip
    if row not in (2, 8):
        raise ConfigError(f"sparse encode: row must be 2 or 8 elements, got {row!r}")
    if passes not in (1, 2) or (passes == 1 and sign_pack):
        raise ConfigError(f"sparse encode: passes must be 1 or 2 (2 with sign packing), got {passes!r}")
    if passes == 1 and allocate:
        raise ConfigError("sparse encode: passes=1 needs a values buffer (see values_capacity) or an arena")
    if act not in (None, "relu", "relu2"):
        raise ConfigError(f"sparse encode: act must be None, 'relu' or 'relu2', got {act!r}")
    if act is not None and not relu:
        raise ConfigError("sparse encode: act needs relu=True (it is the activation of the ReLU it encodes)")
    if overwrite_input and allocate:
        raise ConfigError("sparse encode: overwrite_input needs a values buffer or an arena (the scratch of an "
                          "allocated buffer is sized to the stored values, not taken from the input)")
    if overwrite_input and not src.is_contiguous():
        raise ConfigError("sparse encode: overwrite_input needs a contiguous input (a copy would be overwritten)")
    if relu and src.dtype not in RELU_DTYPES:
        raise ConfigError(f"sparse encode: relu=True takes float32, float16 or bfloat16, got {src.dtype}")


def encode(
    src: torch.Tensor,
    tile_size: int = DEFAULT_TILE_SIZE,
    sign_pack: bool = False,
    *,
    relu: bool = False,
    act: str | None = None,
    values: torch.Tensor | None = None,
    values_offset: torch.Tensor | None = None,
    arena=None,
    row: int = 8,
    passes: int = 2,
    overwrite_input: bool = False,
    act_in_place: bool = False,
) -> Encoded:
    """Encode ``src`` (any dense tensor of a float dtype or its integer view; read in memory order if contiguous).

    Where the values go:

    - neither ``values`` nor ``arena``: into a buffer allocated here to the exact size, which needs the size on
      the host: one host synchronization, which reads the counts into ``Encoded.host`` (the sign bits too, so
      a caller can refuse a negative input without a second one). What the codec runs;
    - ``values``: a buffer (the bit-view dtype, or int32 with ``sign_pack``) of at least
      :func:`values_capacity` elements (the worst case: nothing is zero), no zeroing needed; or, with
      ``values_offset`` (a one-element int64 device tensor: where this payload's values start in ``values``, in
      its elements), one the caller knows to hold ``values_offset + total`` elements (not checked: that would
      synchronize). No host synchronization;
    - ``arena``, an :class:`~actzip.memory.modules.arena.Arena`: into its buffer at its cursor, written only if they fit
      (``ok``). No host synchronization.

    ``relu=True``: encode ``relu(src)`` instead, and with ``act="relu"`` or ``"relu2"`` also return
    ``relu(src)`` or ``relu(src)²`` (``src``'s shape). ``passes``: 2 (count, scan, reserve, compact: the faster
    on an H200) or 1 (:func:`encode_kernel`, one read of the input, ``row`` its layout; no sign packing, not into
    an allocated buffer). The sign bit is dropped with ``sign_pack`` whether set or not: ``sign_set`` counts
    the elements that had it.

    Sign packing compacts the values whole into scratch room before packing them: sized by the host read when
    the buffer is allocated here, else as large as the input, where ``overwrite_input=True`` lets ``src``
    itself serve (it then holds garbage; its version counter is bumped so that autograd refuses a saved copy
    of it), else one is allocated for the call.

    ``act_in_place=True`` writes the activation over ``src`` (contiguous), which the caller no longer needs:
    every program reads its tile before it writes it, so the forward pass holds one hidden-size tensor, not
    two; ``src``'s version counter is bumped, as for ``overwrite_input``.
    """
    check_tile_size(tile_size)
    allocate = values is None and arena is None
    if values_offset is not None and values is None:
        raise ConfigError("sparse encode: values_offset says where the values go in a values buffer; pass one")
    _check_options(src, sign_pack, relu, act, row, passes, overwrite_input, allocate)
    if act_in_place and (act is None or overwrite_input or not src.is_contiguous()):
        raise ConfigError("sparse encode: act_in_place needs act='relu' or 'relu2', a contiguous input and no "
                          "overwrite_input (the input is then the activation, not scratch)")
    src = src.contiguous()
    view = bits_dtype(src.dtype)
    bits = check_bits(src.view(-1).view(view), src.numel())
    n = bits.numel()
    elem = 4 if sign_pack else bits.element_size()
    dev = src.device
    n_tiles = -(-n // tile_size)
    out = (src if act_in_place else torch.empty_like(src)) if act is not None else None
    want = torch.int32 if sign_pack else view
    work = torch.zeros(n_tiles + WORK_EXTRA if passes == 1 else WORK_EXTRA, dtype=torch.int64, device=dev)
    res = work[-(WORK_EXTRA - 1):]  # [total, nnz, sign_set, ok, start, a zero start, padding]
    code = src.view(-1) if relu else bits
    if passes == 1:
        values, start_bytes, capacity, counters = _values_target(values, values_offset, arena, want, n, tile_size,
                                                                 src, sign_pack, res)  # fmt: skip
        e = _encode_one_pass(code, bits, out, values, work, res, start_bytes, counters, capacity, tile_size, elem,
                             relu, act, arena is not None, row)  # fmt: skip
        if act_in_place:
            torch.autograd.graph.increment_version(src)
        return e
    c = sparse.count(code, n, tile_size, sign_pack, relu=relu)
    host, total = None, res[0:1]
    if allocate:
        if sign_pack:  # the one host sync: the sizes and the sign bits in one read
            host = HostCounts(*torch.cat([c.total, c.nnz, c.sign_set]).tolist())
        else:  # the one host sync: every value is one element
            host = HostCounts(*(int(c.total.item()),) * 2, 0)
        values = torch.empty(host.total, dtype=want, device=dev)
        total, ok = c.total, None
        res[3:4].fill_(1)
    else:
        values, start_bytes, capacity, counters = _values_target(values, values_offset, arena, want, n, tile_size,
                                                                 src, sign_pack, res)  # fmt: skip
        reserve_kernel[(1,)](c.total, res, counters, start_bytes, capacity, ELEM_BYTES=elem, ARENA=arena is not None)
        # An int32 flag: bool pointers are not loadable everywhere (Triton's interpreter refuses them as masks).
        ok = res[3:4].to(torch.int32) if arena is not None else None
    start = res[4:5]
    act_out = dict(relu=relu, act=out.view(-1) if out is not None else None, square=act == "relu2")
    if not sign_pack:
        sparse.compact(code, n, c, values, tile_size, out_offset=start, ok=ok, **act_out)
    else:
        if allocate:  # scratch of exactly the stored values, at each tile's prefix of value counts
            scratch = torch.empty(host.nnz, dtype=view, device=dev)
            value_offsets = torch.cumsum(c.nvals, 0, dtype=torch.int64) - c.nvals
        else:  # scratch of one slot of tile_size elements per tile: no prefix needed, and the input will do
            scratch = bits if overwrite_input else torch.empty(n_tiles * tile_size, dtype=view, device=dev)
            value_offsets = None
        sparse.compact(code, n, c, scratch, tile_size, offsets=value_offsets, slots=value_offsets is None, ok=ok,
                       **act_out)  # fmt: skip
        if n_tiles:
            sparse_signpack.pack(scratch, c.nvals, c.tile_offsets, values, value_width(view, True), tile_size,
                                 value_offsets=value_offsets, words_base=start, ok=ok)  # fmt: skip
    if (overwrite_input and not allocate) or act_in_place:
        torch.autograd.graph.increment_version(src)
    return Encoded(c.mask, c.tile_offsets, values, total, c.nnz, c.sign_set, res[3:4], start, out, host)


def _values_target(values, values_offset, arena, want, n, tile_size, src, sign_pack, res):
    """``(values, start_bytes, capacity, counters)`` for a given buffer or an arena (see :func:`encode`)."""
    if arena is not None:
        if values is not None:
            raise ConfigError("sparse encode: pass a values buffer or an arena, not both")
        values = arena.view(want)
        return values, arena.counters[:1].clone(), values.numel(), arena.counters
    if values.dtype != want or values.device != src.device:
        raise ConfigError(f"values must be a {want} tensor on {src.device}, got {values.dtype} on {values.device}")
    if values_offset is not None:  # the kernels take the start in bytes
        return values, values_base(values_offset, src.device) * values.element_size(), values.numel(), res[5:6]
    need = values_capacity(n, tile_size, src.dtype, sign_pack)
    if values.numel() < need:
        raise ConfigError(f"values holds {values.numel()} elements; encoding {n} elements may need {need}")
    return values, res[5:6], values.numel(), res[5:6]


def _encode_one_pass(code, bits, out, values, work, res, start_bytes, counters, capacity, tile_size, elem, relu,
                     act, arena, row) -> Encoded:  # fmt: skip
    n = bits.numel()
    n_tiles = -(-n // tile_size)
    mask = torch.empty(n_tiles * tile_size // 8, dtype=torch.uint8, device=bits.device)
    tile_offsets = torch.empty(n_tiles, dtype=torch.int32, device=bits.device)
    if n_tiles:
        encode_kernel[(n_tiles,)](
            code, out if out is not None else bits, mask, tile_offsets, values, work, start_bytes, counters, n,
            capacity, T=tile_size, ELEM_BYTES=elem, BITS_DTYPE=TL_BITS[bits.dtype], RELU=relu,
            ACT_OUT={None: 0, "relu": 1, "relu2": 2}[act], ARENA=arena, ROW=row, num_warps=num_warps(tile_size),
        )  # fmt: skip
    else:
        res[3].fill_(1)
    return Encoded(mask, tile_offsets, values, res[0:1], res[1:2], None, res[3:4], res[4:5], out)
