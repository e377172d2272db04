"""Triton kernels of the ``quant`` codec (the format is in :mod:`actzip.codecs.quant`), and the tile layout,
launch shapes and device helpers that the ``fp8`` kernels (:mod:`actzip.kernels.fp8_triton`) share.

Encoding is one kernel launch, one program per tile of whole groups; decoding is one launch of the same
layout. Buffers are sized from the shape alone and nothing waits for the device: no host synchronization.

The kernels are bound by instructions per element, not memory, so the layout serves the instruction count. A
tile is a ``[NS, BG, CP, K]`` block: ``BG`` groups (rows), each cut into ``NS * CP`` chunks of ``K`` elements
(one 16-byte load: 8 for 16-bit dtypes, 4 for float32; at least a byte of codes). Triton gives each thread
whole chunks, threads along ``CP`` and rows, ``NS`` in registers, so a thread holds ``NS * K`` elements of its
group: the minimum and maximum reduce in registers (packed bfloat16/float16 instructions on a GPU) and then
over ``CP`` threads, the group's one division is shared by those elements, and a chunk's codes pack into one
word in the thread. Offsets inside a tile are int32 from a scalar int64 start. A group that is not a
power-of-two number of chunks takes ``NS = 1`` and ``CP`` rounded up, the extra chunks rereading the row's first
ones (so no minimum or maximum changes) and storing nothing. Past ``n`` the loads return element ``n - 1``: the
padding rule. :func:`geometry` picks the shape; ``tile``, ``warps`` and ``group_threads`` change it, never the
bytes written.

The PyTorch codec (``kernel="torch"``) is the oracle, and both make the same buffers bit for bit: every value
goes through the same IEEE float32 operations as in the reference, in the same order, and integer steps are
mirrored. The kernels are launched with ``enable_fp_fusion=False``, so no multiply and add become one fused
operation (the one ``tl.fma`` multiplies by a power of two, exactly, so it rounds like the reference's
multiply then subtract). Integer codes become floats by or-ing exponent bits, not by conversions. bfloat16
widens exactly (two logic instructions per pair of elements on a GPU) and is written by the hardware's
round-to-nearest-even conversion on a GPU and by moving bits under the interpreter, whose float32 -> bfloat16
conversion and bfloat16 comparisons differ from PyTorch's (``HW`` selects). A -0.0 group parameter is stored as
+0.0 (``x + 0.0``), and a group holding inf or NaN (or whose range overflows) gets zero codes and NaN parameters.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from actzip.errors import ConfigError
from actzip.kernels.quant_bits import mix32, pair_bits

MAX_GROUP = 4096  # largest group a program takes (one group must fit in one program's registers)
DEFAULT_TILE = 4096  # elements per program (fp8; quant takes the shapes below)
DEFAULT_GROUP_THREADS = 4  # threads sharing one group (when the group allows it)
# Default (tile, warps, group_threads) of the quant kernels, the fastest of `actzip bench quant`'s launch-shape
# sweep on an H200 for bfloat16 and float32 tensors: every chunk of a group on its own thread, small programs.
# 4-bit bfloat16 went from 58% / 46% of the copy bandwidth (encode / decode, the fp8 shape) to 82% / 84%.
QUANT_ENCODE_SHAPE = (2048, 1, 32)
QUANT_ENCODE_SHAPE_8BIT = (4096, 4, 4)  # 8-bit codes encode fastest with fewer threads per group
QUANT_DECODE_SHAPE = (2048, 2, 32)
_THREAD_ELEMS = 64  # most elements of one group a thread holds (registers)
_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LAUNCH = {"enable_fp_fusion": False}  # keep a * b + c two roundings, as PyTorch computes it
_WORD = {8: torch.uint8, 16: torch.int16, 32: torch.int32}  # packed codes of one chunk -> the store's dtype


# -- device helpers ---------------------------------------------------------------------------------------


@triton.jit
def _tile(G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr):
    """``(start, offs, words, chunk_ok)``: the tile's first element (int64), the int32 offsets ``[NS, BG, CP,
    K]`` of its elements from there, those of its chunks (``[NS, BG, CP]``, in chunks), and which chunks lie
    in their group (all unless the group was rounded up to a power of two chunks)."""
    start = tl.program_id(0).to(tl.int64) * (BG * G)
    c = tl.arange(0, CP)[None, None, :]
    chunk_ok = (c < G // K) | (NS * CP * K == G)
    c = tl.where(c < G // K, c, c - G // K)  # a rounded-up group rereads its first chunks
    words = tl.arange(0, NS)[:, None, None] * CP + tl.arange(0, BG)[None, :, None] * (G // K) + c
    return start, words[:, :, :, None] * K + tl.arange(0, K)[None, None, None, :], words, chunk_ok


@triton.jit
def _rows(p_ptr, n_rows, BG: tl.constexpr):
    """Pointers to the tile's ``BG`` group parameters and which of them exist."""
    first = tl.program_id(0).to(tl.int64) * BG
    r = tl.arange(0, BG)
    return p_ptr + first + r, r < tl.minimum(n_rows - first, BG).to(tl.int32)


@triton.jit
def _load_tile(x_ptr, start, offs, n, TILE: tl.constexpr):
    if n - start >= TILE:  # a whole tile: no masks
        x = tl.load(x_ptr + start + offs)
    else:  # past the end every element reads element n - 1: the padding rule
        x = tl.load(x_ptr + start + offs, mask=offs < (n - start).to(tl.int32), other=tl.load(x_ptr + (n - 1)))
    return x


@triton.jit
def _load_rows(x_ptr, start, offs, n, row_groups, row_stride, G: tl.constexpr, BG: tl.constexpr):
    """``_load_tile`` for a view of rows ``row_groups * G`` elements long, ``row_stride`` apart: a group lies in
    one row, so each has one base address (worked out per group, not per element). Past ``n``: zeros, which only
    groups that are never stored read (``n`` is whole groups)."""
    g = start // G + tl.arange(0, BG)
    row = g // row_groups
    base = row * row_stride + (g - row * row_groups) * G
    inner = offs - (tl.arange(0, BG) * G)[None, :, None, None]
    lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
    return tl.load(x_ptr + base[None, :, None, None] + inner, mask=offs < lim, other=0.0)


@triton.jit
def _widen(x, IN_BF16: tl.constexpr, HW: tl.constexpr):
    """float32 values of ``x``, exactly. On a GPU a pair of bfloat16 in one register widens in two logic
    instructions (what the compiler emits extracts the high half first)."""
    if IN_BF16 and HW:
        return tl.inline_asm_elementwise("shl.b32 $0, $2, 16;\n and.b32 $1, $2, 0xffff0000;", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)  # fmt: skip
    else:
        return x.to(tl.float32)


@triton.jit
def _store_f32(ptr, offs, y, mask, OUT_BF16: tl.constexpr, HW: tl.constexpr):
    if OUT_BF16 and not HW:  # as int16 bits, rounded to nearest even like PyTorch (a NaN stays a NaN)
        u = y.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)  # noqa: PLR0124 (NaN test)
        tl.store(ptr + offs, r.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
    elif OUT_BF16:
        tl.store(ptr + offs, y.to(tl.bfloat16).to(tl.int16, bitcast=True), mask=mask)
    else:
        tl.store(ptr + offs, y.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _row_reduce(x, MAX: tl.constexpr):
    """NaN-propagating minimum or maximum of each row of ``[NS, BG, CP, K]``: registers first, then threads."""
    if MAX:
        return tl.reduce(tl.reduce(tl.reduce(x, 0, _max_nan), 2, _max_nan), 1, _max_nan)
    else:
        return tl.reduce(tl.reduce(tl.reduce(x, 0, _min_nan), 2, _min_nan), 1, _min_nan)


@triton.jit
def _bcast(v):
    # Per-row values to [1, BG, 1, 1], undoing _row_reduce's axes in reverse (no layout conversion).
    return tl.expand_dims(tl.expand_dims(tl.expand_dims(v, 1), 2), 0)


@triton.jit
def _fields(w, BITS: tl.constexpr, N: tl.constexpr, OFF: tl.constexpr, zero):
    """``q - OFF`` as float32, exactly, for the ``N`` codes of ``BITS`` bits in each int32 of ``w`` (a new last
    axis), without int -> float conversions (a quarter-rate instruction on recent GPUs).

    Code ``k`` sits at bit ``p = k * BITS`` (one reaching bit 23 is first moved down 16). Or-ing the exponent of
    ``2**(23 - p)`` onto it in place makes the float32 ``2**(23 - p) + q``: one logic instruction per code (with
    the exponents in registers, which the runtime ``zero`` forces), then one subtraction.
    """
    p = tl.arange(0, N) * BITS
    high = p + BITS > 23
    p = tl.where(high, p - 16, p)
    w = tl.expand_dims(w, -1)
    w = tl.where(high, w >> 16, w)
    bias = ((150 - p) << 23).to(tl.float32, bitcast=True) + OFF  # 2**(23 - p) + OFF, exact
    return ((w & (((1 << BITS) - 1) << p)) | (((150 - p) << 23) + zero)).to(tl.float32, bitcast=True) - bias


@triton.jit
def _random_bits(start, offs, key0, key1, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr,
                 WIDE: tl.constexpr):  # fmt: skip
    """The codec's 15-bit random integers (``actzip.codecs.quant.round_bits``), one per element, in int32:
    one hash per pair of elements (elements ``2p`` and ``2p + 1``)."""
    pair, _ = tl.split(tl.reshape(offs, (NS, BG, CP, K // 2, 2)))
    pair = pair >> 1
    k0 = key0.to(tl.uint32, bitcast=True)
    k1 = key1.to(tl.uint32, bitcast=True)
    first = start >> 1
    if WIDE:  # the tile crosses a multiple of 2**32 pairs: the high part per pair
        p = first + pair
        h = pair_bits(p.to(tl.uint32) + k0, k1 ^ mix32((p >> 32).to(tl.uint32)))
    else:
        h = pair_bits(pair.to(tl.uint32) + (first.to(tl.uint32) + k0), k1 ^ mix32((first >> 32).to(tl.uint32)))
    r = tl.join((h >> 17).to(tl.int32), (h & 0x7FFF).to(tl.int32))
    return tl.reshape(r, (NS, BG, CP, K))


# -- kernels ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["key0", "key1"])
def quant_encode_kernel(
    x_ptr, codes_ptr, p0_ptr, p1_ptr, n, n_rows, key0, key1, row_groups, row_stride,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
    TOP: tl.constexpr, OFF: tl.constexpr, ABSMAX: tl.constexpr, STOCHASTIC: tl.constexpr, IN_BF16: tl.constexpr,
    WIDE: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """Codes and parameters of ``BG`` groups. Oracle: ``QuantCodec._encode_torch`` (``check=False``).

    ``p0``/``p1``: ``lo``/``span`` (minmax) or ``absmax`` in ``p0``. ``TOP``: the largest step count (``L`` or
    ``Q``); ``OFF``: the codes' offset (``Q`` or 0). ``codes_ptr``: bytes (``BITS == 8``) or one word per chunk
    (``K * BITS`` bits). ``WIDE``: a tile may cross a multiple of 2**32 element pairs. ``ROWS``: ``x`` is rows of
    ``row_groups`` groups, ``row_stride`` elements apart (a view with gaps, read in place), else contiguous.
    """
    start, offs, words, chunk_ok = _tile(G, NS, BG, CP, K)
    if ROWS:
        xb = _load_rows(x_ptr, start, offs, n, row_groups, row_stride, G, BG)
    else:
        xb = _load_tile(x_ptr, start, offs, n, NS * BG * CP * K)
    x = _widen(xb, IN_BF16, HW)
    if IN_BF16:  # reduce the (same) float32 values: the interpreter compares bfloat16 as integers, and Triton 3.6
        # refuses a bfloat16 reduction whose combine function compares (it promotes to float32)
        xb = x
    p0, row_ok = _rows(p0_ptr, n_rows, BG)
    if ABSMAX:
        param = _row_reduce(tl.abs(xb), True).to(tl.float32) + 0.0
    else:
        lo = _row_reduce(xb, False).to(tl.float32) + 0.0
        param = (_row_reduce(xb, True).to(tl.float32) - lo) + 0.0
    ok = param < float("inf")  # false for inf and NaN
    safe = tl.where(param > 0, param, 1.0)
    pre = tl.where(safe < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)  # 2**64 below 2**-64: no inf
    factor = tl.div_rn(tl.full((BG,), TOP, tl.float32), safe * pre)
    # v = (x - lo) * TOP / span in [0, TOP], or x * Q / absmax in [-Q, Q], up to roundings.
    if ABSMAX:
        v = (x * _bcast(pre)) * _bcast(factor)
    else:
        v = tl.fma(x, _bcast(pre), _bcast(-(lo * pre))) * _bcast(factor)
    # The code, with FB fraction bits below it (garbage in a non-finite group, whose codes are zeroed below).
    if STOCHASTIC:
        # v + 256 (+ Q) lies in [256, 512): its bits count 2**-15 steps; adding 15 random bits carries into the
        # integer part with probability the fraction (rounded to 15 bits).
        t = (v + (256.0 + OFF)).to(tl.int32, bitcast=True)
        q = t + _random_bits(start, offs, key0, key1, NS, BG, CP, K, WIDE) - 0x43800000
        FB = 15
    else:
        q = (v + 12582912.0).to(tl.int32, bitcast=True) - (0x4B400000 - OFF)  # round half to even, + Q
        FB = 0
    q = q.to(tl.uint32, bitcast=True)
    if BITS == 8:  # clamped to the largest code (a float32 tie from it), or to 0 in a non-finite group
        q = tl.minimum(q >> FB, _bcast(tl.where(ok, TOP + OFF, 0).to(tl.uint32)))
        tl.store(codes_ptr + start + offs, q.to(tl.uint8), mask=_bcast(row_ok) & chunk_ok[:, :, :, None])
    else:
        # Codes stay in [0, TOP] (TOP <= 15: v rounds to at most TOP). Each goes to bit k * BITS of its word by
        # one shift and a mask, the mask dropping the fraction bits; a non-finite group's words become 0.
        sh = FB - tl.arange(0, K)[None, None, None, :] * BITS
        q = tl.where(sh >= 0, q >> tl.maximum(sh, 0), q << tl.maximum(-sh, 0)) & (((1 << BITS) - 1) << -(sh - FB))
        word = tl.where(ok[None, :, None], tl.sum(q, axis=3), 0)  # disjoint bits: the sum is an or
        first = tl.program_id(0).to(tl.int64) * (BG * (G // K))
        tl.store(codes_ptr + first + words, word.to(codes_ptr.dtype.element_ty), mask=row_ok[None, :, None] & chunk_ok)
    if ABSMAX:
        tl.store(p0, tl.where(ok, param, float("nan")), mask=row_ok)
    else:
        tl.store(p0, tl.where(ok, lo, float("nan")), mask=row_ok)
        p1, _ = _rows(p1_ptr, n_rows, BG)
        tl.store(p1, tl.where(ok, param, float("nan")), mask=row_ok)


@triton.jit(do_not_specialize=["zero"])
def quant_decode_kernel(
    codes_ptr, p0_ptr, p1_ptr, out_ptr, n, n_rows, zero,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
    TOP: tl.constexpr, RECIP: tl.constexpr, ABSMAX: tl.constexpr, OUT_BF16: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Elements ``< n`` of ``BG`` groups: ``(q * RECIP) * span + lo`` or ``((q - Q) * RECIP) * absmax``, with
    ``RECIP`` the float32 ``1 / TOP``. Oracle: ``QuantCodec._decode_torch`` then the cast to the dtype."""
    start, offs, words, chunk_ok = _tile(G, NS, BG, CP, K)
    p0, row_ok = _rows(p0_ptr, n_rows, BG)
    if BITS == 8:  # K codes a chunk: K // 4 int32 words
        first = tl.program_id(0).to(tl.int64) * (BG * G // 4)
        w = tl.load(codes_ptr + first + (words[:, :, :, None] * (K // 4) + tl.arange(0, K // 4)[None, None, None, :]),
                    mask=row_ok[None, :, None, None], other=0)  # fmt: skip
        f = tl.reshape(_fields(w, 8, 4, TOP if ABSMAX else 0, zero), (NS, BG, CP, K))
    else:  # one word a chunk
        first = tl.program_id(0).to(tl.int64) * (BG * (G // K))
        w = tl.load(codes_ptr + first + words, mask=row_ok[None, :, None], other=0)
        if K * BITS == 8:
            w = w.to(tl.int32)
        elif K * BITS == 16:
            w = w.to(tl.uint16, bitcast=True).to(tl.int32)
        else:
            w = w.to(tl.int32, bitcast=True)
        f = _fields(w, BITS, K, TOP if ABSMAX else 0, zero)
    if ABSMAX:
        y = (f * RECIP) * _bcast(tl.load(p0, mask=row_ok, other=0.0))
    else:
        p1, _ = _rows(p1_ptr, n_rows, BG)
        span = tl.load(p1, mask=row_ok, other=0.0)
        y = (f * RECIP) * _bcast(span) + _bcast(tl.load(p0, mask=row_ok, other=0.0))
    lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
    _store_f32(out_ptr + start, offs, y, (offs < lim) & chunk_ok[:, :, :, None], OUT_BF16, HW)


# Triton picks between compiling and interpreting when a kernel is defined (TRITON_INTERPRET=1).
INTERPRETED = type(quant_encode_kernel).__name__ == "InterpretedFunction"


# -- host code --------------------------------------------------------------------------------------------


def check_group_size(group_size: int) -> int:
    """Raise :class:`ConfigError` unless ``group_size`` suits the kernels: a multiple of 8 up to :data:`MAX_GROUP`."""
    ok = isinstance(group_size, int) and not isinstance(group_size, bool) and 8 <= group_size <= MAX_GROUP
    if not ok or group_size % 8:
        raise ConfigError(
            f"quant Triton kernels: group_size must be a multiple of 8 from 8 to {MAX_GROUP}, got {group_size!r}"
        )
    return group_size


def _pow2(v: int, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1 or v & (v - 1):
        raise ConfigError(f"quant Triton kernels: {what} must be a power of two, got {v!r}")
    return v


def geometry(
    group_size: int, elem_bytes: int, bits: int, tile: int | None = None, group_threads: int | None = None,
    warps: int | None = None,
) -> dict:  # fmt: skip
    """The launch shape for groups of ``group_size`` elements of ``elem_bytes`` bytes, ``bits`` per code:
    ``G, NS, BG, CP, K`` (see the module docstring) and ``num_warps``, as keyword arguments of a launch.

    ``tile``: elements per program (a power of two; groups larger than it take one group per program).
    ``group_threads``: how many threads share a group (a power of two; more for groups too large for that many,
    or too few to fill the program). ``warps``: default 32 elements per thread, 1 to 8 warps.
    """
    return dict(_geometry(group_size, elem_bytes, bits, tile, group_threads, warps))


@functools.lru_cache(maxsize=256)
def _geometry(group_size: int, elem_bytes: int, bits: int, tile: int | None, group_threads: int | None,
              warps: int | None) -> tuple:  # fmt: skip
    # Worked out once per launch shape: a few microseconds of Python saved on every encode and decode.
    tile = _pow2(DEFAULT_TILE if tile is None else tile, "tile")
    lanes = _pow2(DEFAULT_GROUP_THREADS if group_threads is None else group_threads, "group_threads")
    k = max(16 // elem_bytes, 8 // bits)  # one 16-byte load, and whole bytes of codes
    chunks = group_size // k
    padded = bool(chunks & (chunks - 1))  # not a power of two chunks: one slice, rounded up
    row = triton.next_power_of_2(chunks) * k if padded else group_size
    bg = max(1, tile // row)
    warps = _pow2(min(8, max(1, bg * row // 1024)) if warps is None else warps, "warps")
    if padded:
        ns, cp = 1, row // k
    else:  # every thread busy, and at most _THREAD_ELEMS elements of a group in one thread
        cp = min(chunks, max(lanes, 32 * warps // bg, chunks * k // _THREAD_ELEMS))
        ns = chunks // cp
    return (("G", group_size), ("NS", ns), ("BG", bg), ("CP", cp), ("K", k), ("num_warps", warps))


def _shape(default: tuple[int, int, int], tile, warps, group_threads) -> tuple:
    """``(tile, group_threads, warps)`` for :func:`geometry`, each ``None`` taken from ``default``."""
    d_tile, d_warps, d_lanes = default
    return (d_tile if tile is None else tile, d_lanes if group_threads is None else group_threads,
            d_warps if warps is None else warps)  # fmt: skip


def _launch(geo: dict, n_rows: int, n_pad: int) -> tuple[tuple[int], dict]:
    """Grid, and the launch options: ``WIDE`` (a tile may cross a multiple of 2**32 element pairs, where the
    random stream's high part changes), ``HW`` (compiled for a GPU) and no fp fusion."""
    tile_pairs = geo["BG"] * geo["G"] // 2
    wide = n_pad > 1 << 33 and (1 << 32) % tile_pairs != 0
    return (-(-n_rows // geo["BG"]),), {"WIDE": wide, "HW": not INTERPRETED, **_LAUNCH}


def _signed(key: int) -> int:
    # A 32-bit key travels as an int32 argument (the same argument type every call: no recompilation).
    key &= 0xFFFFFFFF
    return key - (1 << 32) if key >= 1 << 31 else key


def _input(flat: torch.Tensor, group_size: int | None = None) -> tuple[torch.Tensor, bool, tuple[int, int]]:
    """``(flat, is bfloat16, (row_groups, row_stride))``: a contiguous 1-D tensor (``row_stride`` 0), or with
    ``group_size`` also a 2-D view of rows of whole groups ``row_stride`` elements apart."""
    if flat.dtype not in _INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels take float32, float16 and bfloat16 tensors, got {flat.dtype}")
    bf16 = flat.dtype == torch.bfloat16
    if flat.dim() == 1 and flat.is_contiguous():
        return flat, bf16, (1, 0)
    if group_size and flat.dim() == 2 and flat.stride(1) == 1 and flat.stride(0) >= flat.shape[1] > 0 \
            and flat.shape[1] % group_size == 0:  # fmt: skip
        return flat, bf16, (flat.shape[1] // group_size, flat.stride(0))
    rows = " or a 2-D view of rows of whole groups (strides (S, 1))" if group_size else ""
    raise ConfigError(
        f"quant Triton kernels: the input must be a contiguous 1-D tensor{rows}, got shape {tuple(flat.shape)} "
        f"strides {flat.stride()}"
    )


def _output(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    if dtype not in _INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels decode to float32, float16 and bfloat16, got {dtype}")
    out = torch.empty(n, dtype=dtype, device=device)
    bf16 = dtype == torch.bfloat16
    return out, (out.view(torch.int16) if bf16 else out), bf16


def _need(what: str, t: torch.Tensor, count: int) -> None:
    if t.numel() < count:
        raise ConfigError(f"quant Triton kernels: {what} has {t.numel()} elements, the payload needs {count}")


def _word(geo: dict, bits: int, decode: bool = False) -> torch.dtype | None:
    """The dtype packed codes move in: one word per chunk (8-bit codes as bytes, decoded from int32)."""
    if bits == 8 and not decode:
        return None
    return torch.int32 if bits == 8 else _WORD[geo["K"] * bits]


def _words(codes: torch.Tensor, word: torch.dtype | None) -> torch.Tensor:
    # The same bytes, little-endian, as ``word``s (a misaligned view is copied first).
    if word is None:
        return codes
    if codes.data_ptr() % word.itemsize or not codes.is_contiguous():
        codes = codes.contiguous().clone()
    return codes.view(word)  # whole words: a group's codes are a multiple of a chunk's


def _top(bits: int, absmax: bool) -> int:
    return (1 << (bits - 1)) - 1 if absmax else (1 << bits) - 1


@functools.cache
def _reciprocal(top: int) -> float:
    # The float32 1 / top, correctly rounded (as the PyTorch path's tensor division), once per top.
    return float(torch.ones((), dtype=torch.float32) / torch.full((), top, dtype=torch.float32))


def quant_encode(
    flat: torch.Tensor, bits: int, group_size: int, absmax: bool, stochastic: bool, keys: tuple[int, int] = (0, 0),
    *, tile: int | None = None, warps: int | None = None, group_threads: int | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The ``quant`` payload buffers of ``flat``: ``codes`` and ``lo``/``span`` or ``absmax``.

    ``flat``: a contiguous 1-D tensor, or a 2-D view of rows of whole groups with gaps between them (strides
    ``(S, 1)``, ``S`` at least the row's length: a slice of a wider tensor), encoded as its rows one after another
    without a copy.

    ``keys``: the two 32-bit keys of the random stream (``actzip.codecs.quant.stream_keys``), used with
    ``stochastic``. A group holding inf or NaN, or whose range overflows, gets zero codes and NaN parameters.
    ``tile``, ``warps``, ``group_threads``: the launch's shape (see :func:`geometry`; any gives the same bytes).
    No host synchronization.
    """
    if bits not in (1, 2, 4, 8):
        raise ConfigError(f"quant Triton kernels: bits must be one of 1, 2, 4, 8, got {bits!r}")
    g = check_group_size(group_size)
    x, in_bf16, (row_groups, row_stride) = _input(flat, g)
    n = flat.numel()
    n_groups = -(-n // g)
    dev = flat.device
    codes = torch.empty(n_groups * g * bits // 8, dtype=torch.uint8, device=dev)
    p0 = torch.empty(n_groups, dtype=torch.float32, device=dev)
    p1 = p0 if absmax else torch.empty_like(p0)
    if n_groups:
        grid, word, consts = _encode_plan(n, flat.element_size(), bits, g, absmax, stochastic, in_bf16,
                                          row_stride > 0, tile, warps, group_threads)  # fmt: skip
        quant_encode_kernel[grid](
            x, _words(codes, word), p0, p1, n, n_groups, _signed(keys[0]), _signed(keys[1]), row_groups, row_stride,
            **consts,
        )  # fmt: skip
    return {"codes": codes, "absmax": p0} if absmax else {"codes": codes, "lo": p0, "span": p1}


def quant_decode(
    codes: torch.Tensor, p0: torch.Tensor, p1: torch.Tensor | None, n: int, dtype: torch.dtype, bits: int,
    group_size: int, absmax: bool, *, tile: int | None = None, warps: int | None = None,
    group_threads: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """The first ``n`` elements (1-D, ``dtype``) of a ``quant`` payload: ``p0``/``p1`` are ``lo``/``span``, or
    ``absmax`` and ``None``. ``tile``, ``warps``, ``group_threads``: as for :func:`quant_encode`.
    No host synchronization."""
    g = check_group_size(group_size)
    out, out_k, out_bf16 = _output(n, dtype, codes.device)
    n_groups = -(-n // g)
    _need("codes", codes, n_groups * g * bits // 8)
    _need("the group parameters", p0, n_groups)
    if n_groups:
        grid, word, consts = _decode_plan(n, out.element_size(), bits, g, absmax, out_bf16, tile, warps,
                                          group_threads)  # fmt: skip
        quant_decode_kernel[grid](
            _words(codes[: n_groups * g * bits // 8], word), p0, p0 if p1 is None else p1, out_k, n, n_groups, 0,
            **consts,
        )  # fmt: skip
    return out


# Launch plans (grid, word dtype of the codes, compile-time arguments), worked out once per tensor size and
# options: activations repeat their sizes every step, and this is Python time on every save and unpack.


@functools.lru_cache(maxsize=1024)
def _encode_plan(n: int, elem_bytes: int, bits: int, g: int, absmax: bool, stochastic: bool, in_bf16: bool,
                 rows: bool, tile, warps, group_threads) -> tuple:  # fmt: skip
    shape = QUANT_ENCODE_SHAPE_8BIT if bits == 8 else QUANT_ENCODE_SHAPE
    geo = geometry(g, elem_bytes, bits, *_shape(shape, tile, warps, group_threads))
    n_groups = -(-n // g)
    grid, opts = _launch(geo, n_groups, n_groups * g)
    top = _top(bits, absmax)
    consts = dict(BITS=bits, TOP=top, OFF=top if absmax else 0, ABSMAX=absmax, STOCHASTIC=stochastic,
                  IN_BF16=in_bf16, ROWS=rows, **geo, **opts)  # fmt: skip
    return grid, _word(geo, bits), consts


@functools.lru_cache(maxsize=1024)
def _decode_plan(n: int, elem_bytes: int, bits: int, g: int, absmax: bool, out_bf16: bool, tile, warps,
                 group_threads) -> tuple:  # fmt: skip
    geo = geometry(g, elem_bytes, bits, *_shape(QUANT_DECODE_SHAPE, tile, warps, group_threads))
    n_groups = -(-n // g)
    grid, opts = _launch(geo, n_groups, n_groups * g)
    opts.pop("WIDE")
    top = _top(bits, absmax)
    consts = dict(BITS=bits, TOP=top, RECIP=_reciprocal(top), ABSMAX=absmax, OUT_BF16=out_bf16, **geo, **opts)
    return grid, _word(geo, bits, decode=True), consts
