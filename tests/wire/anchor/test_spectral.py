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
