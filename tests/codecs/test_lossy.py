"""What the lossy group codecs (quant, fp8) share (:mod:`actzip.codecs.lossy`): seeded random streams that leave
the global RNG alone, flags, option checks, refused inputs and non-finite groups, the registry, devices."""

import math

import pytest
import torch

import actzip
from actzip.codecs.fp8 import FP8Codec
from actzip.codecs.quant import QuantCodec
from actzip.errors import ConfigError, InvalidValueError, UnsupportedDtypeError, UnsupportedLayoutError


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


def test_empty_and_scalar_tensors():
    for codec in (QuantCodec(), FP8Codec(), FP8Codec(granularity="group")):
        for x in (torch.zeros(0, 3), torch.tensor(3.25)):
            y = codec.decode(codec.encode(x))
            assert y.shape == x.shape and torch.equal(y, x)


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
