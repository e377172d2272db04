"""Triton kernels of the ``quant`` codec (the format is in :mod:`actzip.codecs.quant`), on the tile layout of
:mod:`actzip.kernels.quant_tiles`: one launch to encode (per-group scale, rounding and dense bit packing in one
kernel), one to decode. No host synchronization.

The PyTorch codec (``kernel="torch"``) is the oracle, and both make the same buffers bit for bit: every value
goes through the same IEEE float32 operations as in the reference, in the same order, and integer steps are
mirrored. No multiply and add become one fused operation (the one ``tl.fma`` multiplies by a power of two,
exactly, so it rounds like the reference's multiply then subtract). Integer codes become floats by or-ing
exponent bits, not by conversions. A -0.0 group parameter is stored as +0.0 (``x + 0.0``), and a group holding
inf or NaN (or whose range overflows) gets zero codes and NaN parameters.
"""

from __future__ import annotations

import functools

import torch

from actzip.errors import ConfigError
from actzip.kernels.quant_tiles import (
    bcast_rows,
    check_group_size,
    check_input,
    check_size,
    geometry,
    launch_options,
    load_rows,
    load_tile,
    new_output,
    random_bits,
    row_params,
    row_reduce,
    signed_key,
    store_f32,
    tile_elements,
    widen,
)
from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

__all__ = ["QUANT_DECODE_SHAPE", "QUANT_ENCODE_SHAPE", "QUANT_ENCODE_SHAPE_8BIT", "quant_decode", "quant_decode_kernel",
           "quant_encode", "quant_encode_kernel"]

# Default (tile, warps, group_threads) of the quant kernels, the fastest of `actzip bench quant`'s launch-shape
# sweep on an H200 for bfloat16 and float32 tensors: every chunk of a group on its own thread, small programs.
# 4-bit bfloat16 went from 58% / 46% of the copy bandwidth (encode / decode, the fp8 shape) to 82% / 84%.
QUANT_ENCODE_SHAPE = (2048, 1, 32)
QUANT_ENCODE_SHAPE_8BIT = (4096, 4, 4)  # 8-bit codes encode fastest with fewer threads per group
QUANT_DECODE_SHAPE = (2048, 2, 32)
_WORD = {8: torch.uint8, 16: torch.int16, 32: torch.int32}  # packed codes of one chunk -> the store's dtype


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


# -- kernels ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["key0", "key1"])
def quant_encode_kernel(
    x_ptr, codes_ptr, p0_ptr, p1_ptr, n, n_rows, key0, key1, row_groups, row_stride, noise_ptr,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
    TOP: tl.constexpr, OFF: tl.constexpr, ABSMAX: tl.constexpr, STOCHASTIC: tl.constexpr, IN_BF16: tl.constexpr,
    WIDE: tl.constexpr, HW: tl.constexpr, ROWS: tl.constexpr, NOISE: tl.constexpr = False,
):  # fmt: skip
    """Codes and parameters of ``BG`` groups. Oracle: ``QuantCodec._encode_torch`` (``check=False``).

    ``p0``/``p1``: ``lo``/``span`` (minmax) or ``absmax`` in ``p0``. ``TOP``: the largest step count (``L`` or
    ``Q``); ``OFF``: the codes' offset (``Q`` or 0). ``codes_ptr``: bytes (``BITS == 8``) or one word per chunk
    (``K * BITS`` bits). ``WIDE``: a tile may cross a multiple of 2**32 element pairs. ``ROWS``: ``x`` is rows of
    ``row_groups`` groups, ``row_stride`` elements apart (a view with gaps, read in place), else contiguous.
    ``NOISE``: ``noise_ptr`` holds an int32 added to ``key0`` (``actzip.codecs.step_noise``: new noise on each
    replay of a CUDA graph).
    """
    start, offs, words, chunk_ok = tile_elements(G, NS, BG, CP, K)
    if ROWS:
        xb = load_rows(x_ptr, start, offs, n, row_groups, row_stride, G, BG)
    else:
        xb = load_tile(x_ptr, start, offs, n, NS * BG * CP * K)
    x = widen(xb, IN_BF16, HW)
    if IN_BF16:  # reduce the (same) float32 values: the interpreter compares bfloat16 as integers, and Triton 3.6
        # refuses a bfloat16 reduction whose combine function compares (it promotes to float32)
        xb = x
    p0, row_ok = row_params(p0_ptr, n_rows, BG)
    if ABSMAX:
        param = row_reduce(tl.abs(xb), True).to(tl.float32) + 0.0
    else:
        lo = row_reduce(xb, False).to(tl.float32) + 0.0
        param = (row_reduce(xb, True).to(tl.float32) - lo) + 0.0
    ok = param < float("inf")  # false for inf and NaN
    safe = tl.where(param > 0, param, 1.0)
    pre = tl.where(safe < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)  # 2**64 below 2**-64: no inf
    factor = tl.div_rn(tl.full((BG,), TOP, tl.float32), safe * pre)
    # v = (x - lo) * TOP / span in [0, TOP], or x * Q / absmax in [-Q, Q], up to roundings.
    if ABSMAX:
        v = (x * bcast_rows(pre)) * bcast_rows(factor)
    else:
        v = tl.fma(x, bcast_rows(pre), bcast_rows(-(lo * pre))) * bcast_rows(factor)
    # The code, with FB fraction bits below it (garbage in a non-finite group, whose codes are zeroed below).
    if STOCHASTIC:
        # v + 256 (+ Q) lies in [256, 512): its bits count 2**-15 steps; adding 15 random bits carries into the
        # integer part with probability the fraction (rounded to 15 bits).
        t = (v + (256.0 + OFF)).to(tl.int32, bitcast=True)
        if NOISE:  # the key moved on the device by the step's offset (wrapping modulo 2**32)
            key0 = (key0.to(tl.uint32, bitcast=True) + tl.load(noise_ptr).to(tl.uint32, bitcast=True)).to(
                tl.int32, bitcast=True)
        q = t + random_bits(start, offs, key0, key1, NS, BG, CP, K, WIDE) - 0x43800000
        FB = 15
    else:
        q = (v + 12582912.0).to(tl.int32, bitcast=True) - (0x4B400000 - OFF)  # round half to even, + Q
        FB = 0
    q = q.to(tl.uint32, bitcast=True)
    if BITS == 8:  # clamped to the largest code (a float32 tie from it), or to 0 in a non-finite group
        q = tl.minimum(q >> FB, bcast_rows(tl.where(ok, TOP + OFF, 0).to(tl.uint32)))
        tl.store(codes_ptr + start + offs, q.to(tl.uint8), mask=bcast_rows(row_ok) & chunk_ok[:, :, :, None])
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
        p1, _ = row_params(p1_ptr, n_rows, BG)
        tl.store(p1, tl.where(ok, param, float("nan")), mask=row_ok)


@triton.jit(do_not_specialize=["zero"])
def quant_decode_kernel(
    codes_ptr, p0_ptr, p1_ptr, out_ptr, n, n_rows, zero,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, BITS: tl.constexpr,
    TOP: tl.constexpr, RECIP: tl.constexpr, ABSMAX: tl.constexpr, OUT_BF16: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Elements ``< n`` of ``BG`` groups: ``(q * RECIP) * span + lo`` or ``((q - Q) * RECIP) * absmax``, with
    ``RECIP`` the float32 ``1 / TOP``. Oracle: ``QuantCodec._decode_torch`` then the cast to the dtype."""
    start, offs, words, chunk_ok = tile_elements(G, NS, BG, CP, K)
    p0, row_ok = row_params(p0_ptr, n_rows, BG)
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
        y = (f * RECIP) * bcast_rows(tl.load(p0, mask=row_ok, other=0.0))
    else:
        p1, _ = row_params(p1_ptr, n_rows, BG)
        span = tl.load(p1, mask=row_ok, other=0.0)
        y = (f * RECIP) * bcast_rows(span) + bcast_rows(tl.load(p0, mask=row_ok, other=0.0))
    lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
    store_f32(out_ptr + start, offs, y, (offs < lim) & chunk_ok[:, :, :, None], OUT_BF16, HW)




def _shape(default: tuple[int, int, int], tile, warps, group_threads) -> tuple:
    """``(tile, group_threads, warps)`` for :func:`geometry`, each ``None`` taken from ``default``."""
    d_tile, d_warps, d_lanes = default
    return (d_tile if tile is None else tile, d_lanes if group_threads is None else group_threads,
            d_warps if warps is None else warps)  # fmt: skip



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
    *, noise: torch.Tensor | None = None, tile: int | None = None, warps: int | None = None,
    group_threads: int | None = None,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """The ``quant`` payload buffers of ``flat``: ``codes`` and ``lo``/``span`` or ``absmax``.

    ``flat``: a contiguous 1-D tensor, or a 2-D view of rows of whole groups with gaps between them (strides
    ``(S, 1)``, ``S`` at least the row's length: a slice of a wider tensor), encoded as its rows one after another
    without a copy.

    ``keys``: the two 32-bit keys of the random stream (``actzip.codecs.counter_rng.stream_keys``), used with
    ``stochastic``; ``noise``: a one-element int32 tensor on ``flat``'s device added to the first key there (see
    :mod:`actzip.codecs.step_noise`). A group holding inf or NaN, or whose range overflows, gets zero codes and
    NaN parameters.
    ``tile``, ``warps``, ``group_threads``: the launch's shape (see :func:`geometry`; any gives the same bytes).
    No host synchronization.
    """
    if bits not in (1, 2, 4, 8):
        raise ConfigError(f"quant Triton kernels: bits must be one of 1, 2, 4, 8, got {bits!r}")
    g = check_group_size(group_size)
    x, in_bf16, (row_groups, row_stride) = check_input(flat, g)
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
            x, _words(codes, word), p0, p1, n, n_groups, signed_key(keys[0]), signed_key(keys[1]), row_groups,
            row_stride, p0 if noise is None else noise, **consts, NOISE=stochastic and noise is not None,
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
    out, out_k, out_bf16 = new_output(n, dtype, codes.device)
    n_groups = -(-n // g)
    check_size("codes", codes, n_groups * g * bits // 8)
    check_size("the group parameters", p0, n_groups)
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
    grid, opts = launch_options(geo, n_groups, n_groups * g)
    top = _top(bits, absmax)
    consts = dict(BITS=bits, TOP=top, OFF=top if absmax else 0, ABSMAX=absmax, STOCHASTIC=stochastic,
                  IN_BF16=in_bf16, ROWS=rows, **geo, **opts)  # fmt: skip
    return grid, _word(geo, bits), consts


@functools.lru_cache(maxsize=1024)
def _decode_plan(n: int, elem_bytes: int, bits: int, g: int, absmax: bool, out_bf16: bool, tile, warps,
                 group_threads) -> tuple:  # fmt: skip
    geo = geometry(g, elem_bytes, bits, *_shape(QUANT_DECODE_SHAPE, tile, warps, group_threads))
    n_groups = -(-n // g)
    grid, opts = launch_options(geo, n_groups, n_groups * g)
    opts.pop("WIDE")
    top = _top(bits, absmax)
    consts = dict(BITS=bits, TOP=top, RECIP=_reciprocal(top), ABSMAX=absmax, OUT_BF16=out_bf16, **geo, **opts)
    return grid, _word(geo, bits, decode=True), consts
