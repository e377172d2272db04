"""The fp8 codec (scaled 8-bit floats): exact power-of-two scales, representable values round trip, error
bounds, unbiased stochastic rounding, sizes."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actzip.codecs.fp8 import FP8Codec
from lossy_cases import DTYPES, FP8_DTYPE, FP8_MANTISSA, grouped, log_magnitudes, make_input, shapes

REPEATS = 40_000  # the mean's standard error is at most 1/(2*sqrt(R)) = 0.0025 steps


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


def test_fp8_stochastic_rounding_bias_is_at_most_2_to_the_minus_16():
    # With each 15-bit random integer once, the mean rounding is exact up to the fraction's resolution.
    r = torch.arange(1 << 15, dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    torch.rand(30, generator=g, dtype=torch.float64)  # as many draws as the quant codec's check takes first
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


@pytest.mark.parametrize("granularity,scales", [("tensor", 1), ("group", 16)])
def test_fp8_size(granularity, scales):
    p = FP8Codec(granularity=granularity, group_size=64).encode(torch.randn(1000).bfloat16())
    codes = 1000 if granularity == "tensor" else 16 * 64  # one byte per element, padding to whole groups
    assert p.nbytes == codes + 4 * scales and p.buffers["scale"].numel() == scales


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


def test_fp8_tensor_granularity_non_finite_unchecked_is_all_nan():
    x = torch.randn(10)
    x[4] = math.inf
    codec = FP8Codec(check=False)
    assert torch.isnan(codec.decode(codec.encode(x))).all()
