"""Spectral correction: masked gradients projected on (or shrunk towards) the anchors' subspace."""

import warnings

import pytest
import torch
import torch.nn as nn

from actzip.codecs.mask import MaskCodec
from actzip.errors import ConfigError
from actzip.wire.anchor import SpectralConfig, SpectralCorrection


def _setup(mode, rank=2):
    torch.manual_seed(0)
    layer = nn.Linear(16, 32)
    true = torch.randn(32, 2) @ torch.randn(2, 16)  # a rank-2 gradient
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1), SpectralConfig(mode=mode, rank=rank))
    opt.observe_anchor({layer.weight: true})
    return layer, true, opt


def _masked(true, codec):
    return codec.decode(codec.encode(true))  # unbiased, noisy: a fifth of the entries, rescaled


@pytest.mark.parametrize("mode,bound", [("projection", 0.6), ("shrinkage", 0.8)])
def test_correction_brings_masked_gradients_closer_to_the_true_one(mode, bound):
    layer, true, opt = _setup(mode)
    codec = MaskCodec(keep=0.2, seed=1)
    before = after = 0.0
    for _ in range(50):
        g = _masked(true, codec)
        layer.weight.grad = g.clone()
        layer.bias.grad = torch.ones(32)
        opt.correct()
        before += float((g - true).norm())
        after += float((layer.weight.grad - true).norm())
        assert torch.equal(layer.bias.grad, torch.ones(32))  # vectors pass unchanged
    assert after < bound * before


def test_projection_on_a_subspace_holding_the_true_gradient_stays_unbiased():
    layer, true, opt = _setup("projection")
    codec = MaskCodec(keep=0.2, seed=2)
    n = 2000
    mean = torch.zeros_like(true)
    for _ in range(n):
        layer.weight.grad = _masked(true, codec)
        opt.correct()
        mean += layer.weight.grad / n
    assert float((mean - true).norm()) < 0.05 * float(true.norm())


def test_off_changes_nothing_and_no_anchor_is_counted_and_said_once():
    layer, _, opt = _setup("off")
    g = torch.randn(32, 16)
    layer.weight.grad = g.clone()
    opt.correct()
    assert torch.equal(layer.weight.grad, g)
    fresh = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1), SpectralConfig())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fresh.correct()
    assert fresh.uncorrected_steps == 3 and sum("no anchor" in str(w.message) for w in caught) == 1
    assert torch.equal(layer.weight.grad, g)


def test_state_size_and_step_and_refusals():
    layer, _, opt = _setup("projection", rank=3)
    assert opt.state_bytes() == (32 * 16 + 3 * (32 + 16)) * 4
    layer.weight.grad = torch.randn(32, 16)
    layer.bias.grad = torch.randn(32)
    w = layer.weight.detach().clone()
    opt.step()
    assert not torch.equal(layer.weight, w)
    with pytest.raises(ConfigError, match="shape"):
        opt.observe_anchor({layer.weight: torch.zeros(3, 3)})
    for bad in ({"mode": "svd"}, {"rank": 0}, {"shrink": 2.0}, {"decay": -0.1}):
        with pytest.raises(ConfigError):
            SpectralConfig(**bad)


def _wiener(anchors: int, noisy: bool, seed: int = 0):
    """A rank-2 true gradient per step; on each anchor's step the fast gradient is it seen through a random 20%
    mask (or exactly, ``noisy=False``), paired with the anchor's exact one."""
    torch.manual_seed(seed)
    layer = nn.Linear(16, 32)
    base = torch.randn(32, 2) @ torch.randn(2, 16)
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1), SpectralConfig(mode="wiener", rank=2))
    codec = MaskCodec(keep=0.2, seed=seed + 1)
    for step in range(anchors):
        true = base * (1 + 0.1 * torch.randn(()))
        layer.weight.grad = _masked(true, codec) if noisy else true.clone()
        opt.stash_fast(step)
        opt.observe_anchor({layer.weight: true}, launched=step)
    return layer, base, opt, codec


def test_wiener_shrinks_the_noisy_part_and_beats_the_fixed_shrinkage():
    layer, true, opt, codec = _wiener(8, noisy=True)
    _, _, fixed, _ = _wiener(8, noisy=True)
    fixed.config.mode = "shrinkage"
    before = after = after_fixed = 0.0
    for _ in range(50):
        g = _masked(true, codec)
        for o, errs in ((opt, "after"), (fixed, "fixed")):
            layer.weight.grad = g.clone()
            o.correct()
            err = float((layer.weight.grad - true).norm())
            if errs == "after":
                after += err
            else:
                after_fixed += err
        before += float((g - true).norm())
    assert after < 0.6 * before and after < after_fixed
    assert opt.state_bytes() > 0 and not opt.fast  # each pair used once, then dropped


def test_wiener_leaves_gradients_the_masks_do_not_touch_exactly_as_they_are():
    layer, _, opt, _ = _wiener(3, noisy=False)
    g = torch.randn(32, 16)
    layer.weight.grad = g.clone()
    opt.correct()
    assert torch.equal(layer.weight.grad, g)


def test_wiener_waits_for_a_measured_pair_and_drops_pairs_whose_anchor_never_came():
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1), SpectralConfig(mode="wiener", rank=1))
    layer.weight.grad = torch.randn(4, 8)
    opt.stash_fast(0)
    opt.stash_fast(8)
    opt.observe_anchor({layer.weight: torch.randn(4, 8)})  # no step: a basis but no pair
    g = torch.randn(4, 8)
    layer.weight.grad = g.clone()
    opt.correct()
    assert torch.equal(layer.weight.grad, g)  # no measured noise yet: unchanged
    opt.observe_anchor({layer.weight: torch.randn(4, 8)}, launched=8)
    assert not opt.fast  # step 0's anchor never arrived: its kept gradient is dropped


def _debias_pairs(layer, opt, bias_w, bias_b, pairs, seed=0):
    """``pairs`` measured pairs: the anchor's gradient the true one, the fast one the true one plus a fixed bias and
    zero-mean noise (a masked function's gradient against the model's own)."""
    g = torch.Generator().manual_seed(seed)
    for step in range(pairs):
        true_w, true_b = torch.randn(32, 16, generator=g), torch.randn(32, generator=g)
        layer.weight.grad = true_w + bias_w + 0.5 * torch.randn(32, 16, generator=g)
        layer.bias.grad = true_b + bias_b + 0.5 * torch.randn(32, generator=g)
        opt.stash_fast(step)
        opt.observe_anchor({layer.weight: true_w, layer.bias: true_b}, launched=step)


def test_debias_learns_the_fast_gradients_bias_from_the_pairs_and_removes_it():
    torch.manual_seed(0)
    layer = nn.Linear(16, 32)
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1),
                             SpectralConfig(mode="debias", rank=2, decay=0.9))  # a fixed bias: average it
    bias_w = torch.randn(32, 2) @ torch.randn(2, 16)  # a rank-2 bias, as large as the gradient itself
    bias_w *= 16 / float(bias_w.norm())
    bias_b = torch.randn(32)
    _debias_pairs(layer, opt, bias_w, bias_b, pairs=60)
    g = torch.Generator().manual_seed(99)
    before = after = 0.0
    mean_err = torch.zeros(32, 16)
    for _ in range(40):  # fresh steps: the corrected gradient against the true one
        true_w = torch.randn(32, 16, generator=g)
        fast = true_w + bias_w + 0.5 * torch.randn(32, 16, generator=g)
        layer.weight.grad, layer.bias.grad = fast.clone(), bias_b.clone()
        opt.correct()
        before += float((fast - true_w).norm())
        after += float((layer.weight.grad - true_w).norm())
        mean_err += (layer.weight.grad - true_w) / 40
        assert float(layer.bias.grad.norm()) < 0.3 * float(bias_b.norm())  # vectors are corrected too
    assert after < 0.65 * before  # the noise (11 of the 20 before) stays: no correction can tell it apart
    assert float(mean_err.norm()) < 0.2 * float(bias_w.norm())  # what stays is noise, not the bias
    assert opt.state_bytes() == (2 * 32 * 16 + 32) * 4 and not opt.fast  # a matrix: average and B; a vector: one


def test_debias_takes_the_plain_mean_of_its_first_pairs_and_waits_for_one():
    torch.manual_seed(0)
    layer = nn.Linear(8, 4)
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1),
                             SpectralConfig(mode="debias", rank=4, decay=0.9))
    g = torch.randn(4, 8)
    layer.weight.grad, layer.bias.grad = g.clone(), None
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        opt.correct()
        opt.correct()
    assert torch.equal(layer.weight.grad, g) and opt.uncorrected_steps == 2 and len(said) == 1
    gaps = [torch.randn(4, 8) for _ in range(2)]
    for step, gap in enumerate(gaps):
        anchor = torch.randn(4, 8)
        layer.weight.grad = anchor - gap
        opt.stash_fast(step)
        opt.observe_anchor({layer.weight: anchor}, launched=step)
    torch.testing.assert_close(opt.gap[id(layer.weight)], (gaps[0] + gaps[1]) / 2)  # not 0.9 * first + 0.1 * second
    layer.weight.grad = g.clone()
    opt.correct()
    torch.testing.assert_close(layer.weight.grad, g + (gaps[0] + gaps[1]) / 2)  # rank 4 of a 4 x 8: all of it


def test_decay_defaults_per_mode_and_debias_at_zero_keeps_the_latest_pair():
    assert SpectralConfig(mode="shrinkage").decay == 0.9 and SpectralConfig(mode="debias").decay == 0.0
    layer = nn.Linear(8, 4)
    opt = SpectralCorrection(torch.optim.SGD(layer.parameters(), lr=0.1), SpectralConfig(mode="debias", rank=4))
    for step in range(3):
        gap = torch.full((4, 8), float(step))
        layer.weight.grad, layer.bias.grad = -gap, None
        opt.stash_fast(step)
        opt.observe_anchor({layer.weight: torch.zeros(4, 8)}, launched=step)
    torch.testing.assert_close(opt.bias[id(layer.weight)], torch.full((4, 8), 2.0))  # the latest pair's gap alone
