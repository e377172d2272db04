"""The cast codec (a 16-bit float on the wire): its error bound over the whole range, sizes, the float16 overflow
check, and the grammar the wire uses."""

import pytest
import torch

import actzip.codecs
from actzip.codecs.cast import CAST_DTYPES, CastCodec, unit_roundoff
from actzip.errors import ConfigError, InvalidValueError, PayloadError
from actzip.wire import WireCodec


def _log_uniform(n: int, lo: int, hi: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    """Signed values whose binary exponents are uniform in [lo, hi): every binade of the range is tried."""
    g = torch.Generator().manual_seed(seed)
    exp = torch.randint(lo, hi, (n,), generator=g).to(torch.float64)
    mant = 1 + torch.rand(n, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return (sign * mant * torch.exp2(exp)).to(dtype)


@pytest.mark.parametrize("name", sorted(CAST_DTYPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_relative_error_is_at_most_the_unit_roundoff_in_the_normal_range(name, dtype):
    target = CAST_DTYPES[name]
    fin = torch.finfo(target)
    lo = int(torch.log2(torch.tensor(fin.smallest_normal)))
    hi = 15 if target is torch.float16 else 127
    x = _log_uniform(200_000, lo, hi, seed=3, dtype=dtype)
    codec = CastCodec(dtype=name)
    y = codec.decode(codec.encode(x))
    assert y.dtype == dtype and y.shape == x.shape
    rel = ((y.double() - x.double()).abs() / x.double().abs()).max().item()
    u = unit_roundoff(target)
    assert rel <= u
    assert rel > 0.9 * u  # the bound is tight: some value lands near half a step from both neighbours


@pytest.mark.parametrize("name", sorted(CAST_DTYPES))
def test_below_the_normal_range_the_error_is_at_most_half_the_smallest_step(name):
    target = CAST_DTYPES[name]
    fin = torch.finfo(target)
    lo = int(torch.log2(torch.tensor(fin.smallest_normal)))
    x = _log_uniform(50_000, lo - 12, lo, seed=4)
    codec = CastCodec(dtype=name)
    err = (codec.decode(codec.encode(x)).double() - x.double()).abs().max().item()
    step = fin.smallest_normal * fin.eps  # the gap between subnormals
    assert err <= step / 2 * (1 + 1e-12)


def test_values_of_the_target_dtype_round_trip_bit_exactly_and_nan_stays_nan():
    x = torch.randn(1000).bfloat16().float()
    x[7] = float("nan")
    x[8] = float("-inf")
    codec = CastCodec()
    y = codec.decode(codec.encode(x))
    assert torch.equal(y[~x.isnan()], x[~x.isnan()]) and y[7].isnan()


def test_a_payload_is_two_bytes_per_element_and_keeps_shape_and_device():
    x = torch.randn(3, 5, 7).transpose(0, 2)
    p = CastCodec(dtype="float16").encode(x)
    assert p.nbytes == 2 * x.numel() and p.dense_nbytes == 4 * x.numel()
    assert p.codec == "cast" and p.shape == x.shape
    y = CastCodec(dtype="float16").decode(p)
    assert y.shape == x.shape and torch.equal(y, x.half().float())


def test_a_float16_overflow_is_refused_with_the_tensor_named_unless_unchecked():
    x = torch.tensor([1.0, 70000.0, -1e6, 2.0])
    with pytest.raises(InvalidValueError, match=r"acts has 2 of 4 elements beyond float16"):
        CastCodec(dtype="float16").encode(x, name="acts")
    y = CastCodec(dtype="float16", check=False).decode(CastCodec(dtype="float16", check=False).encode(x))
    assert y[1] == float("inf") and y[2] == float("-inf") and y[0] == 1.0
    big = torch.tensor([3e38])  # bfloat16 has float32's range
    assert torch.isfinite(CastCodec().decode(CastCodec().encode(big))).all()


def test_bad_options_and_inputs_are_clear_errors():
    with pytest.raises(ConfigError, match="option dtype must be one of 'bfloat16', 'float16'"):
        CastCodec(dtype="fp8")
    with pytest.raises(ConfigError, match="option check"):
        CastCodec(check=1)
    with pytest.raises(TypeError, match="cast"):
        CastCodec().encode(torch.ones(3, dtype=torch.bfloat16), name="h")
    with pytest.raises(PayloadError, match="cast"):
        CastCodec().decode(actzip.codecs.get("passthrough").encode(torch.ones(2)))


def test_the_spec_grammar_and_the_wire_reach_it():
    codec = actzip.codecs.get("cast:dtype=float16")
    assert isinstance(codec, CastCodec) and codec.options() == {"dtype": "float16", "check": True}
    x = torch.randn(64, 48)
    wire = WireCodec("cast:dtype=bfloat16", direction="fwd")
    assert torch.equal(wire.decode(wire.encode({"h": x}))["h"], x.bfloat16().float())
