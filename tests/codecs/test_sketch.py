"""The sketch codec: unbiased reconstruction, variance as documented, S rebuilt from its seed."""

import math

import pytest
import torch

import actzip.codecs.sketch  # noqa: F401  (registers the codec)
from actzip.codecs.sketch import SketchCodec, derive_seed, sketch_matrix
from actzip.core import registry
from actzip.errors import ConfigError, PayloadError, UnsupportedDtypeError, UnsupportedLayoutError


def variance(x, k, kind):
    """Documented per-element variance of one decode, for each row of x (float64)."""
    x = x.double()
    norm2 = (x * x).sum(-1, keepdim=True)
    return (norm2 + x * x) / k if kind == "gaussian" else (norm2 - x * x) / k


@pytest.mark.parametrize("kind", ["gaussian", "sign"])
def test_unbiased_within_standard_errors(kind):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 16, generator=g, dtype=torch.float64)
    k, n = 4, 3000
    codec = SketchCodec(rank=k, seed=5, kind=kind)
    total = torch.zeros_like(x)
    for _ in range(n):
        total += codec.decode(codec.encode(x))
    mean = total / n
    se = (variance(x, k, kind) / n).sqrt()
    z = (mean - x) / se
    assert z.abs().max() < 4.5  # 48 elements: a 4.5 sigma excursion is very unlikely
    assert z.abs().mean() < 1.2  # |N(0,1)| has mean 0.8


def test_gaussian_variance_matches_formula():
    x = torch.tensor([[3.0, -1.0, 0.5, 0.0, 2.0, 1.0]], dtype=torch.float64)
    k, n = 3, 4000
    codec = SketchCodec(rank=k, seed=9)
    samples = torch.stack([codec.decode(codec.encode(x)) for _ in range(n)])
    var = samples.var(0)
    expected = variance(x, k, "gaussian")
    # sample variance of n draws: relative error ~ sqrt(2/n) * sqrt(kurtosis factor); allow 20%
    assert torch.allclose(var, expected, rtol=0.2)


@pytest.mark.parametrize("shape", [(10,), (4, 10), (2, 3, 10), (2, 0, 10), (5, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_shapes_and_dtypes(shape, dtype):
    x = torch.randn(shape).to(dtype)
    codec = SketchCodec(rank=4)
    p = codec.encode(x)
    assert p.buffers["xs"].shape == (*shape[:-1], 4)
    assert p.buffers["xs"].dtype == dtype
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    assert p.nbytes == math.prod(shape[:-1]) * 4 * dtype.itemsize


def test_matches_explicit_formula_and_noncontiguous_input():
    base = torch.randn(6, 8, 5)
    x = base.transpose(0, 2)  # [5, 8, 6], non-contiguous
    assert not x.is_contiguous()
    codec = SketchCodec(rank=3, seed=2)
    p = codec.encode(x)
    s = sketch_matrix(6, 3, p.meta["seed"], "gaussian", "cpu", torch.float32)
    assert torch.allclose(p.buffers["xs"], x.contiguous() @ s, atol=1e-6)
    assert torch.allclose(codec.decode(p), x.contiguous() @ s @ s.t(), atol=1e-5)


def test_seed_determinism_and_fresh_sketches():
    x = torch.randn(4, 12)
    a, b, c = SketchCodec(rank=3, seed=7), SketchCodec(rank=3, seed=7), SketchCodec(rank=3, seed=8)
    pa1, pa2 = a.encode(x), a.encode(x)
    pb1, pb2 = b.encode(x), b.encode(x)
    assert torch.equal(pa1.buffers["xs"], pb1.buffers["xs"]) and torch.equal(pa2.buffers["xs"], pb2.buffers["xs"])
    assert pa1.meta["seed"] == derive_seed(7, 0) and pa2.meta["seed"] == derive_seed(7, 1)
    assert not torch.equal(pa1.buffers["xs"], pa2.buffers["xs"])  # each encode draws a new S
    assert not torch.equal(c.encode(x).buffers["xs"], pa1.buffers["xs"])
    # decode is a pure function of the payload
    assert torch.equal(a.decode(pa1), c.decode(pa1))


@pytest.mark.parametrize("kind", ["gaussian", "sign"])
def test_sketch_matrix_regenerated_identically(kind):
    s1 = sketch_matrix(32, 5, 123, kind)
    s2 = sketch_matrix(32, 5, 123, kind)
    assert torch.equal(s1, s2) and s1.shape == (32, 5) and s1.dtype == torch.float32
    assert not torch.equal(s1, sketch_matrix(32, 5, 124, kind))
    s64 = sketch_matrix(32, 5, 123, kind, dtype=torch.float64)
    assert torch.equal(s64.float(), s1)  # drawn in float64, then cast
    if kind == "sign":
        assert torch.equal(s64.abs(), torch.full_like(s64, 1 / math.sqrt(5)))


def test_sketch_matrix_second_moment():
    d, k, n = 6, 4, 2000
    acc = torch.zeros(d, d, dtype=torch.float64)
    for seed in range(n):
        s = sketch_matrix(d, k, seed, "gaussian", dtype=torch.float64)
        acc += s @ s.t()
    # each entry of S S^T has variance <= 2/k: 4.5 standard errors
    assert torch.allclose(acc / n, torch.eye(d, dtype=torch.float64), atol=4.5 * math.sqrt(2 / k / n))


def test_global_rng_untouched():
    x = torch.randn(8, 16)
    state = torch.get_rng_state()
    codec = SketchCodec(rank=4, kind="sign")
    codec.decode(codec.encode(x))
    sketch_matrix(16, 4, 0, "gaussian")
    assert torch.equal(torch.get_rng_state(), state)


def test_rank_at_least_d_allowed():
    x = torch.randn(3, 4, dtype=torch.float64)
    codec = SketchCodec(rank=16)
    p = codec.encode(x)
    assert p.buffers["xs"].shape == (3, 16)
    assert codec.decode(p).shape == x.shape


def test_registry_and_flags():
    codec = registry.get("sketch", rank=2, kind="sign", seed=3)
    assert isinstance(codec, SketchCodec)
    assert codec.options() == {"rank": 2, "seed": 3, "kind": "sign"}
    assert not codec.lossless and codec.unbiased
    assert "sketch" in registry.available()


@pytest.mark.parametrize("opts", [{"rank": 0}, {"rank": -1}, {"rank": 2.0}, {"rank": True},
                                  {"rank": 2, "kind": "normal"}, {"rank": 2, "seed": -1}, {"rank": 2, "seed": 1.5}])
def test_bad_options(opts):
    with pytest.raises(ConfigError):
        SketchCodec(**opts)


def test_rank_required():
    with pytest.raises(TypeError):
        SketchCodec()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_non_float_refused(dtype):
    with pytest.raises(UnsupportedDtypeError):
        SketchCodec(rank=2).encode(torch.zeros(3, 4, dtype=dtype))


def test_bad_layouts_and_payloads():
    codec = SketchCodec(rank=2)
    with pytest.raises(UnsupportedLayoutError):
        codec.encode(torch.tensor(1.0))
    with pytest.raises(UnsupportedLayoutError):
        codec.encode(torch.eye(3).to_sparse())
    other = registry.get("quant").encode(torch.randn(16)) if "quant" in registry.available() else None
    if other is not None:
        with pytest.raises(PayloadError):
            codec.decode(other)


@pytest.mark.cuda
def test_cuda_matches_cpu():
    x = torch.randn(4, 24)
    pc = SketchCodec(rank=5, seed=1).encode(x)
    pg = SketchCodec(rank=5, seed=1).encode(x.cuda())
    assert torch.equal(sketch_matrix(24, 5, 3, "sign", "cuda").cpu(), sketch_matrix(24, 5, 3, "sign"))
    assert torch.allclose(pg.buffers["xs"].cpu(), pc.buffers["xs"], atol=1e-5)
