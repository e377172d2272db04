"""The synthetic multimodal suite: size and usefulness disagree, corruption and the switch do what they say."""

import pytest
import torch

from actzip.errors import ConfigError
from actzip_bench.data.multimodal import MODALITIES, MultimodalConfig, make_multimodal


def _nearest_mean_accuracy(x, y, classes, train=0.5):
    """Accuracy of a nearest-class-mean classifier fit on the first half, scored on the second."""
    cut = int(len(y) * train)
    means = torch.stack([x[:cut][y[:cut] == c].mean(0) for c in range(classes)])
    pred = torch.cdist(x[cut:], means).argmin(1)
    return float((pred == y[cut:]).float().mean())


def test_the_small_stream_is_the_strong_one_and_the_large_distractor_knows_nothing():
    cfg = MultimodalConfig(n=2000, seed=1)
    streams, y = make_multimodal(cfg)
    assert set(streams) == set(MODALITIES) and all(streams[m].shape == (cfg.n, d) for m, d in cfg.sizes().items())
    acc = {m: _nearest_mean_accuracy(streams[m], y, cfg.classes) for m in MODALITIES}
    assert cfg.sizes()["sensor"] < cfg.sizes()["image"]
    assert acc["sensor"] > acc["image"] > acc["distractor"]
    assert acc["distractor"] < 2 / cfg.classes  # chance is 1 / classes
    assert acc["sensor"] <= 1 - cfg.corrupt * (1 - 1 / cfg.classes) + 0.05  # corrupted samples are guesses


def test_the_same_seed_makes_the_same_suite():
    a, ya = make_multimodal(MultimodalConfig(n=64, seed=3))
    b, yb = make_multimodal(MultimodalConfig(n=64, seed=3))
    assert torch.equal(ya, yb) and all(torch.equal(a[m], b[m]) for m in MODALITIES)


def test_after_the_switch_the_image_informs_and_the_sensor_is_silent():
    cfg = MultimodalConfig(n=4000, switch_at=2000, seed=2)
    streams, y = make_multimodal(cfg)
    late = slice(2000, None)
    acc = {m: _nearest_mean_accuracy(streams[m][late], y[late], cfg.classes) for m in ("image", "sensor")}
    assert acc["image"] > 0.8 and acc["sensor"] < 2 / cfg.classes


def test_bad_settings_are_refused():
    for bad in ({"patch": 0}, {"corrupt": 1.5}, {"switch_at": -1}, {"classes": 1}):
        with pytest.raises(ConfigError):
            MultimodalConfig(**bad)
