"""The lossy codecs: quant (per-group integer quantization) and fp8 (scaled 8-bit floats).

Error bounds are checked elementwise against steps computed here, in float64, from the input itself, so a
codec that inflated its scales could not pass them.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import actzip
import actzip.codecs.quant as quant_module
from actzip.codecs.bitpack import unpack_bits
from actzip.codecs.quant import FP8Codec, QuantCodec
from actzip.codecs.sparse import memory_order
from actzip.errors import ConfigError, InvalidValueError, UnsupportedDtypeError, UnsupportedLayoutError

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
QUANT_CONFIGS = [
    (bits, scale, rounding)
    for bits in (1, 2, 4, 8)
    for scale in ("minmax", "absmax")
    for rounding in ("stochastic", "nearest")
    if not (bits == 1 and scale == "absmax")
]
FP8_MANTISSA = {"e4m3": 3, "e5m2": 2}
FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def work_eps(dtype):
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def grouped(x, group_size):
    """x's elements in memory order as float64 (groups, group_size), padded with the last element."""
    flat = memory_order(x)[0].double()
    pad = -flat.numel() % group_size
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    return flat.view(-1, group_size)


def make_input(shape, dtype, kind, log_mag, g):
    n = math.prod(shape)
    if kind == "normal":
        x = torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "uniform":
        x = torch.rand(n, generator=g, dtype=torch.float64) + 3.0  # all positive, away from zero
    elif kind == "constant":
        x = torch.full((n,), -1.7, dtype=torch.float64)
    elif kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
    else:  # "mixed": runs of constants between random values
        x = torch.randn(n, generator=g, dtype=torch.float64)
        x[: n // 2] = 0.25
    return (x * 10.0**log_mag).to(dtype).reshape(shape)


def with_layout(x, layout):
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    return x


shapes = st.lists(st.integers(1, 37), min_size=0, max_size=3).map(tuple)


def log_magnitudes(dtype):
    # Keep max - min and the scaled steps inside each dtype's range (fp16 tops out at 65504).
    return st.sampled_from([-3, 0, 3] if dtype == torch.float16 else [-30, -3, 0, 3, 30])


# -- quant: error bounds ------------------------------------------------------------------------------------


def check_quant_bound(x, codec):
    """Assert |y - x| <= s (stochastic) or s/2 (nearest) per element, up to documented roundings."""
    p = codec.encode(x)
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    g = codec.group_size
    xg, yg = grouped(x, g), grouped(y, g)
    lo, hi = xg.amin(1, keepdim=True), xg.amax(1, keepdim=True)
    if codec.scale == "minmax":
        step = (hi - lo) / (2**codec.bits - 1)
    else:
        step = torch.maximum(hi.abs(), lo.abs()) / (2 ** (codec.bits - 1) - 1)
    amax = torch.maximum(hi.abs(), lo.abs())
    factor = 1.0 if codec.rounding == "stochastic" else 0.5
    info = torch.finfo(x.dtype)
    out_round = 0.0 if x.dtype in (torch.float32, torch.float64) else info.eps * (xg.abs() + step)
    tol = factor * step + 8 * work_eps(x.dtype) * amax + out_round + info.smallest_normal * info.eps
    err = (yg - xg).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"
    # Constant groups (zeros included) are exact.
    const = (hi == lo).squeeze(1)
    assert torch.equal(yg[const], xg[const])
    return p, y


@given(
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    config=st.sampled_from(QUANT_CONFIGS),
    group_size=st.sampled_from([8, 24, 128]),
    kind=st.sampled_from(["normal", "uniform", "constant", "zeros", "mixed"]),
    layout=st.sampled_from(["contiguous", "transposed"]),
    data=st.data(),
)
@settings(max_examples=300, deadline=None)
def test_quant_error_bound(shape, dtype, config, group_size, kind, layout, data):
    bits, scale, rounding = config
    log_mag = data.draw(log_magnitudes(dtype))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    x = with_layout(make_input(shape, dtype, kind, log_mag, g), layout)
    codec = QuantCodec(bits=bits, group_size=group_size, scale=scale, rounding=rounding)
    _, y = check_quant_bound(x, codec)
    # Same strides wherever they matter (a size-1 dimension's stride is arbitrary).
    assert [st for st, n in zip(y.stride(), y.shape) if n > 1] == [st for st, n in zip(x.stride(), x.shape) if n > 1]


@pytest.mark.parametrize("bits,scale,rounding", QUANT_CONFIGS)
def test_quant_extremes_and_constants_decode_exactly(bits, scale, rounding):
    x = torch.tensor([0.3, -1.25, 2.0, 0.7, 0.0, 1.1, -0.2, 0.9] + [5.5] * 8 + [0.0] * 8)
    y = QuantCodec(bits=bits, group_size=8, scale=scale, rounding=rounding).decode(
        QuantCodec(bits=bits, group_size=8, scale=scale, rounding=rounding).encode(x)
    )
    assert torch.equal(y[8:], x[8:])  # a constant group and a zero group
    if scale == "minmax":
        assert y[1] == -1.25  # the minimum
    else:
        assert y[2] == 2.0 and y[4] == 0.0  # the largest magnitude, and zero


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_absmax_nearest_is_symmetric_and_rounds_ties_to_even(bits):
    q = 2 ** (bits - 1) - 1
    # Steps of 1 (absmax q): x = k + 0.5 is a tie, rounded to the even neighbour on both signs.
    ties = torch.tensor([k + 0.5 for k in range(q)], dtype=torch.float64)
    x = torch.cat([torch.tensor([float(q), -float(q)], dtype=torch.float64), ties, -ties])
    x = torch.cat([x, torch.zeros(-x.numel() % 8, dtype=torch.float64)])
    codec = QuantCodec(bits=bits, group_size=x.numel(), scale="absmax", rounding="nearest")
    p = codec.encode(x)
    codes = unpack_bits(p.buffers["codes"], x.numel(), bits, torch.int64) - q
    assert torch.equal(codes.to(torch.float64), torch.round(x))
    # Decoding multiplies by the float 1/q: the levels come back within an ulp, +-q exactly.
    y = codec.decode(p)
    assert (y - torch.round(x)).abs().max() <= q * torch.finfo(torch.float64).eps and torch.equal(y[:2], x[:2])
    r = torch.randn(4096, generator=torch.Generator().manual_seed(bits))
    codec = QuantCodec(bits=bits, group_size=64, scale="absmax", rounding="nearest")
    assert torch.equal(codec.decode(codec.encode(-r)), -codec.decode(codec.encode(r)))


@pytest.mark.parametrize("dtype,tiny", [(torch.float32, 1e-42), (torch.float64, 1e-310), (torch.float32, 1e-30)])
@pytest.mark.parametrize("bits,scale,rounding", [(4, "minmax", "nearest"), (8, "absmax", "stochastic")])
def test_quant_tiny_magnitudes(dtype, tiny, bits, scale, rounding):
    x = torch.randn(64, generator=torch.Generator().manual_seed(1), dtype=torch.float64).mul(tiny).to(dtype)
    check_quant_bound(x, QuantCodec(bits=bits, group_size=32, scale=scale, rounding=rounding))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", ["minmax", "absmax"])
def test_quant_huge_magnitudes(dtype, scale):
    x = (torch.randn(64, generator=torch.Generator().manual_seed(2)) * 1e37).to(dtype)
    x[0] = 1.5e38
    check_quant_bound(x, QuantCodec(bits=4, group_size=64, scale=scale))


def test_quant_groups_follow_memory_order():
    # In memory each group of 8 is constant; in row-major order each would mix 1, 2 and 7.
    base = torch.tensor([[1.0] * 8, [2.0] * 8, [7.0] * 8])
    x = base.t()
    codec = QuantCodec(bits=1, group_size=8, rounding="nearest")
    y = codec.decode(codec.encode(x))
    assert torch.equal(y, x) and y.stride() == x.stride()


def test_quant_non_dense_layout_comes_back_contiguous():
    x = torch.randn(10, 20)[:, ::3]
    codec = QuantCodec(bits=8, group_size=8)
    y = codec.decode(codec.encode(x))
    assert y.is_contiguous()
    check_quant_bound(x, codec)


def test_quant_sliced_view_comes_back_in_its_order_of_strides():
    # q cut from a fused projection, heads moved forward, as attention gets it: [B, H, T, hd] strided as
    # [B, T, H, hd] with gaps. It comes back dense in that same order, so attention's backward copies nothing.
    qkv = torch.randn(2, 5, 3 * 4 * 8).view(2, 5, 3, 4, 8)
    q = qkv[:, :, 0].transpose(1, 2)
    codec = QuantCodec(bits=8, group_size=8)
    y = codec.decode(codec.encode(q))
    assert y.shape == q.shape and y.transpose(1, 2).is_contiguous()
    check_quant_bound(q, codec)


# -- unbiasedness -------------------------------------------------------------------------------------------

REPEATS = 40_000  # the mean's standard error is at most 1/(2*sqrt(R)) = 0.0025 steps


def mean_error_in_steps(codec, group):
    """Encode a tensor that repeats ``group`` REPEATS times and return max |mean decode - x| / step."""
    x = group.repeat(REPEATS)
    y = codec.decode(codec.encode(x)).double().view(REPEATS, -1).mean(0)
    g = group.double()
    if codec.scale == "minmax":
        step = (g.max() - g.min()) / (2**codec.bits - 1)
    else:
        step = g.abs().max() / (2 ** (codec.bits - 1) - 1)
    return ((y - g).abs() / step).max().item()


@pytest.mark.parametrize("bits,scale", [(1, "minmax"), (2, "absmax"), (4, "minmax"), (8, "absmax")])
def test_quant_stochastic_rounding_is_unbiased(bits, scale):
    group = torch.rand(64, generator=torch.Generator().manual_seed(bits)) * 2 - 1
    err = mean_error_in_steps(QuantCodec(bits=bits, group_size=64, scale=scale, seed=3), group)
    # A decode's deviation is a Bernoulli in steps: standard deviation <= 1/2, of the mean <= 1/(2*sqrt(R)).
    assert err <= 5 * 0.5 / math.sqrt(REPEATS)


def test_nearest_rounding_fails_the_same_check():
    # Every value sits 0.3 steps above a level (0..15 steps over [0, 1.5]): nearest rounding is off by 0.3 steps.
    group = torch.tensor([0.0, 1.5] + [(k + 0.3) * 0.1 for k in range(14)])
    err = mean_error_in_steps(QuantCodec(bits=4, group_size=16, rounding="nearest"), group)
    assert err > 0.29 > 5 * 0.5 / math.sqrt(REPEATS)
    err = mean_error_in_steps(QuantCodec(bits=4, group_size=16, rounding="stochastic"), group)
    assert err <= 5 * 0.5 / math.sqrt(REPEATS)


def test_stochastic_rounding_bias_is_at_most_2_to_the_minus_16(monkeypatch):
    # With each 15-bit random integer once, the mean rounding of v is exact up to the fraction's resolution.
    r = torch.arange(1 << 15, dtype=torch.int64)
    monkeypatch.setattr(quant_module, "_round_bits_like", lambda t, keys: r.view(t.shape))
    g = torch.Generator().manual_seed(0)
    values = (torch.rand(30, generator=g, dtype=torch.float64) * 15).tolist() + [0.0, 15.0, 7.5, 1 / 3, 2.0**-17]
    for dtype in (torch.float32, torch.float64):
        for v0 in values:
            for off in (0, 7):  # minmax, absmax (v in [-Q, Q], offset by Q)
                v = torch.full((1 << 15,), v0, dtype=dtype) - off
                exact = v[0].item() + off
                q = QuantCodec(bits=4)._round(v, off, (0, 0))
                assert abs(q.double().mean().item() - exact) <= 2.0**-16, (dtype, v0, off)
    for fmt in ("e4m3", "e5m2"):
        f8 = FP8_DTYPE[fmt]
        mag = torch.rand(40, generator=g) * torch.finfo(f8).max
        mag = torch.cat([mag, mag * 2.0**-20, torch.tensor([0.0, torch.finfo(f8).max])])
        for m in mag.tolist():
            t = torch.full((1 << 15,), m)
            up = FP8Codec._stochastic(t, f8, r).view(f8).double().mean().item()
            lower = t[:1].to(f8).view(torch.uint8)
            lower = lower - (lower.view(f8).float() > t[:1]).to(torch.uint8)
            lo_v, hi_v = lower.view(f8).double().item(), (lower + 1).view(f8).double().item()
            gap = hi_v - lo_v if m > lo_v else 1.0
            assert abs(up - m) <= 2.0**-16 * gap * (1 + 1e-6), (fmt, m)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_stochastic_rounding_is_unbiased_and_nearest_is_not(fmt):
    # Scale 1 (the group's absmax is the format's max); the other values lie in the top binade, where
    # neighbouring fp8 values are `gap` apart, 0.1 to 0.9 of a gap above one of them.
    fmax = torch.finfo(FP8_DTYPE[fmt]).max
    gap = 2.0 ** (math.floor(math.log2(fmax)) - FP8_MANTISSA[fmt])
    base = 2.0 ** math.floor(math.log2(fmax))
    group = torch.tensor([fmax] + [base + gap * (k % 3 + (0.1, 0.3, 0.7, 0.9)[k % 4]) for k in range(15)])
    x = group.repeat(REPEATS)

    def mean_error(rounding):
        codec = FP8Codec(format=fmt, granularity="group", group_size=16, rounding=rounding, seed=5)
        p = codec.encode(x)
        assert torch.equal(p.buffers["scale"], torch.ones(REPEATS))
        y = codec.decode(p).double().view(REPEATS, -1).mean(0)
        return ((y - group.double()).abs() / gap).max().item()

    assert mean_error("stochastic") <= 5 * 0.5 / math.sqrt(REPEATS)
    assert mean_error("nearest") == pytest.approx(0.3)


# -- determinism and the global RNG -------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda s: QuantCodec(seed=s), lambda s: FP8Codec(rounding="stochastic", seed=s)])
def test_same_seed_same_payload_and_global_rng_untouched(make):
    x = torch.randn(1000)
    state = torch.get_rng_state()
    a, b = make(7), make(7)
    pa, pb = a.encode(x), b.encode(x)
    for k in pa.buffers:
        assert torch.equal(pa.buffers[k], pb.buffers[k])
    assert not torch.equal(a.encode(x).buffers["codes"], pa.buffers["codes"])  # the generator advanced
    assert torch.equal(make(None).encode(x).buffers["codes"], make(0).encode(x).buffers["codes"])
    assert not torch.equal(make(8).encode(x).buffers["codes"], pa.buffers["codes"])
    assert torch.equal(torch.get_rng_state(), state)


def test_flags():
    assert QuantCodec().unbiased and not QuantCodec(rounding="nearest").unbiased
    assert FP8Codec(rounding="stochastic").unbiased and not FP8Codec().unbiased
    assert not QuantCodec.lossless and not FP8Codec.lossless
    assert QuantCodec().supports(torch.ones(2, dtype=torch.bfloat16)) is None


# -- payload format and sizes -------------------------------------------------------------------------------


def test_quant_4bit_bf16_size():
    x = torch.randn(1 << 20).bfloat16()
    p = QuantCodec(bits=4, group_size=128).encode(x)
    # n * bits / 8 bytes of codes + (n / group_size) groups * (4 bytes lo + 4 bytes span).
    assert p.nbytes == (1 << 20) * 4 // 8 + (1 << 20) // 128 * 8 == 589_824
    assert p.dense_nbytes == 2 * (1 << 20)
    assert p.ratio >= 3.5


@pytest.mark.parametrize("bits,scale,rounding", QUANT_CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_quant_size_formula(bits, scale, rounding, dtype):
    n, g = 1000, 64
    groups = -(-n // g)  # 16, the last padded
    p = QuantCodec(bits=bits, group_size=g, scale=scale, rounding=rounding).encode(torch.randn(n).to(dtype))
    param_bytes = 8 if dtype == torch.float64 else 4
    params = 2 if scale == "minmax" else 1
    assert p.buffers["codes"].dtype == torch.uint8 and p.buffers["codes"].numel() == groups * g * bits // 8
    assert p.nbytes == groups * g * bits // 8 + groups * params * param_bytes


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quant_code_bit_order_is_little_endian(bits):
    top = 2**bits - 1
    codes = [0, top] + [(5 * k) % (top + 1) for k in range(14)]
    x = torch.tensor([c / top for c in codes])  # min 0, max 1: the codes are the values times top
    p = QuantCodec(bits=bits, group_size=16, rounding="nearest").encode(x)
    packed = [sum(codes[i + j] << (bits * j) for j in range(8 // bits)) for i in range(0, 16, 8 // bits)]
    assert p.buffers["codes"].tolist() == packed


@pytest.mark.parametrize("granularity,scales", [("tensor", 1), ("group", 16)])
def test_fp8_size(granularity, scales):
    p = FP8Codec(granularity=granularity, group_size=64).encode(torch.randn(1000).bfloat16())
    codes = 1000 if granularity == "tensor" else 16 * 64  # one byte per element, padding to whole groups
    assert p.nbytes == codes + 4 * scales and p.buffers["scale"].numel() == scales


def test_empty_and_scalar_tensors():
    for codec in (QuantCodec(), FP8Codec(), FP8Codec(granularity="group")):
        for x in (torch.zeros(0, 3), torch.tensor(3.25)):
            y = codec.decode(codec.encode(x))
            assert y.shape == x.shape and torch.equal(y, x)


# -- fp8 ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["tensor", "group"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize(
    "dtype,power",
    [(torch.float32, -20), (torch.float32, 13), (torch.bfloat16, 0), (torch.float16, 0), (torch.float64, 100)],
)
def test_fp8_representable_input_round_trips_exactly(fmt, granularity, rounding, dtype, power):
    f8 = FP8_DTYPE[fmt]
    raw = torch.arange(256, dtype=torch.int64).to(torch.uint8).view(f8)
    values = raw.to(torch.float64)
    values = values[torch.isfinite(values)]  # every finite fp8 value, both signs
    x = (values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(0))] * 2.0**power).to(dtype)
    codec = FP8Codec(format=fmt, granularity=granularity, group_size=32, rounding=rounding)
    y = codec.decode(codec.encode(x))
    assert torch.equal(y, x)


@given(
    shape=shapes,
    dtype=st.sampled_from(DTYPES),
    fmt=st.sampled_from(["e4m3", "e5m2"]),
    granularity=st.sampled_from(["tensor", "group"]),
    rounding=st.sampled_from(["nearest", "stochastic"]),
    kind=st.sampled_from(["normal", "uniform", "constant", "zeros", "mixed"]),
    data=st.data(),
)
@settings(max_examples=200, deadline=None)
def test_fp8_error_bound(shape, dtype, fmt, granularity, rounding, kind, data):
    log_mag = data.draw(log_magnitudes(dtype))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    x = make_input(shape, dtype, kind, log_mag, g)
    codec = FP8Codec(format=fmt, granularity=granularity, group_size=32, rounding=rounding)
    p = codec.encode(x)
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype
    gs = p.meta["group_size"]
    xg, yg = grouped(x, gs), grouped(y, gs)
    amax = xg.abs().amax(1, keepdim=True)
    scale = p.buffers["scale"].double().unsqueeze(1)
    f8 = FP8_DTYPE[fmt]
    fmax = torch.finfo(f8).max
    # The scale is a power of two that brings absmax into (fmax/2, fmax] (1 for an all-zero group).
    assert torch.equal(torch.frexp(scale)[0], torch.full_like(scale, 0.5))
    nz = amax > 0
    assert (amax / scale <= fmax).all() and (amax[nz] / scale[nz] > fmax / 2).all()
    assert (scale[~nz] == 1).all()
    m = FP8_MANTISSA[fmt]
    ulps = 1.0 if rounding == "stochastic" else 0.5
    sub = torch.finfo(f8).smallest_normal * 2.0**-m * scale  # the fp8 subnormal spacing, scaled
    info = torch.finfo(dtype)
    out_round = info.eps * xg.abs() + info.smallest_normal * info.eps
    err = (yg - xg).abs()
    assert (err <= ulps * (2.0**-m * xg.abs() + sub) + out_round).all()  # per element
    assert (err <= ulps * 2.0**-m * amax + out_round).all()  # relative to the group's absmax


def test_fp8_does_not_overflow_the_dtype():
    # The absmax may round up to the next power of two; the result is clamped to the dtype's largest value.
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        big = torch.finfo(dtype).max
        x = torch.tensor([big, -big, 1.0], dtype=dtype)
        y = FP8Codec().decode(FP8Codec().encode(x))
        assert torch.isfinite(y).all() and y[0] == big and y[1] == -big


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("quant", {"bits": 3}, r"quant: option bits must be one of 1, 2, 4, 8, got 3"),
        ("quant", {"bits": 4.0}, r"bits must be one of 1, 2, 4, 8, got 4.0"),
        ("quant", {"bits": True}, r"bits must be one of"),
        ("quant", {"scale": "rms"}, r"scale must be one of 'minmax', 'absmax'"),
        ("quant", {"rounding": "up"}, r"rounding must be one of 'stochastic', 'nearest'"),
        ("quant", {"bits": 1, "scale": "absmax"}, r"scale='absmax' needs bits >= 2.*no code for zero"),
        ("quant", {"group_size": 12}, r"group_size must be a positive multiple of 8, got 12"),
        ("quant", {"group_size": 0}, r"group_size"),
        ("quant", {"group_size": 8.0}, r"group_size"),
        ("quant", {"seed": -1}, r"seed must be None or a non-negative int"),
        ("fp8", {"format": "e3m4"}, r"fp8: option format must be one of 'e4m3', 'e5m2', got 'e3m4'"),
        ("fp8", {"granularity": "row"}, r"granularity must be one of 'tensor', 'group'"),
        ("fp8", {"rounding": "down"}, r"rounding must be one of"),
        ("fp8", {"group_size": 100}, r"group_size"),
        ("fp8", {"bits": 8}, r"no option\(s\) bits.*format, granularity, group_size, rounding, seed, check"),
    ],
)
def test_bad_options(name, options, match):
    with pytest.raises(ConfigError, match=match):
        actzip.codecs.get(name, **options)


@pytest.mark.parametrize("codec", [QuantCodec(), FP8Codec()])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.float8_e4m3fn, torch.complex64])
def test_unsupported_dtype(codec, dtype):
    supported = r"grads has dtype .*supported: float32, float16, bfloat16, float64"
    with pytest.raises(UnsupportedDtypeError, match=supported):
        codec.encode(torch.zeros(4, dtype=dtype), name="grads")


@pytest.mark.parametrize("codec", [QuantCodec(), FP8Codec()])
def test_sparse_layout_is_refused(codec):
    with pytest.raises(UnsupportedLayoutError, match="to_dense"):
        codec.encode(torch.eye(4).to_sparse(), name="x")


@pytest.mark.parametrize(
    "make", [QuantCodec, lambda **o: QuantCodec(scale="absmax", **o), lambda **o: FP8Codec(granularity="group", **o)]
)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_non_finite_is_refused_or_becomes_nan_groups(make, bad):
    x = torch.randn(40, dtype=torch.float32)
    x[[3, 17]] = bad
    with pytest.raises(InvalidValueError, match=r"acts has 2 of 40 elements non-finite \(inf or NaN\)"):
        make(group_size=8).encode(x, name="acts")
    unchecked = make(group_size=8, check=False)
    y = unchecked.decode(unchecked.encode(x))
    nan_groups = torch.tensor([True, False, True, False, False]).repeat_interleave(8)
    assert torch.isnan(y[nan_groups]).all()  # whole groups, not finite garbage
    assert torch.isfinite(y[~nan_groups]).all()


def test_fp8_tensor_granularity_non_finite_unchecked_is_all_nan():
    x = torch.randn(10)
    x[4] = math.inf
    codec = FP8Codec(check=False)
    assert torch.isnan(codec.decode(codec.encode(x))).all()


def test_minmax_range_overflow_is_refused():
    x = torch.tensor([-3e38, 3e38] * 4, dtype=torch.bfloat16)
    with pytest.raises(InvalidValueError, match=r"max - min overflows"):
        QuantCodec(group_size=8).encode(x)
    unchecked = QuantCodec(group_size=8, check=False)
    assert torch.isnan(unchecked.decode(unchecked.encode(x))).all()
    check_quant_bound(x, QuantCodec(group_size=8, scale="absmax"))


# -- registry -----------------------------------------------------------------------------------------------


def test_registry():
    q = actzip.codecs.get("quant", bits=2)
    assert isinstance(q, QuantCodec) and q.bits == 2 and q.name == "quant"
    f = actzip.codecs.get("fp8", format="e5m2")
    assert isinstance(f, FP8Codec) and f.format == "e5m2" and f.name == "fp8"
    assert {"quant", "fp8"} <= set(actzip.codecs.available())
    assert repr(q).startswith("QuantCodec(bits=2, group_size=128, scale='minmax', rounding='stochastic'")
    x = torch.randn(300)
    for codec in (q, f):
        assert codec.decode(codec.encode(x)).shape == x.shape


def test_requires_grad_input_is_encoded_detached():
    x = torch.randn(50, requires_grad=True)
    for codec in (QuantCodec(), FP8Codec()):
        p = codec.encode(x)
        assert not any(b.requires_grad for b in p.buffers.values())
        assert not codec.decode(p).requires_grad


@pytest.mark.cuda
@pytest.mark.parametrize("make", [lambda: QuantCodec(bits=4, group_size=64), lambda: FP8Codec(rounding="stochastic")])
def test_cuda_round_trip(make):
    x = torch.randn(33, 65, generator=torch.Generator().manual_seed(1))
    codec = make()
    state = torch.cuda.get_rng_state()
    p = codec.encode(x.cuda())
    assert all(b.is_cuda for b in p.buffers.values())
    y = codec.decode(p)
    assert y.is_cuda and y.shape == x.shape
    assert torch.equal(torch.cuda.get_rng_state(), state)
    assert torch.equal(make().encode(x.cuda()).buffers["codes"], p.buffers["codes"])  # same seed, same draw
    assert (y.cpu() - x).abs().max() <= 0.25 * x.abs().max()
