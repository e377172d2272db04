"""The mask codec: random keep with rescale (unbiased) and top-k (largest magnitudes, exact values)."""

import pytest
import torch

import actzip
from actzip.codecs.mask import MaskCodec, kept_count, random_positions
from actzip.errors import (
    ConfigError,
    InvalidValueError,
    PayloadError,
    UnsupportedDtypeError,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def test_registered_with_options_checked():
    assert "mask" in actzip.codecs.available()
    assert isinstance(actzip.codecs.get("mask", keep=0.5, mode="topk"), MaskCodec)
    for bad in ({"keep": 0}, {"keep": 1.5}, {"keep": True}, {"mode": "top"}, {"rescale": 1}, {"seed": -1}):
        with pytest.raises(ConfigError):
            MaskCodec(**bad)
    with pytest.raises(ConfigError, match="options: keep, mode, rescale, seed, check"):
        actzip.codecs.get("mask", ratio=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_keeps_k_elements_scaled_exactly(dtype):
    x = torch.randn(7, 33).to(dtype)
    c = MaskCodec(keep=0.2)
    p = c.encode(x)
    n, k = x.numel(), kept_count(x.numel(), 0.2)
    assert p.buffers["values"].numel() == k and p.nbytes == c.payload_nbytes(n, x.element_size())
    y = c.decode(p)
    pos = random_positions(n, k, int(p.buffers["seed"][0]))
    work = torch.float64 if dtype == torch.float64 else torch.float32
    assert torch.equal(y.reshape(-1)[pos], (x.reshape(-1)[pos].to(work) * (n / k)).to(dtype))
    rest = torch.ones(n, dtype=torch.bool)
    rest[pos] = False
    assert (y.reshape(-1)[rest] == 0).all()


def test_random_is_unbiased():
    x = torch.randn(64)
    c = MaskCodec(keep=0.25, seed=3)
    n = 4000
    mean = sum(c.decode(c.encode(x)) for _ in range(n)) / n
    std = x.abs() * (1 / 0.25 - 1) ** 0.5 / n**0.5  # per element
    assert ((mean - x).abs() < 5 * std + 1e-6).all()
    assert c.unbiased and not MaskCodec(mode="topk").unbiased


def test_each_encode_draws_fresh_positions_reproducibly():
    x = torch.randn(100)
    a, b = MaskCodec(keep=0.1, seed=5), MaskCodec(keep=0.1, seed=5)
    pa = [a.encode(x).buffers["seed"].item() for _ in range(3)]
    assert pa == [b.encode(x).buffers["seed"].item() for _ in range(3)] and len(set(pa)) == 3


@pytest.mark.parametrize("keep,where", [(0.5, "mask"), (0.01, "index")])
def test_topk_keeps_the_largest_exactly(keep, where):
    x = torch.randn(40, 50)
    c = MaskCodec(keep=keep, mode="topk")
    p = c.encode(x)
    assert where in p.buffers and p.nbytes == c.payload_nbytes(x.numel(), 4)
    y = c.decode(p)
    k = kept_count(x.numel(), keep)
    kept = y != 0
    assert int(kept.sum()) == k and torch.equal(y[kept], x[kept])
    assert x[kept].abs().min() >= x[~kept].abs().max()


def test_layouts_come_back():
    x = torch.randn(16, 24).t()
    for c in (MaskCodec(keep=0.3), MaskCodec(keep=0.3, mode="topk")):
        y = c.decode(c.encode(x))
        assert y.shape == x.shape and torch.equal(y != 0, (y != 0) & (x != 0))
    assert torch.equal(MaskCodec(keep=1.0, mode="topk").decode(MaskCodec(keep=1.0, mode="topk").encode(x)), x)


def test_non_finite_refused_or_poisoned():
    x = torch.randn(32)
    x[3] = float("inf")
    with pytest.raises(InvalidValueError, match="1 of 32 elements non-finite"):
        MaskCodec(keep=0.5).encode(x, name="acts")
    c = MaskCodec(keep=0.1, check=False)
    assert torch.isnan(c.decode(c.encode(x))).all()
    ok = torch.randn(32)
    assert not torch.isnan(c.decode(c.encode(ok))).any()


def test_refusals():
    with pytest.raises(UnsupportedDtypeError):
        MaskCodec().encode(torch.arange(10))
    c = MaskCodec(keep=0.5)
    p = c.encode(torch.randn(10))
    p.buffers["values"] = p.buffers["values"][:-1]
    with pytest.raises(PayloadError, match="holds 4 values"):
        c.decode(p)
    with pytest.raises(PayloadError, match="made by codec 'quant'"):
        c.decode(actzip.codecs.get("quant").encode(torch.randn(8)))


@pytest.mark.parametrize("structure", ["channel", "token"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_structured_random_keeps_whole_channels_or_rows_scaled(structure, dtype):
    x = torch.randn(3, 10, 16).to(dtype) + 0.5  # no exact zeros
    c = MaskCodec(keep=0.25, structure=structure, seed=1)
    p = c.encode(x)
    assert p.nbytes == c.payload_nbytes(x.numel(), x.element_size(), channels=16)
    y = c.decode(p).reshape(-1, 16)
    x2 = x.reshape(-1, 16)
    axis = 1 if structure == "channel" else 0
    units = x2.shape[axis]
    k = kept_count(units, 0.25)
    kept = (y != 0).any(dim=1 - axis)
    assert int(kept.sum()) == k  # whole channels (rows) kept, the rest all zero
    sel = (slice(None), kept) if axis == 1 else (kept, slice(None))
    assert torch.equal(y[sel], (x2[sel].float() * (units / k)).to(dtype))
    assert c.unbiased


@pytest.mark.parametrize("structure", ["channel", "token"])
def test_structured_random_is_unbiased(structure):
    x = torch.randn(8, 12)
    c = MaskCodec(keep=0.25, structure=structure, seed=7)
    n = 4000
    mean = sum(c.decode(c.encode(x)) for _ in range(n)) / n
    units = 12 if structure == "channel" else 8
    k = kept_count(units, 0.25)
    std = x.abs() * (units / k - 1) ** 0.5 / n**0.5
    assert ((mean - x).abs() < 5 * std + 1e-6).all()


@pytest.mark.parametrize("structure,where", [("channel", "mask"), ("token", "index")])
def test_structured_topk_keeps_the_largest_norms_exactly(structure, where):
    torch.manual_seed(0)
    x = torch.randn(400, 64) * torch.linspace(0.1, 2, 64)  # channels of different norms
    keep = 0.5 if structure == "channel" else 0.01
    c = MaskCodec(keep=keep, mode="topk", structure=structure)
    p = c.encode(x)
    assert where in p.buffers and p.nbytes == c.payload_nbytes(x.numel(), 4, channels=64)
    y = c.decode(p)
    axis = 1 if structure == "channel" else 0
    kept = (y != 0).any(dim=1 - axis)
    norms = x.square().sum(1 - axis)
    assert norms[kept].min() >= norms[~kept].max()
    sel = (slice(None), kept) if axis == 1 else (kept, slice(None))
    assert torch.equal(y[sel], x[sel])


def test_structured_masks_on_a_wire_spec_and_their_refusals():
    from actzip.wire.codecs import WireCodec

    wire = WireCodec("mask:keep=0.5,structure=token,mode=topk")
    h = torch.randn(2, 6, 8)
    sent = wire.encode({"hidden": h})
    got = wire.decode(sent)["hidden"]
    kept = (got != 0).any(-1).reshape(-1)
    assert wire.describe() and int(kept.sum()) == 6 and torch.equal(got.reshape(-1, 8)[kept], h.reshape(-1, 8)[kept])
    with pytest.raises(ConfigError, match="structure"):
        MaskCodec(structure="row")
    with pytest.raises(ConfigError, match="channels"):
        MaskCodec(structure="channel").payload_nbytes(10, 4)
    with pytest.raises(ConfigError, match="scalar"):
        MaskCodec(structure="token").encode(torch.tensor(1.0))
    c = MaskCodec(keep=0.5, structure="token")
    p = c.encode(torch.randn(4, 6))
    p.buffers["values"] = p.buffers["values"][:1]
    with pytest.raises(PayloadError, match="token"):
        c.decode(p)


@pytest.mark.parametrize("structure", ["element", "channel", "token"])
@pytest.mark.parametrize("mode", ["random", "topk"])
def test_empty_tensors_round_trip(structure, mode):
    c = MaskCodec(keep=0.5, mode=mode, structure=structure)
    x = torch.zeros(0, 8)
    assert c.decode(c.encode(x)).shape == (0, 8)


def test_random_positions_are_distinct_uniform_and_the_same_from_an_int_or_a_tensor_seed():
    n, k, seeds = 64, 16, 2000
    counts = torch.zeros(n)
    for seed in range(seeds):
        pos = random_positions(n, k, seed)
        assert pos.dtype == torch.int64 and pos.numel() == k and bool((pos[1:] > pos[:-1]).all())
        counts[pos] += 1
    assert torch.equal(random_positions(n, k, 7), random_positions(n, k, torch.tensor([7])))
    # each position kept with probability k / n: counts ~ Binomial(seeds, 1/4), sd ~ 19.4; 5 sd either side
    expected = seeds * k / n
    assert float((counts - expected).abs().max()) < 5 * (seeds * (k / n) * (1 - k / n)) ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,keep", [(1000, 0.25), (37, 0.1), (5, 1.0), (3, 0.01)])
def test_topk_random_keeps_the_largest_half_exactly_and_draws_the_rest(dtype, n, keep):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    c = MaskCodec(keep=keep, mode="topk-random", seed=2)
    p = c.encode(x)
    y = c.decode(p)
    k = kept_count(n, keep)
    top = x.float().abs().topk(k // 2).indices
    assert torch.equal(y[top], x[top])  # the largest half comes back bit-exact
    assert int((y != 0).sum()) <= k and p.nbytes == c.payload_nbytes(n, x.element_size())
    drawn = (y != 0) & ~torch.isin(torch.arange(n), top)
    scale = (n - k // 2) / (k - k // 2)
    assert torch.equal(y[drawn], (x[drawn].float() * scale).to(dtype))  # the drawn ones rescaled, nothing else
    if keep == 1.0:
        assert torch.equal(y, x)


def test_topk_random_is_unbiased_with_less_variance_than_random_on_heavy_tails():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, generator=g) * torch.rand(64, generator=g).pow(4) * 10  # a few large, many small
    c, plain = MaskCodec(keep=0.25, mode="topk-random", seed=3), MaskCodec(keep=0.25, seed=3)
    n = 4000
    draws = torch.stack([c.decode(c.encode(x)) for _ in range(n)])
    mean = draws.mean(0)
    k, r = 16, 64 - 8
    std = x.abs() * (r / (k - 8) - 1) ** 0.5 / n**0.5  # per element (0 for the largest eighth)
    assert ((mean - x).abs() < 5 * std + 1e-6).all()
    assert c.unbiased
    spread = lambda codec: sum(float((codec.decode(codec.encode(x)) - x).square().sum()) for _ in range(500))  # noqa: E731
    assert spread(c) < 0.5 * spread(plain)


def test_topk_random_decodes_on_its_own_and_has_no_structure():
    x = torch.randn(300)
    p = MaskCodec(keep=0.2, mode="topk-random", seed=9).encode(x)
    assert torch.equal(MaskCodec(keep=0.2, mode="topk-random").decode(p),
                       MaskCodec(keep=0.2, mode="topk-random", seed=9).decode(p))  # the payload carries its seed
    assert MaskCodec(keep=0.5, mode="topk-random").decode(MaskCodec(keep=0.5, mode="topk-random").encode(
        torch.zeros(0, 8))).shape == (0, 8)
    with pytest.raises(ConfigError, match="topk-random"):
        MaskCodec(keep=0.5, mode="topk-random", structure="token")
