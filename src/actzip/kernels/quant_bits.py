"""Bit-level device helpers of the quant and fp8 kernels (:mod:`actzip.kernels.quant`, :mod:`actzip.kernels.fp8`):
the random stream's hash and the fp8 conversions. Each mirrors, in integer operations or exact float32 ones,
what :mod:`actzip.codecs.counter_rng` and :mod:`actzip.codecs.fp8` compute with PyTorch, so a GPU, the CPU
interpreter and PyTorch agree bit for bit.
"""

from __future__ import annotations

from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e


HASH_M1, HASH_M2 = 0x21F0AAAD, 0x735A2D97  # the multipliers of mix32 (the codec's mix32 uses the same)
# fp8 formats: mantissa bits, exponent bias, largest finite value.
FP8_LAYOUT = {"e4m3": (3, 7, 448.0), "e5m2": (2, 15, 57344.0)}


@triton.jit
def mix32(h):
    """mix32 of actzip.codecs.counter_rng, on uint32 (multiplication wraps modulo 2**32); mix32(0) == 0."""
    h = h ^ (h >> 16)
    h = h * 0x21F0AAAD
    h = h ^ (h >> 15)
    h = h * 0x735A2D97
    h = h ^ (h >> 15)
    return h


@triton.jit
def pair_bits(c, k1):
    """pair_hash of actzip.codecs.counter_rng on the uint32 counter ``c`` (already offset by the first key): six
    instructions per pair once the compiler folds the counter's offsets into the first product."""
    h = c * 0x21F0AAAD
    h = h ^ (h >> 15) ^ k1
    h = h * 0x735A2D97
    return h ^ (h >> 15)


@triton.jit
def fp8_value(c, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """float32 value of fp8 codes ``c`` (int32 in [0, 255], sign bit included).

    The magnitude bits go where float32 keeps its own, which reads subnormal codes as float32 subnormals at the
    same scale; one multiplication by a power of two then gives the value exactly. The sign bit is moved, not
    negated, so code 0x80 is -0.0 on every backend.
    """
    m7 = c & 0x7F
    v = ((m7 << (23 - MBITS)) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True) * (2.0 ** (127 - BIAS))
    if MBITS == 3:  # e4m3fn: no inf, one NaN pattern
        v = tl.where(m7 == 0x7F, float("nan"), v)
    else:  # e5m2: IEEE-like specials
        v = tl.where(m7 >= 0x7C, tl.where(m7 == 0x7C, v * float("inf"), float("nan")), v)
    return v


@triton.jit
def fp8_round(mb, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """fp8 codes of float32 magnitudes given by their bits ``mb`` (int32, sign clear, at most the fp8 max),
    rounded to nearest even as PyTorch's conversion rounds."""
    normal = (mb - ((127 - BIAS) << 23) + ((1 << (22 - MBITS)) - 1) + ((mb >> (23 - MBITS)) & 1)) >> (23 - MBITS)
    # Below the smallest normal: a float32 whose ulp is the smallest subnormal rounds (half to even) for us.
    magic = 2.0 ** (24 - BIAS - MBITS)
    sub = (mb.to(tl.float32, bitcast=True) + magic).to(tl.int32, bitcast=True) - ((151 - BIAS - MBITS) << 23)
    return tl.where(mb >= (128 - BIAS) << 23, normal, sub)


@triton.jit
def fp8_round_stochastic(mb, r, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """fp8 codes of float32 magnitudes ``mb`` (as for fp8_round) rounded down, then up iff
    ``(r + 1/2) / 2**15 < frac``, ``r`` the 15-bit random integers, ``frac`` the exact fraction of the way to
    the next fp8 value: FP8Codec._stochastic, in integers.

    The magnitude is ``m24 / 2**s`` fp8 units of its binade (``m24`` the significand, ``s`` fixed for normal
    fp8 values, growing below): the code is ``base + (m24 >> s)`` and ``frac = rem / 2**s``, ``rem`` the bits
    shifted out. Then ``(2r + 1) / 2**16 < rem / 2**s`` iff ``2r + 1 <= (rem - 1) >> (s - 16)``: exact, no
    float, no division (``s >= 20``; a shift clamped to 31 still gives the right answer).
    """
    e = mb >> 23
    m24 = (mb & 0x7FFFFF) | tl.where(e > 0, 0x800000, 0)
    s = (151 - BIAS - MBITS) - tl.minimum(tl.maximum(e, 1), 128 - BIAS)
    base = tl.maximum(e - (128 - BIAS), 0) << MBITS
    sc = tl.minimum(s, 31)
    rem = m24 & ((1 << sc) - 1)
    up = (2 * r + 1) <= ((rem - 1) >> tl.minimum(s - 16, 31))
    return base + (m24 >> sc) + tl.where(up, 1, 0)


@triton.jit
def fp8_scale(am, TOP_E: tl.constexpr, TOP_FRAC: tl.constexpr):
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
