"""What a split-learning server receives of a modality under a keep-ratio (actzip.split.uplink): every compressor
within the budget, the random mask unbiased, gradients back by each compressor's rule."""

import warnings

import pytest
import torch

from actzip.errors import ConfigError
from actzip.kernels.runtime import fallback_counts
from actzip.split.uplink import COMPRESSORS, least_ratio, send


def acts(seed=0, batch=64, width=128):
    g = torch.Generator().manual_seed(seed)
    return torch.relu(torch.randn(batch, width, generator=g)).requires_grad_()


@pytest.mark.parametrize("method", COMPRESSORS)
@pytest.mark.parametrize("ratio", [0.5, 0.2, 0.1])
def test_every_compressor_stays_within_the_budget_and_sends_its_gradient_back(method, ratio):
    a = acts()
    dense = a.numel() * 2  # bf16 bytes
    s = send(a, ratio, method, seed=1)
    slack = 1.1 if method == "random" else 1.0  # the random mask's count is random around the budget
    assert 0 < s.uplink_bytes <= ratio * dense * slack
    s.view.square().sum().backward()
    assert a.grad is not None and s.downlink_bytes > 0
    if method in ("random", "topk"):  # the gradient returns through the kept positions only
        assert torch.equal(a.grad != 0, s.view.detach() != 0)


def test_the_random_mask_is_unbiased():
    a = acts(width=16)
    mean = torch.stack([send(a, 0.25, "random", seed=i).view.detach() for i in range(4000)]).mean(0)
    want = a.detach().bfloat16().float()  # the values travel in bf16
    # each element's mean over 4000 draws: v * keep / 0.25 has standard deviation v * sqrt(3), so 6 standard
    # errors is 6 * sqrt(3 / 4000) * v
    assert ((mean - want).abs() <= 6 * (3 / 4000) ** 0.5 * want + 1e-6).all()


def test_topk_keeps_each_sample_s_largest_values_exactly():
    a = acts(width=64)
    s = send(a, 0.25, "topk")
    kept = s.view.detach() != 0
    k = int(kept[0].sum())
    assert (kept.sum(1) == k).all() and k > 0
    assert torch.equal(s.view.detach()[kept], a.detach().bfloat16().float()[kept])  # exact, in bf16
    top = torch.zeros_like(kept).scatter_(1, a.detach().topk(k, dim=1).indices, True)
    assert torch.equal(kept, top)


def test_nothing_that_fits_leaves_the_modality_out_announced_once_and_counted():
    from actzip.kernels import runtime

    runtime.reset_fallbacks()
    a = acts(width=16)
    for method in ("topk", "quant"):
        with pytest.warns(RuntimeWarning, match="sending nothing"):
            s = send(a, 0.02, method)
        assert s.uplink_bytes == 0 and not s.view.any()
        send(a, 0.02, method)  # counted again, not warned again
    assert sorted(runtime.fallback_counts().values()) == [2, 2]
    whole = send(a, 1.0, "random")
    assert torch.equal(whole.view, a.detach().bfloat16().float()) and whole.uplink_bytes == a.numel() * 2


def test_bad_input_is_refused_by_name():
    a = acts()
    with pytest.raises(ConfigError, match="compressor"):
        send(a, 0.5, "zip")
    with pytest.raises(ConfigError, match="keep-ratio"):
        send(a, 1.5, "random")
    with pytest.raises(ConfigError, match=r"\[batch, \.\.\.features\]"):
        send(a[0], 0.5, "random")


@pytest.mark.parametrize("method", ["topk", "dct", "quant"])
@pytest.mark.parametrize("width", [8, 16, 300])
def test_least_ratio_is_the_smallest_that_sends_anything(method, width):
    r = least_ratio(method, (32, width))
    a = torch.randn(32, width, generator=torch.Generator().manual_seed(width))
    assert 0 < r <= 1 and send(a, r, method).uplink_bytes > 0
    before = sum(fallback_counts().values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # announced once a process; the count is what is checked
        assert send(a, r * 0.99, method).uplink_bytes == 0  # a hair under sends nothing
    assert sum(fallback_counts().values()) == before + 1


@pytest.mark.parametrize("shape", [(32, 8, 4, 8), (32, 256), (32, 8)])
def test_dct_at_its_least_ratio_sends_its_lowest_band_whatever_the_data(shape):
    g = torch.Generator().manual_seed(1)
    for a in (torch.randn(shape, generator=g) ** 5, torch.relu(torch.randn(shape, generator=g)) + 3):
        r = least_ratio("dct", shape)
        s = send(a, r, "dct")
        assert 0 < s.uplink_bytes <= r * a.numel() * 2 and s.view.detach().abs().sum() > 0


def test_least_ratio_of_the_random_mask_is_zero_and_unknown_compressors_are_refused():
    assert least_ratio("random", (32, 16)) == 0.0
    with pytest.raises(ConfigError, match="compressor"):
        least_ratio("zip", (32, 16))


@pytest.mark.parametrize("method", COMPRESSORS)
def test_feature_maps_keep_their_shape_and_dct_runs_along_space(method):
    a = torch.randn(16, 4, 64).cumsum(-1).requires_grad_()  # smooth along the last (spatial) axis
    sent = send(a, 0.25, method, seed=3)
    slack = 1.1 if method == "random" else 1.0  # the random mask spends the budget in expectation
    assert sent.view.shape == a.shape and 0 < sent.uplink_bytes <= 0.25 * a.numel() * 2 * slack
    sent.view.sum().backward()
    assert a.grad.shape == a.shape and sent.downlink_bytes > 0
    if method == "dct":  # the smooth lines' energy sits in the low bands: closer than uniform quantization
        err = lambda v: float((v - a).norm() / a.norm())  # noqa: E731
        assert err(sent.view.detach()) < 0.5 * err(send(a.detach(), 0.25, "quant", seed=3).view)


@pytest.mark.parametrize("method", ["dct", "quant"])
def test_nearest_rounding_is_the_same_whatever_the_seed_both_ways(method):
    views, grads = [], []
    for seed in (1, 2):
        a = acts()
        s = send(a, 0.1, method, seed=seed, rounding="nearest")
        s.view.square().sum().backward()
        views.append(s.view.detach())
        grads.append(a.grad)
    assert torch.equal(views[0], views[1]) and torch.equal(grads[0], grads[1])
    a = acts()
    noisy = [send(a, 0.1, method, seed=seed).view.detach() for seed in (1, 2)]
    assert not torch.equal(noisy[0], noisy[1])  # stochastic rounding draws its own noise from the seed
    budget = 0.1 * a.numel() * 2  # bf16 bytes: either rounding stays within it (its own allocation of it)
    for rounding in ("nearest", "stochastic"):
        assert 0.9 * budget <= send(a, 0.1, method, seed=1, rounding=rounding).uplink_bytes <= budget


def test_an_unknown_rounding_is_refused_by_name():
    with pytest.raises(ConfigError, match="rounding"):
        send(acts(), 0.1, "dct", rounding="up")


def test_fitted_levels_send_dct_s_payload_closer_both_ways():
    a = acts()
    fitted = send(a, 0.05, "dct", seed=1, levels="fitted")
    uniform = send(a.detach(), 0.05, "dct", seed=1)
    assert fitted.uplink_bytes <= 0.05 * a.numel() * 2  # within the keep-ratio's share of the bf16 payload
    err = lambda v: float((v - a).norm() / a.norm())  # noqa: E731
    assert err(fitted.view.detach()) < err(uniform.view)
    fitted.view.square().sum().backward()  # the gradient comes back through the same codec
    assert a.grad is not None and a.grad.shape == a.shape and fitted.downlink_bytes > 0
    with pytest.raises(ConfigError, match="levels"):
        send(acts(), 0.1, "topk", levels="fitted")
    with pytest.raises(ConfigError, match="levels"):
        send(acts(), 0.1, "dct", levels="lloyd")


@pytest.mark.parametrize("method", ["dct", "quant"])
def test_codecs_travel_as_plain_tensors_and_dct_pays_for_its_side_information(method):
    from actzip.split.uplink import WIRE, Link, item_bytes, pack, unpack

    a = acts().detach()
    link = Link(method, 0.1, seed=3, rounding="nearest")
    packed = pack(a, link)
    assert packed.items and all(isinstance(v, torch.Tensor) for v in packed.items.values())
    budget = 0.1 * a.numel() * 2
    assert item_bytes(packed.items) <= budget
    if method == "dct":  # one byte tensor: a byte and a byte a band of the finest cut (64 bands), the buffers
        assert set(packed.items) == {"bits", WIRE} and packed.items[WIRE].dtype == torch.uint8
        assert packed.items[WIRE].numel() == 65 + packed.keep.encode(a.contiguous()).nbytes
    view, codec = unpack(packed.items, link, tuple(a.shape), a.dtype, a.device)
    assert torch.equal(view, packed.keep.decode(packed.keep.encode(a.contiguous())))  # nearest: deterministic
