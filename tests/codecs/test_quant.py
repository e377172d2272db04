"""The quant codec (per-group integer quantization): error bounds, exact extremes, memory order, unbiased
stochastic rounding, sizes and bit order.

Error bounds are checked elementwise against steps computed here, in float64, from the input itself, so a
codec that inflated its scales could not pass them.
"""

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import actzip.codecs.quant as quant_module
from actzip.codecs.bitpack import unpack_bits
from actzip.codecs.quant import QuantCodec
from actzip.errors import InvalidValueError
from lossy_cases import DTYPES, QUANT_CONFIGS, grouped, log_magnitudes, make_input, shapes, with_layout, work_eps


# -- error bounds -------------------------------------------------------------------------------------------


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
    monkeypatch.setattr(quant_module, "round_bits_like", lambda t, keys: r.view(t.shape))
    g = torch.Generator().manual_seed(0)
    values = (torch.rand(30, generator=g, dtype=torch.float64) * 15).tolist() + [0.0, 15.0, 7.5, 1 / 3, 2.0**-17]
    for dtype in (torch.float32, torch.float64):
        for v0 in values:
            for off in (0, 7):  # minmax, absmax (v in [-Q, Q], offset by Q)
                v = torch.full((1 << 15,), v0, dtype=dtype) - off
                exact = v[0].item() + off
                q = QuantCodec(bits=4)._round(v, off, (0, 0))
                assert abs(q.double().mean().item() - exact) <= 2.0**-16, (dtype, v0, off)


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


def test_minmax_range_overflow_is_refused():
    x = torch.tensor([-3e38, 3e38] * 4, dtype=torch.bfloat16)
    with pytest.raises(InvalidValueError, match=r"max - min overflows"):
        QuantCodec(group_size=8).encode(x)
    unchecked = QuantCodec(group_size=8, check=False)
    assert torch.isnan(unchecked.decode(unchecked.encode(x))).all()
    check_quant_bound(x, QuantCodec(group_size=8, scale="absmax"))


# -- names kept from before the fp8 codec and the random stream had their own modules -------------------------


@pytest.mark.parametrize("name,home", [
    ("FP8Codec", "actzip.codecs.fp8"), ("FP8_FORMATS", "actzip.codecs.fp8"), ("LOSSY_DTYPES", "actzip.core.dtypes"),
    ("stream_keys", "actzip.codecs.counter_rng"), ("round_bits", "actzip.codecs.counter_rng"),
])  # fmt: skip
def test_moved_names_still_import_from_here_with_a_warning(name, home):
    import importlib

    from actzip import compat

    compat.warned.discard(f"actzip.codecs.quant.{name}")
    with pytest.warns(FutureWarning, match=rf"actzip.codecs.quant.{name} is deprecated.*use {home}.{name}"):
        value = getattr(quant_module, name)
    assert value is getattr(importlib.import_module(home), name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert getattr(quant_module, name) is value
    with pytest.raises(AttributeError, match="has no attribute 'FP9Codec'"):
        quant_module.FP9Codec

