"""Triton kernels for the lossy codecs ``quant`` and ``fp8`` (the formats are in :mod:`actzip.codecs.quant`).

Encoding is one kernel launch, one program per tile of whole groups: a program loads ``BG`` groups of ``G``
elements as a ``[BG, GP]`` block (``GP``: ``G`` rounded up to a power of two, the extra columns masked), reduces
each row to its minimum, maximum and a NaN flag, computes the group's parameters, rounds every element (to
nearest, or stochastically with the counter-based uniforms of :func:`actzip.codecs.quant.hash_uniform`),
packs the codes densely and stores codes and parameters. Decoding is one launch of the same shape. fp8 with
one scale per tensor first reduces the tensor's absmax with ``torch.aminmax`` on the device, then runs the
same kernel on rows of :data:`ROW` elements. Buffers are sized from the shape alone and nothing waits for the
device: no host synchronization.

The PyTorch codec (``kernel="torch"``) is the oracle, and both make the same buffers bit for bit. To get there
every value goes through the same IEEE float32 operations as in the reference, in the same order:

- divisions are ``tl.div_rn`` (Triton's ``/`` is an approximate division for float32 on NVIDIA GPUs), and the
  kernels are launched with ``enable_fp_fusion=False``, so no multiply and add become one fused operation;
- round half to even is ``(v + 1.5 * 2**23) - 1.5 * 2**23`` (exact for ``|v| < 2**22``; here ``|v| <= 255``);
- bfloat16 is read and written by moving bits (``bits << 16``; round to nearest even in integers, as
  PyTorch does), and fp8 codes are made and read with integer operations that mirror PyTorch's conversions,
  so the CPU interpreter (``TRITON_INTERPRET=1``) computes the same bits as a GPU;
- a -0.0 group parameter is stored as +0.0 (``x + 0.0``), and a group holding inf or NaN (or whose range
  overflows) gets zero codes and NaN parameters.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from actzip.core.errors import ConfigError

MAX_GROUP = 4096  # largest group a program takes (one group must fit in one program's registers)
ROW = 1024  # fp8 with one scale per tensor: elements per row of a tile
_TILE = 2048  # elements per program (BG * GP)
HASH_M1, HASH_M2 = 0x21F0AAAD, 0x735A2D97  # the multipliers of _mix32 (the codec's mix32 uses the same)
# fp8 formats: mantissa bits, exponent bias, largest finite value.
FP8_LAYOUT = {"e4m3": (3, 7, 448.0), "e5m2": (2, 15, 57344.0)}
_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_LAUNCH = {"enable_fp_fusion": False}  # keep a * b + c two roundings, as PyTorch computes it


# -- device helpers ---------------------------------------------------------------------------------------


@triton.jit
def _mix32(h):
    # mix32 of actzip.codecs.quant, on uint32 (multiplication wraps modulo 2**32).
    h = h ^ (h >> 16)
    h = h * 0x21F0AAAD
    h = h ^ (h >> 15)
    h = h * 0x735A2D97
    h = h ^ (h >> 15)
    return h


@triton.jit
def _uniform24(idx, key0, key1):
    """hash_uniform of actzip.codecs.quant: float32 in [0, 1) on the 2**-24 grid for int64 indices ``idx``."""
    k0 = key0.to(tl.uint32, bitcast=True)
    k1 = key1.to(tl.uint32, bitcast=True)
    h = _mix32(idx.to(tl.uint32) ^ k0)
    h = _mix32(h ^ (idx >> 32).to(tl.uint32) ^ k1)
    return (h >> 8).to(tl.float32) * 5.9604644775390625e-08


@triton.jit
def _load_f32(ptr, offs, mask, IN_BF16: tl.constexpr):
    # bfloat16 arrives as its int16 bits: widening is a shift, exact on every backend.
    if IN_BF16:
        b = tl.load(ptr + offs, mask=mask, other=0).to(tl.int32)
        return (b << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_f32(ptr, offs, y, mask, OUT_BF16: tl.constexpr):
    # bfloat16 leaves as int16 bits, rounded to nearest even like PyTorch's conversion (a NaN stays a NaN).
    if OUT_BF16:
        u = y.to(tl.uint32, bitcast=True)
        r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)  # noqa: PLR0124 (NaN test)
        tl.store(ptr + offs, r.to(tl.uint16).to(tl.int16, bitcast=True), mask=mask)
    else:
        tl.store(ptr + offs, y.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rint(v):
    # Round half to even for |v| < 2**22: the sum lands where float32's spacing is 1.
    return (v + 12582912.0) - 12582912.0


@triton.jit
def _floor(v):
    # floor for |v| < 2**22 from _rint: plain IEEE additions (tl.floor goes through libdevice, which Triton
    # builds flushing subnormals to zero).
    r = _rint(v)
    return r - tl.where(r > v, 1.0, 0.0)


@triton.jit
def _row_min_max_nan(x, valid, row_ok):
    """Per row of ``x``: minimum (+0.0 for -0.0), maximum, and whether a valid element is NaN (rows past the
    end get zeros: they store nothing, and finite values keep the interpreter quiet)."""
    nan = tl.max(tl.where(valid & (x != x), 1, 0), axis=1) > 0  # noqa: PLR0124 (NaN test)
    lo = tl.min(tl.where(valid, x, float("inf")), axis=1) + 0.0
    hi = tl.max(tl.where(valid, x, float("-inf")), axis=1)
    return tl.where(row_ok, lo, 0.0), tl.where(row_ok, hi, 0.0), nan


@triton.jit
def _fp8_value(c, MBITS: tl.constexpr, BIAS: tl.constexpr, SUB_UNIT: tl.constexpr):
    """float32 value of non-negative fp8 codes ``c`` (int32 in [0, 127])."""
    e = c >> MBITS
    m = c & ((1 << MBITS) - 1)
    normal = ((e + (127 - BIAS)) << 23) | (m << (23 - MBITS))
    v = tl.where(e == 0, m.to(tl.float32) * SUB_UNIT, normal.to(tl.float32, bitcast=True))
    if MBITS == 3:  # e4m3fn: no inf, one NaN pattern
        v = tl.where(c == 0x7F, float("nan"), v)
    else:  # e5m2: IEEE-like specials
        v = tl.where(e == 31, tl.where(m == 0, float("inf"), float("nan")), v)
    return v


@triton.jit
def _fp8_round(mb, MBITS: tl.constexpr, BIAS: tl.constexpr, NEAREST: tl.constexpr):
    """fp8 codes of float32 magnitudes given by their bits ``mb`` (int32, sign clear, at most the fp8 max):
    rounded to nearest even (as PyTorch's conversion), or toward zero (the lower neighbour)."""
    e = mb >> 23
    rebased = mb - ((127 - BIAS) << 23)
    if NEAREST:
        normal = (rebased + ((1 << (22 - MBITS)) - 1) + ((mb >> (23 - MBITS)) & 1)) >> (23 - MBITS)
    else:
        normal = rebased >> (23 - MBITS)
    # Below the smallest normal: count units of the smallest subnormal, from the integer significand.
    m = (mb & 0x7FFFFF) | tl.where(e > 0, 0x800000, 0)
    s = tl.minimum((151 - BIAS - MBITS) - tl.maximum(e, 1), 31)
    q = m >> s
    if NEAREST:
        rem = m & ((1 << s) - 1)
        half = 1 << (s - 1)
        q = q + tl.where((rem > half) | ((rem == half) & ((q & 1) == 1)), 1, 0)
    code = tl.where(e >= 128 - BIAS, normal, q)
    if NEAREST:  # out of range: what PyTorch's conversion gives (never reached by the codec)
        if MBITS == 3:
            code = tl.where(mb >= (1087 << 20), 0x7F, code)
        else:
            code = tl.where(mb >= (143 << 23), tl.where(mb > 0x7F800000, 0x7F, 0x7C), code)
    return code


@triton.jit
def _fp8_scale(am, TOP_E: tl.constexpr, TOP_FRAC: tl.constexpr):
    """The codec's scale of a finite absmax ``am`` >= 0: the smallest power of two ``p`` with ``am / p`` at most
    the fp8 max (``TOP_E``, ``TOP_FRAC``: that max's frexp exponent and fraction bits), at least 2**-149; 1 for 0.
    Built from the exponent bits: no pow, no division."""
    u = am.to(tl.int32, bitcast=True)
    eb = u >> 23
    frac = u & 0x7FFFFF
    sub = frac.to(tl.float32).to(tl.int32, bitcast=True)  # a subnormal's significand, normalized exactly
    is_sub = eb == 0
    e = tl.where(is_sub, (sub >> 23) - 275, eb - 126)  # frexp exponent: am = m * 2**e, m in [0.5, 1)
    f = tl.where(is_sub, sub & 0x7FFFFF, frac)
    k = tl.maximum(e - TOP_E + tl.where(f > TOP_FRAC, 1, 0), -149)
    bits = tl.where(k >= -126, (k + 127) << 23, 1 << tl.minimum(k + 149, 22))
    return tl.where(am > 0, bits.to(tl.float32, bitcast=True), 1.0)


@triton.jit
def _tile_index(G: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, n_rows):
    rows = tl.program_id(0).to(tl.int64) * BG + tl.arange(0, BG)
    cols = tl.arange(0, GP)
    row_ok = rows < n_rows
    valid = row_ok[:, None] & (cols < G)[None, :]
    return rows, row_ok, valid, rows[:, None] * G + cols[None, :]


# -- kernels ----------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["key0", "key1"])
def quant_encode_kernel(
    x_ptr, codes_ptr, p0_ptr, p1_ptr, n, n_groups, key0, key1,
    G: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, BITS: tl.constexpr, PER: tl.constexpr,
    TOP: tl.constexpr, ABSMAX: tl.constexpr, STOCHASTIC: tl.constexpr, IN_BF16: tl.constexpr,
):  # fmt: skip
    """Codes and parameters of ``BG`` groups. Oracle: ``QuantCodec._encode_torch`` (``check=False``).

    ``p0``/``p1``: ``lo``/``span`` (minmax) or ``absmax`` in ``p0``. ``PER = 8 // BITS`` codes per byte, ``TOP``
    the largest step count (``L`` or ``Q``). Padding past ``n`` repeats element ``n - 1``.
    """
    rows, row_ok, valid, idx = _tile_index(G, GP, BG, n_groups)
    x = _load_f32(x_ptr, tl.minimum(idx, n - 1), valid, IN_BF16)
    lo, hi, nan = _row_min_max_nan(x, valid, row_ok)
    if ABSMAX:
        param = tl.maximum(hi, -lo) + 0.0
        num = x
    else:
        param = (hi - lo) + 0.0
        num = x - lo[:, None]
    ok = (nan == 0) & (tl.abs(param) < float("inf"))
    safe = tl.where(param > 0, param, 1.0)
    v = tl.div_rn(num, tl.broadcast_to(safe[:, None], (BG, GP))) * TOP
    if STOCHASTIC:
        fl = _floor(v)
        q = fl + tl.where(_uniform24(idx, key0, key1) < v - fl, 1.0, 0.0)
    else:
        q = _rint(v)
    if ABSMAX:
        q = tl.minimum(tl.maximum(q, -TOP), TOP) + TOP
    else:
        q = tl.minimum(tl.maximum(q, 0.0), TOP)
    code = tl.where(ok[:, None], q, 0.0).to(tl.int32)
    if BITS == 8:
        tl.store(codes_ptr + idx, code.to(tl.uint8), mask=valid)
    else:
        byte = tl.sum(tl.reshape(code, (BG, GP // PER, PER)) << (tl.arange(0, PER) * BITS)[None, None, :], axis=2)
        bcols = tl.arange(0, GP // PER)
        bmask = row_ok[:, None] & (bcols < G // PER)[None, :]
        tl.store(codes_ptr + rows[:, None] * (G // PER) + bcols[None, :], byte.to(tl.uint8), mask=bmask)
    if ABSMAX:
        tl.store(p0_ptr + rows, tl.where(ok, param, float("nan")), mask=row_ok)
    else:
        tl.store(p0_ptr + rows, tl.where(ok, lo, float("nan")), mask=row_ok)
        tl.store(p1_ptr + rows, tl.where(ok, param, float("nan")), mask=row_ok)


@triton.jit
def quant_decode_kernel(
    codes_ptr, p0_ptr, p1_ptr, out_ptr, n, n_groups,
    G: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, BITS: tl.constexpr, PER: tl.constexpr,
    TOP: tl.constexpr, ABSMAX: tl.constexpr, OUT_BF16: tl.constexpr,
):  # fmt: skip
    """Elements ``< n`` of ``BG`` groups. Oracle: ``QuantCodec._decode_torch`` then the cast to the dtype."""
    rows, row_ok, valid, idx = _tile_index(G, GP, BG, n_groups)
    if BITS == 8:
        q = tl.load(codes_ptr + idx, mask=valid, other=0).to(tl.int32)
    else:
        bcols = tl.arange(0, GP // PER)
        bmask = row_ok[:, None] & (bcols < G // PER)[None, :]
        b = tl.load(codes_ptr + rows[:, None] * (G // PER) + bcols[None, :], mask=bmask, other=0).to(tl.int32)
        q = (b[:, :, None] >> (tl.arange(0, PER) * BITS)[None, None, :]) & ((1 << BITS) - 1)
        q = tl.reshape(q, (BG, GP))
    top = tl.full((BG, GP), TOP, tl.float32)
    if ABSMAX:
        am = tl.load(p0_ptr + rows, mask=row_ok, other=0.0)
        y = tl.div_rn(q.to(tl.float32) - TOP, top) * am[:, None]
    else:
        lo = tl.load(p0_ptr + rows, mask=row_ok, other=0.0)
        span = tl.load(p1_ptr + rows, mask=row_ok, other=0.0)
        y = tl.div_rn(q.to(tl.float32), top) * span[:, None] + lo[:, None]
    _store_f32(out_ptr, idx, y, valid & (idx < n), OUT_BF16)


@triton.jit(do_not_specialize=["key0", "key1"])
def fp8_encode_kernel(
    x_ptr, codes_ptr, scale_ptr, amax_ptr, n, n_rows, key0, key1,
    G: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
    SUB_UNIT: tl.constexpr, TOP_E: tl.constexpr, TOP_FRAC: tl.constexpr, STOCHASTIC: tl.constexpr,
    IN_BF16: tl.constexpr, TENSOR: tl.constexpr,
):  # fmt: skip
    """fp8 codes and scales of ``BG`` rows. Oracle: ``FP8Codec._encode_torch`` (``check=False``).

    Per group (``TENSOR`` false): rows are groups, padded like the quant kernel. One scale for the tensor
    (``TENSOR``): rows are ``G``-element slices of it, ``amax_ptr`` holds its absmax, program 0 stores the scale.
    """
    rows, row_ok, valid, idx = _tile_index(G, GP, BG, n_rows)
    if TENSOR:
        valid = valid & (idx < n)
        x = _load_f32(x_ptr, idx, valid, IN_BF16)
        am = tl.load(amax_ptr + rows * 0)  # the tensor's absmax on every row
        ok = am < float("inf")  # false for inf and NaN
    else:
        x = _load_f32(x_ptr, tl.minimum(idx, n - 1), valid, IN_BF16)
        lo, hi, nan = _row_min_max_nan(x, valid, row_ok)
        am = tl.maximum(hi, -lo)
        ok = (nan == 0) & (am < float("inf"))
    scale = _fp8_scale(tl.where(ok, am, 0.0), TOP_E, TOP_FRAC)
    t = tl.div_rn(x, tl.broadcast_to(scale[:, None], (BG, GP)))  # exact but in the subnormal range
    tb = t.to(tl.int32, bitcast=True)
    mb = tb & 0x7FFFFFFF
    if STOCHASTIC:
        lower = _fp8_round(mb, MBITS, BIAS, False)
        mag = mb.to(tl.float32, bitcast=True)
        lower_v = _fp8_value(lower, MBITS, BIAS, SUB_UNIT)
        upper = lower + tl.where(lower_v < mag, 1, 0)
        gap = _fp8_value(upper, MBITS, BIAS, SUB_UNIT) - lower_v
        frac = tl.div_rn(mag - lower_v, tl.where(gap > 0, gap, 1.0))
        code = lower + tl.where(_uniform24(idx, key0, key1) < frac, 1, 0)
    else:
        code = _fp8_round(mb, MBITS, BIAS, True)
    code = tl.where(ok[:, None], code | ((tb >> 24) & 0x80), 0)
    tl.store(codes_ptr + idx, code.to(tl.uint8), mask=valid)
    stored = tl.where(ok, scale, float("nan"))
    if TENSOR:
        tl.store(scale_ptr + rows * 0, stored, mask=rows == 0)
    else:
        tl.store(scale_ptr + rows, stored, mask=row_ok)


@triton.jit
def fp8_decode_kernel(
    codes_ptr, scale_ptr, out_ptr, n, n_rows,
    G: tl.constexpr, GP: tl.constexpr, BG: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
    SUB_UNIT: tl.constexpr, BIG: tl.constexpr, OUT_BF16: tl.constexpr, TENSOR: tl.constexpr,
):  # fmt: skip
    """Elements ``< n``: code value times scale, clamped to the dtype's range. Oracle: ``FP8Codec.decode``."""
    rows, row_ok, valid, idx = _tile_index(G, GP, BG, n_rows)
    valid = valid & (idx < n)
    c = tl.load(codes_ptr + idx, mask=valid, other=0).to(tl.int32)
    v = _fp8_value(c & 0x7F, MBITS, BIAS, SUB_UNIT)
    v = tl.where((c & 0x80) != 0, -v, v)
    if TENSOR:
        sc = tl.load(scale_ptr + rows * 0)
    else:
        sc = tl.load(scale_ptr + rows, mask=row_ok, other=1.0)
    y = v * sc[:, None]
    y = tl.where(y > BIG, BIG, tl.where(y < -BIG, -BIG, y))  # comparisons keep a NaN a NaN
    _store_f32(out_ptr, idx, y, valid, OUT_BF16)


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


def _tile(group_size: int) -> tuple[int, int, int]:
    """``(GP, BG, num_warps)`` for groups of ``group_size`` elements."""
    gp = triton.next_power_of_2(group_size)
    bg = max(1, _TILE // gp)
    return gp, bg, 4 if gp * bg <= _TILE else 8


def _signed(key: int) -> int:
    # A 32-bit key travels as an int32 argument (the same argument type every call: no recompilation).
    key &= 0xFFFFFFFF
    return key - (1 << 32) if key >= 1 << 31 else key


def _input(flat: torch.Tensor) -> tuple[torch.Tensor, bool]:
    if flat.dtype not in _INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels take float32, float16 and bfloat16 tensors, got {flat.dtype}")
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ConfigError(
            f"quant Triton kernels: the input must be a contiguous 1-D tensor, got shape {tuple(flat.shape)}"
            f"{'' if flat.is_contiguous() else ' (not contiguous)'}"
        )
    bf16 = flat.dtype == torch.bfloat16
    return (flat.view(torch.int16) if bf16 else flat), bf16


def _output(n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    if dtype not in _INPUT_DTYPES:
        raise ConfigError(f"quant Triton kernels decode to float32, float16 and bfloat16, got {dtype}")
    out = torch.empty(n, dtype=dtype, device=device)
    bf16 = dtype == torch.bfloat16
    return out, (out.view(torch.int16) if bf16 else out), bf16


def _need(what: str, t: torch.Tensor, count: int) -> None:
    if t.numel() < count:
        raise ConfigError(f"quant Triton kernels: {what} has {t.numel()} elements, the payload needs {count}")


def quant_encode(
    flat: torch.Tensor, bits: int, group_size: int, absmax: bool, stochastic: bool, keys: tuple[int, int] = (0, 0)
) -> dict[str, torch.Tensor]:
    """The ``quant`` payload buffers of ``flat`` (contiguous 1-D): ``codes`` and ``lo``/``span`` or ``absmax``.

    ``keys``: the two 32-bit keys of the random stream (``actzip.codecs.quant.stream_keys``), used with
    ``stochastic``. A group holding inf or NaN, or whose range overflows, gets zero codes and NaN parameters.
    No host synchronization.
    """
    if bits not in (1, 2, 4, 8):
        raise ConfigError(f"quant Triton kernels: bits must be one of 1, 2, 4, 8, got {bits!r}")
    x, in_bf16 = _input(flat)
    g = check_group_size(group_size)
    n = flat.numel()
    n_groups = -(-n // g)
    dev = flat.device
    codes = torch.empty(n_groups * g * bits // 8, dtype=torch.uint8, device=dev)
    p0 = torch.empty(n_groups, dtype=torch.float32, device=dev)
    p1 = p0 if absmax else torch.empty_like(p0)
    if n_groups:
        gp, bg, warps = _tile(g)
        top = (1 << (bits - 1)) - 1 if absmax else (1 << bits) - 1
        quant_encode_kernel[(-(-n_groups // bg),)](
            x, codes, p0, p1, n, n_groups, _signed(keys[0]), _signed(keys[1]),
            G=g, GP=gp, BG=bg, BITS=bits, PER=8 // bits, TOP=top, ABSMAX=absmax, STOCHASTIC=stochastic,
            IN_BF16=in_bf16, num_warps=warps, **_LAUNCH,
        )  # fmt: skip
    return {"codes": codes, "absmax": p0} if absmax else {"codes": codes, "lo": p0, "span": p1}


def quant_decode(
    codes: torch.Tensor,
    p0: torch.Tensor,
    p1: torch.Tensor | None,
    n: int,
    dtype: torch.dtype,
    bits: int,
    group_size: int,
    absmax: bool,
) -> torch.Tensor:
    """The first ``n`` elements (1-D, ``dtype``) of a ``quant`` payload: ``p0``/``p1`` are ``lo``/``span``, or
    ``absmax`` and ``None``. No host synchronization."""
    g = check_group_size(group_size)
    out, out_k, out_bf16 = _output(n, dtype, codes.device)
    n_groups = -(-n // g)
    _need("codes", codes, n_groups * g * bits // 8)
    _need("the group parameters", p0, n_groups)
    if n_groups:
        gp, bg, warps = _tile(g)
        top = (1 << (bits - 1)) - 1 if absmax else (1 << bits) - 1
        quant_decode_kernel[(-(-n_groups // bg),)](
            codes, p0, p0 if p1 is None else p1, out_k, n, n_groups,
            G=g, GP=gp, BG=bg, BITS=bits, PER=8 // bits, TOP=top, ABSMAX=absmax, OUT_BF16=out_bf16,
            num_warps=warps, **_LAUNCH,
        )  # fmt: skip
    return out


def _fp8_constants(fmt: str) -> dict:
    try:
        mbits, bias, _ = FP8_LAYOUT[fmt]
    except KeyError:
        raise ConfigError(f"fp8 Triton kernels: format must be one of {', '.join(map(repr, FP8_LAYOUT))}") from None
    return {"MBITS": mbits, "BIAS": bias, "SUB_UNIT": 2.0 ** (1 - bias - mbits)}


def fp8_encode(
    flat: torch.Tensor, fmt: str, group_size: int | None, stochastic: bool, keys: tuple[int, int] = (0, 0)
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``fp8`` payload buffers ``(codes, scale)`` of ``flat`` (contiguous 1-D), one scale per
    ``group_size`` elements or, with ``None``, per tensor. Non-finite groups: zero codes, NaN scale.
    No host synchronization."""
    x, in_bf16 = _input(flat)
    consts = _fp8_constants(fmt)
    top_m, top_e = math.frexp(FP8_LAYOUT[fmt][2])
    n = flat.numel()
    dev = flat.device
    if group_size is None:
        if n == 0:
            return torch.empty(0, dtype=torch.uint8, device=dev), torch.empty(0, dtype=torch.float32, device=dev)
        lo, hi = torch.aminmax(flat)  # exact in any float dtype; NaN propagates
        amax = torch.maximum(hi, -lo).to(torch.float32).reshape(1)
        g, n_rows = ROW, -(-n // ROW)
        codes = torch.empty(n, dtype=torch.uint8, device=dev)
        scale = torch.empty(1, dtype=torch.float32, device=dev)
    else:
        g = check_group_size(group_size)
        n_rows = -(-n // g)
        codes = torch.empty(n_rows * g, dtype=torch.uint8, device=dev)
        scale = amax = torch.empty(n_rows, dtype=torch.float32, device=dev)
    if n_rows:
        gp, bg, warps = _tile(g)
        fp8_encode_kernel[(-(-n_rows // bg),)](
            x, codes, scale, amax, n, n_rows, _signed(keys[0]), _signed(keys[1]),
            G=g, GP=gp, BG=bg, TOP_E=top_e, TOP_FRAC=int((2 * top_m - 1) * 2**23), STOCHASTIC=stochastic,
            IN_BF16=in_bf16, TENSOR=group_size is None, num_warps=warps, **consts, **_LAUNCH,
        )  # fmt: skip
    return codes, scale


def fp8_decode(
    codes: torch.Tensor, scale: torch.Tensor, n: int, dtype: torch.dtype, fmt: str, group_size: int | None
) -> torch.Tensor:
    """The first ``n`` elements (1-D, ``dtype``) of an ``fp8`` payload; ``group_size=None``: one scale.
    No host synchronization."""
    consts = _fp8_constants(fmt)
    out, out_k, out_bf16 = _output(n, dtype, codes.device)
    g = ROW if group_size is None else check_group_size(group_size)
    n_rows = -(-n // g)
    _need("codes", codes, n if group_size is None else n_rows * g)
    _need("scale", scale, 1 if group_size is None and n else n_rows)
    if n_rows:
        gp, bg, warps = _tile(g)
        fp8_decode_kernel[(-(-n_rows // bg),)](
            codes, scale, out_k, n, n_rows,
            G=g, GP=gp, BG=bg, BIG=torch.finfo(dtype).max, OUT_BF16=out_bf16, TENSOR=group_size is None,
            num_warps=warps, **consts, **_LAUNCH,
        )  # fmt: skip
    return out
