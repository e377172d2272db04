"""The ``dct`` codec (SL-FAC): its transform against scipy's, the bit allocation, and its stated guarantee
(unbiased on the bands it sends, the dropped bands' energy reported) checked statistically."""

import math

import pytest
import torch

import actzip
from actzip.codecs.dct import BAND_BITS, allocate_bits, dct, frequency_order, idct
from actzip.errors import ConfigError


@pytest.mark.parametrize("n", [1, 2, 7, 8, 37, 64])
def test_dct_is_scipys_orthonormal_dct2_and_idct_inverts_it(n):
    scipy_fft = pytest.importorskip("scipy.fft")
    x = torch.randn(3, 5, n, dtype=torch.float64)
    want = torch.from_numpy(scipy_fft.dct(x.numpy(), type=2, norm="ortho", axis=-1))
    assert torch.allclose(dct(x), want, atol=1e-12)
    assert torch.allclose(idct(dct(x)), x, atol=1e-12)


def test_bits_go_to_energy_within_the_budget():
    energy, widths = [100.0, 10.0, 1.0, 0.01], [8, 8, 8, 8]
    for avg in (0.25, 1.0, 2.0, 5.0):
        got = allocate_bits(energy, widths, avg)
        assert all(b in BAND_BITS for b in got)
        assert sum(b * w for b, w in zip(got, widths)) <= avg * sum(widths)
        assert got == sorted(got, reverse=True)  # more energy, never fewer bits
    assert allocate_bits(energy, widths, 8.0) == [8, 8, 8, 8]


def _smooth(rows=48, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, n)
    f = torch.rand(rows, 1, generator=g) * 4 + 1
    return torch.sin(2 * math.pi * f * t) + 0.05 * torch.randn(rows, n, generator=g)


def _projection(x, payload):
    c = dct(x.double())
    for a, b, k in zip(payload.meta["edges"], payload.meta["edges"][1:], payload.meta["band_bits"]):
        if k == 0:
            c[..., a:b] = 0
    return idct(c)


def test_unbiased_on_the_sent_bands_and_the_dropped_energy_is_the_expectations_error():
    x = _smooth()
    draws = 200
    mean, single = torch.zeros_like(x, dtype=torch.float64), None
    for seed in range(draws):
        codec = actzip.codecs.get("dct", bits=1.0, bands=8, seed=seed)
        p = codec.encode(x)
        y = codec.decode(p).double()
        single = y if single is None else single
        mean += y / draws
    proj = _projection(x, p)
    assert 0 in p.meta["band_bits"] and any(p.meta["band_bits"])  # some bands sent, some dropped
    one = (single - proj).norm()
    assert (mean - proj).norm() < 3 * one / math.sqrt(draws)  # the noise averages out around the projection
    assert math.isclose(p.meta["dropped_energy"], float((x.double() - proj).square().sum()), rel_tol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_round_trip_keeps_shape_dtype_and_layout_along_any_axis(dtype, axis):
    x = _smooth(16, 32).reshape(4, 4, 32).to(dtype)
    codec = actzip.codecs.get("dct", bits=8, bands=4, axis=axis, rounding="nearest")
    y = codec.decode(codec.encode(x))
    assert y.shape == x.shape and y.dtype == x.dtype
    err = (y.double() - x.double()).norm() / x.double().norm()
    assert err < (0.02 if dtype != torch.bfloat16 else 0.03)


def test_fewer_bits_fewer_bytes_and_the_grammar_builds_it():
    x = _smooth(64, 128)
    sizes = [actzip.codecs.get("dct", bits=b, bands=8).encode(x).nbytes for b in (0.5, 1, 2, 4)]
    assert sizes == sorted(sizes) and sizes[0] < x.numel() * 4 / 16
    assert actzip.codecs.get("dct", bits=2, bands=4).options()["bits"] == 2.0


def test_bad_options_and_input_are_refused():
    for bad in ({"bits": 0}, {"bits": 9}, {"bits": True}, {"bands": 0}, {"axis": 1.5}, {"rounding": "up"}):
        with pytest.raises(ConfigError):
            actzip.codecs.get("dct", **bad)
    codec = actzip.codecs.get("dct", bands=8)
    with pytest.raises(ConfigError, match="fewer than bands"):
        codec.encode(torch.randn(4, 5))
    with pytest.raises(ConfigError, match="axis"):
        actzip.codecs.get("dct", axis=3).encode(torch.randn(4, 16))
    with pytest.raises(ConfigError, match="scalar"):
        codec.encode(torch.tensor(1.0))
    with pytest.raises(ConfigError, match="inf or NaN"):
        codec.encode(torch.full((2, 16), float("nan")))


def test_planes_take_scipys_2d_dct_in_zig_zag_order_and_come_back():
    scipy_fft = pytest.importorskip("scipy.fft")
    assert frequency_order(3, 3).tolist() == [0, 1, 3, 2, 4, 6, 5, 7, 8]  # by u + v, then by u
    g = torch.Generator().manual_seed(0)
    coef = torch.zeros(64, 3, 6 * 8, dtype=torch.float64)
    coef[..., frequency_order(6, 8)[:6]] = torch.randn(64, 3, 6, generator=g, dtype=torch.float64)  # band 0 only
    x = torch.from_numpy(scipy_fft.idctn(coef.reshape(64, 3, 6, 8).numpy(), type=2, norm="ortho", axes=(-2, -1)))
    codec = actzip.codecs.get("dct", bits=1, bands=8, dims=2, group_size=64, rounding="nearest")
    p = codec.encode(x)
    assert p.meta["dims"] == 2 and p.meta["band_bits"][0] == 8 and not any(p.meta["band_bits"][1:])
    assert p.meta["dropped_energy"] < 1e-12 * float(x.square().sum())  # scipy's low band is all it holds
    y = codec.decode(p)
    assert y.shape == x.shape and y.dtype == x.dtype and (y - x).norm() / x.norm() < 0.01
    with pytest.raises(ConfigError, match="axis must be -1"):
        actzip.codecs.get("dct", dims=2, axis=0)
    with pytest.raises(ConfigError, match="dims"):
        actzip.codecs.get("dct", dims=3)
    with pytest.raises(ConfigError, match="group_size"):
        actzip.codecs.get("dct", group_size=12)
    with pytest.raises(ConfigError, match="dims=2 needs"):
        actzip.codecs.get("dct", dims=2, bands=1).encode(torch.randn(16))


def test_a_width_coarser_than_the_bands_spread_is_skipped_for_a_finer_one():
    energy, widths = [1.0, 1.0], [8, 8]
    useless_one_bit = [[9.0, 0.5, 0.01, 1e-6], [9.0, 0.5, 0.01, 1e-6]]  # one bit of a wide range: worse than none
    got = allocate_bits(energy, widths, 1.0, useless_one_bit)
    assert got == [2, 0]  # the budget goes to two bits of one band, not one bit of each
    assert allocate_bits(energy, widths, 0.5, useless_one_bit) == [0, 0]  # nothing worth sending fits


def test_shared_ranges_cost_one_pair_a_group():
    x = _smooth(256, 64)
    alone = actzip.codecs.get("dct", bits=4, bands=8, rounding="nearest", group_by="line").encode(x)
    shared = actzip.codecs.get("dct", bits=4, bands=8, group_size=256, rounding="nearest", group_by="line").encode(x)
    assert shared.nbytes < alone.nbytes
    for p, group in ((alone, 8), (shared, 256)):
        pairs = sum(t.numel() for k, t in p.buffers.items() if k.endswith("_lo"))
        want = sum(-(-(b - a) * 256 // group) if group == 256 else 256 * -(-(b - a) // 8)
                   for a, b, k in zip(p.meta["edges"], p.meta["edges"][1:], p.meta["band_bits"]) if k)
        assert pairs == want


@pytest.mark.parametrize("shape, dims, group", [((64, 8, 4, 8), 2, 256), ((48, 300), 1, None), ((32, 5, 7), 1, 64),
                                                ((16, 3, 9, 9), 2, None), ((20, 70), 1, 8)])
def test_a_payload_budget_holds_every_byte_and_the_lowest_band_goes_first(shape, dims, group):
    g = torch.Generator().manual_seed(len(shape))
    # heavy tails: one bit of a band's wide range costs more error than it saves, so only min_bands sends it
    x = torch.randn(shape, generator=g) ** 3
    for dtype in (torch.float32, torch.float64):
        for bits in (0.02, 0.1, 0.5, 1.0, 2.5, 8.0):
            codec = actzip.codecs.get("dct", bits=bits, bands=min(32, math.prod(shape[-dims:])), dims=dims,
                                      group_size=group, budget="payload", min_bands=1, seed=3)
            p = codec.encode(x.to(dtype))
            assert p.nbytes <= bits * x.numel() / 8
            least = codec.least_bytes(shape, dtype)
            assert (p.meta["band_bits"][0] > 0) == (least <= bits * x.numel() / 8)
    free = actzip.codecs.get("dct", bits=0.25, bands=8, group_size=256, seed=3)  # no forced band, codes only
    forced = actzip.codecs.get("dct", bits=0.25, bands=8, group_size=256, seed=3, budget="payload", min_bands=1)
    wide = torch.randn(256, 64, generator=g) ** 5
    assert not any(free.encode(wide).meta["band_bits"]) and forced.encode(wide).meta["band_bits"][0] == 1


def test_forced_bands_and_costs_in_the_allocation():
    energy, widths = [1.0, 1.0], [8, 8]
    useless_one_bit = [[9.0, 0.5, 0.01, 1e-6], [9.0, 0.5, 0.01, 1e-6]]
    assert allocate_bits(energy, widths, 0.5, useless_one_bit, forced=1) == [1, 0]  # sent although useless
    assert allocate_bits(energy, widths, 0.4, useless_one_bit, forced=1) == [0, 0]  # 8 bits of 6.4 do not fit
    costs = [[c + 4 for c in (8, 16, 32, 64)]] * 2  # each band's ranges cost 4 bits more
    assert allocate_bits(energy, widths, 1.0, useless_one_bit, costs) == [0, 0]  # 2 bits and ranges: 20 > 16
    assert allocate_bits(energy, widths, 1.25, useless_one_bit, costs) == [2, 0]
    with pytest.raises(ConfigError, match="min_bands"):
        actzip.codecs.get("dct", bands=4, min_bands=5)
    with pytest.raises(ConfigError, match="budget"):
        actzip.codecs.get("dct", budget="bytes")


def test_groups_by_coefficient_give_each_frequency_its_own_ranges():
    g = torch.Generator().manual_seed(5)
    # non-negative maps (after a ReLU): their lowest coefficient is large and one-signed, the rest zero-centred
    x = torch.relu(torch.randn(512, 8, 4, 8, generator=g) + 0.5)
    rel = {}
    for by in ("coefficient", "line"):
        codec = actzip.codecs.get("dct", bits=0.5, bands=8, dims=2, group_size=256, budget="payload", min_bands=1,
                                  group_by=by, seed=1)
        p = codec.encode(x)
        assert p.nbytes <= 0.5 * x.numel() / 8 and p.meta["group_by"] == by
        rel[by] = float((codec.decode(p) - x).square().sum() / x.square().sum())
        pairs = sum(t.numel() for k, t in p.buffers.items() if k.endswith("_lo"))
        sent = [(b - a) for a, b, k in zip(p.meta["edges"], p.meta["edges"][1:], p.meta["band_bits"]) if k]
        assert pairs == sum(-(-w * 512 * 8 // 256) for w in sent)  # whole groups, one pair each, either way
    assert rel["coefficient"] < 0.9 * rel["line"]
    # fewer lines than a group: each coefficient's lines are one group (rounded up to 8)
    small = actzip.codecs.get("dct", bits=8, bands=2, group_size=256, rounding="nearest").encode(torch.randn(20, 16))
    assert all(band[0]["group_size"] == 24 for band in small.meta["bands"] if band)
    with pytest.raises(ConfigError, match="group_by"):
        actzip.codecs.get("dct", group_by="plane")


def test_adaptive_bands_keep_the_cut_of_least_expected_error_and_spend_the_budget_finer():
    g = torch.Generator().manual_seed(6)
    x = torch.relu(torch.randn(128, 8, 48, generator=g).cumsum(-1) / 4)  # smooth non-negative lines
    budget = 0.5 * x.numel() / 8
    fixed = actzip.codecs.get("dct", bits=0.5, bands=8, group_size=256, budget="payload", min_bands=1, seed=2)
    adapt = actzip.codecs.get("dct", bits=0.5, bands=8, max_bands=64, group_size=256, budget="payload",
                              min_bands=1, seed=2)
    pf, pa = fixed.encode(x), adapt.encode(x)
    assert pa.nbytes <= budget and len(pa.meta["edges"]) - 1 in (8, 16, 32)  # 64 > the 48 coefficients a line
    assert pa.nbytes >= pf.nbytes  # finer steps: no less of the budget spent
    err = {k: float((c.decode(p) - x).square().sum()) for k, c, p in (("f", fixed, pf), ("a", adapt, pa))}
    assert err["a"] < err["f"]
    assert adapt.least_bytes(tuple(x.shape)) < fixed.least_bytes(tuple(x.shape))  # the narrowest lowest band
    tight = actzip.codecs.get("dct", bits=8 * adapt.least_bytes(tuple(x.shape)) / x.numel(), bands=8, max_bands=64,
                              group_size=256, budget="payload", min_bands=1)
    assert tight.encode(x).meta["band_bits"][0] > 0  # what least_bytes promises
    assert actzip.codecs.get("dct", max_bands=16).options()["max_bands"] == 16
    for bad in (4, 2.5, True):
        with pytest.raises(ConfigError, match="max_bands"):
            actzip.codecs.get("dct", bands=8, max_bands=bad)


def test_fitted_levels_leave_less_error_at_a_bit_or_two_within_the_same_payload():
    g = torch.Generator().manual_seed(5)
    x = torch.relu(torch.randn(128, 8, 4, 8, generator=g))  # a convolutional client's feature maps
    for bits, most in ((0.5, 0.95), (1.0, 0.8), (2.0, 0.5)):  # fitted's error at most this share of uniform's
        errors = {}
        for levels in ("uniform", "fitted"):
            codec = actzip.codecs.get("dct", bits=bits, bands=8, max_bands=32, dims=2, group_size=256,
                                      budget="payload", min_bands=1, rounding="nearest", levels=levels)
            p = codec.encode(x)
            assert p.nbytes <= bits * x.numel() / 8
            y = codec.decode(p)
            assert y.shape == x.shape and y.dtype == x.dtype
            errors[levels] = ((y - x).square().sum() / x.square().sum()).item()
            assert codec.options()["levels"] == levels
        assert errors["fitted"] < most * errors["uniform"]
    fitted = actzip.codecs.get("dct", bits=1.0, bands=8, levels="fitted")
    p = fitted.encode(x.reshape(128, -1))
    assert any(isinstance(b, dict) for b in p.meta["bands"])  # some band on the levels
    assert any(k == 8 for k in actzip.codecs.get("dct", bits=7.0, bands=4, levels="fitted").encode(
        x.reshape(128, -1)).meta["band_bits"])  # 8 bits stays on the uniform grid
    with pytest.raises(ConfigError, match="levels"):
        actzip.codecs.get("dct", levels="gaussian")
    with pytest.raises(ConfigError, match="group_by='coefficient'"):
        actzip.codecs.get("dct", levels="fitted", group_by="line")


@pytest.mark.parametrize("shape, options", [
    ((256, 256), dict(bits=0.7, max_bands=64, budget="payload", min_bands=1)),
    ((32, 8, 8, 8), dict(bits=1.5, max_bands=64, dims=2, budget="payload", min_bands=1, levels="fitted")),
    ((32, 40), dict(bits=3.0, bands=4, group_by="line")),
    ((16, 12, 20), dict(bits=2.0, bands=4, axis=1, levels="fitted", rounding="nearest")),
    ((24, 64), dict(bits=0.5, bands=2, max_bands=8, dtype=torch.float64)),
])
def test_a_payload_rebuilt_from_its_buffers_and_side_information_or_its_wire_form_decodes_the_same(shape, options):
    options = dict(options)
    dtype = options.pop("dtype", torch.float32)
    g = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * torch.linspace(3, 0.1, shape[-1],
                                                                             dtype=torch.float64)).to(dtype)
    sender, receiver = actzip.codecs.get("dct", **options), actzip.codecs.get("dct", **options)
    p = sender.encode(x)
    side = sender.side_info(p)
    assert 1 < len(side) <= sender.side_bytes(shape) and all(0 <= v < 256 for v in side)
    padded = torch.tensor(side + [0] * (sender.side_bytes(shape) - len(side)), dtype=torch.uint8)
    rebuilt = receiver.rebuild(padded, p.buffers, shape, dtype, "cpu")
    assert torch.equal(receiver.decode(rebuilt), sender.decode(p))
    assert rebuilt.meta["band_bits"] == p.meta["band_bits"] and rebuilt.meta["edges"] == p.meta["edges"]
    wire = sender.to_wire(p)  # one byte tensor: the padded side information, then every buffer
    assert wire.dtype == torch.uint8 and wire.numel() == sender.side_bytes(shape) + p.nbytes
    assert torch.equal(receiver.decode(receiver.from_wire(wire, shape, dtype, "cpu")), sender.decode(p))
    for bad in (wire[:-1], torch.cat([wire, wire[-1:]])):
        with pytest.raises(ConfigError, match="wire form"):
            receiver.from_wire(bad, shape, dtype, "cpu")


def test_side_information_that_does_not_fit_is_refused():
    c = actzip.codecs.get("dct", bits=2.0, bands=4, max_bands=8)
    p = c.encode(torch.randn(16, 32))
    side = c.side_info(p)
    for bad in ([9, *side[1:]], side[:-1], [side[0], *side[1:-1], 3], side + [1], [side[0], 17, *side[2:]]):
        with pytest.raises(ConfigError, match="side information"):
            c.rebuild(bad, p.buffers, (16, 32), torch.float32, "cpu")
