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
- one pass (:mod:`actzip.kernels.sparse_encode_single`: no sign packing, into a given buffer or an arena):
  every program reads its input once, publishes its stored size, and learns the sizes of everything before
  it with a *decoupled look-back*; :func:`encode_kernel`, one tile per program, unless ``one_pass`` picks
  the knobs of the super-tile kernel (:class:`OnePass`: tiles per program, a persistent grid, layout, warps,
  look-back window).

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
from actzip.kernels import sparse, sparse_encode_single, sparse_signpack
from actzip.kernels.runtime import missing_triton
from actzip.kernels.sparse import RELU_DTYPES
from actzip.kernels.sparse_encode_single import ONE_F32_BITS, OnePass, encode_kernel, reserve
from actzip.kernels.sparse_launch import (
    DEFAULT_TILE_SIZE,
    bits_dtype,
    check_bits,
    check_tile_size,
    value_width,
    values_base,
)

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["ONE_F32_BITS", "Encoded", "HostCounts", "OnePass", "WORK_EXTRA", "encode", "encode_kernel",
           "reserve_kernel", "values_capacity"]

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


# capacity is not specialized (divisible by 16, equal to 1): Arena.fit() changes it between steps, and a new
# specialization must not be compiled while a CUDA graph is being captured.
@triton.jit(do_not_specialize=["capacity"])
def reserve_kernel(total_ptr, res_ptr, counters_ptr, start_ptr, capacity, ELEM_BYTES: tl.constexpr,
                   ARENA: tl.constexpr):
    """The two-pass encoder's reservation, between its passes: ``reserve`` of ``*total_ptr`` elements."""
    reserve(res_ptr, counters_ptr, tl.load(start_ptr) // ELEM_BYTES, tl.load(total_ptr), capacity, ELEM_BYTES,
            ARENA)


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
                   overwrite_input: bool, allocate: bool, one_pass: OnePass | None = None) -> None:  # fmt: skip
    if row not in (2, 8):
        raise ConfigError(f"sparse encode: row must be 2 or 8 elements, got {row!r}")
    if one_pass is not None and (passes != 1 or not isinstance(one_pass, OnePass)):
        raise ConfigError(f"sparse encode: one_pass takes a OnePass, with passes=1; got {one_pass!r}")
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
    one_pass: OnePass | None = None,
    scratch_tiles: int | None = None,
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
    of it), else one is allocated for the call. ``scratch_tiles`` (a values buffer or an arena): a scratch of
    that many tiles instead, the compaction and the packing run over that many tiles at a time, so that the
    input can take the activation in place (``act_in_place``) while the scratch stays small.

    ``act_in_place=True`` writes the activation over ``src`` (contiguous), which the caller no longer needs:
    every program reads its tile before it writes it, so the forward pass holds one hidden-size tensor, not
    two; ``src``'s version counter is bumped, as for ``overwrite_input``.

    ``one_pass`` (with ``passes=1``): the super-tile kernel's knobs (:class:`OnePass`); ``None``, one tile per
    program. Every choice makes the same buffers.
    """
    check_tile_size(tile_size)
    allocate = values is None and arena is None
    if values_offset is not None and values is None:
        raise ConfigError("sparse encode: values_offset says where the values go in a values buffer; pass one")
    _check_options(src, sign_pack, relu, act, row, passes, overwrite_input, allocate, one_pass)
    if scratch_tiles is not None and (not sign_pack or allocate or overwrite_input or passes != 2
                                      or not isinstance(scratch_tiles, int) or scratch_tiles < 1):
        raise ConfigError(f"sparse encode: scratch_tiles (a positive int, got {scratch_tiles!r}) sizes the scratch "
                          "of two-pass sign packing into a values buffer or an arena, without overwrite_input")
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
                             relu, act, arena is not None, row, one_pass)  # fmt: skip
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
        elif scratch_tiles is not None:  # slots for scratch_tiles tiles, reused chunk after chunk
            _pack_in_chunks(code, n, c, values, start, ok, tile_size, view, scratch_tiles, **act_out)
            value_offsets = scratch = None
        else:  # scratch of one slot of tile_size elements per tile: no prefix needed, and the input will do
            scratch = bits if overwrite_input else torch.empty(n_tiles * tile_size, dtype=view, device=dev)
            value_offsets = None
        if scratch is not None:
            sparse.compact(code, n, c, scratch, tile_size, offsets=value_offsets, slots=value_offsets is None, ok=ok,
                           **act_out)  # fmt: skip
            if n_tiles:
                sparse_signpack.pack(scratch, c.nvals, c.tile_offsets, values, value_width(view, True), tile_size,
                                     value_offsets=value_offsets, words_base=start, ok=ok)  # fmt: skip
    if (overwrite_input and not allocate) or act_in_place:
        torch.autograd.graph.increment_version(src)
    return Encoded(c.mask, c.tile_offsets, values, total, c.nnz, c.sign_set, res[3:4], start, out, host)


def _pack_in_chunks(code, n, c, values, start, ok, tile_size, view, scratch_tiles, *, relu, act, square) -> None:
    """Compact and pack ``scratch_tiles`` tiles at a time through one scratch of that many slots: the tiles are
    independent once their offsets are known, so each chunk is the whole passes on slices."""
    n_tiles = c.sizes.numel()
    scratch = torch.empty(min(scratch_tiles, n_tiles) * tile_size, dtype=view, device=code.device)
    for t0 in range(0, n_tiles, scratch_tiles):
        t1 = min(n_tiles, t0 + scratch_tiles)
        lo, hi = t0 * tile_size, min(n, t1 * tile_size)
        part = c._replace(sizes=c.sizes[t0:t1], tile_offsets=c.tile_offsets[t0:t1], nvals=c.nvals[t0:t1])
        sparse.compact(code[lo:hi], hi - lo, part, scratch, tile_size, slots=True, ok=ok, relu=relu,
                       act=act[lo:hi] if act is not None else None, square=square)  # fmt: skip
        sparse_signpack.pack(scratch, part.nvals, part.tile_offsets, values, value_width(view, True), tile_size,
                             words_base=start, ok=ok)  # fmt: skip


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
                     act, arena, row, one_pass) -> Encoded:  # fmt: skip
    if one_pass is not None:
        one_pass = sparse_encode_single.check_one_pass(one_pass, tile_size, row)
    n = bits.numel()
    n_tiles = -(-n // tile_size)
    mask = torch.empty(n_tiles * tile_size // 8, dtype=torch.uint8, device=bits.device)
    tile_offsets = torch.empty(n_tiles, dtype=torch.int32, device=bits.device)
    if n_tiles:
        sparse_encode_single.launch(code, out if out is not None else bits, mask, tile_offsets, values, work,
                                    start_bytes, counters, n, capacity, tile_size, elem, bits.dtype, relu,
                                    {None: 0, "relu": 1, "relu2": 2}[act], arena, row, one_pass)  # fmt: skip
    else:
        res[3].fill_(1)
    return Encoded(mask, tile_offsets, values, res[0:1], res[1:2], None, res[3:4], res[4:5], out)
