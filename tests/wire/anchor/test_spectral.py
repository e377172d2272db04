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
