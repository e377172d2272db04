"""Digits views: halves of real digit images, a sensor that fails as often as asked, a distractor knowing nothing."""

import sys

import pytest
import torch

from actzip.errors import ConfigError, MissingDependencyError
from actzip_bench.data.digits_views import (CLASSES, DIGITS, MODALITIES, DigitsViewsConfig, digit_images,
                                            make_digits_views, noisy_sensor)

pytest.importorskip("sklearn")


def _nearest_mean_hits(x, y):
    """Whether a nearest-class-mean classifier fit on the first half of the samples gets each of the rest right."""
    x = x.flatten(1)
    cut = len(y) // 2
    means = torch.stack([x[:cut][y[:cut] == c].mean(0) for c in range(CLASSES)])
    return torch.cdist(x[cut:], means).argmin(1) == y[cut:]


def _nearest_mean_accuracy(x, y):
    return float(_nearest_mean_hits(x, y).float().mean())


@pytest.fixture(scope="module")
def default():
    cfg = DigitsViewsConfig(seed=1)
    streams, y = make_digits_views(cfg)
    return cfg, streams, y


def test_streams_come_in_order_with_their_shapes_and_dtypes(default):
    cfg, streams, y = default
    assert tuple(streams) == MODALITIES
    assert {m: tuple(s.shape) for m, s in streams.items()} == cfg.shapes()
    assert streams["top"].shape == (DIGITS, 1, 4, 8) and streams["sensor"].shape == (DIGITS, cfg.sensor_dim)
    assert all(s.dtype == torch.float32 for s in streams.values())
    assert y.dtype == torch.int64 and y.shape == (DIGITS,) and set(y.tolist()) == set(range(CLASSES))

    small, y_small = make_digits_views(DigitsViewsConfig(n=50, distractor_dim=0, sensor_dim=3))
    assert tuple(small) == ("top", "bottom", "sensor")  # a zero-width distractor is left out
    assert small["sensor"].shape == (50, 3) and y_small.shape == (50,)


def test_the_views_are_the_halves_of_a_shuffled_digit_image_of_the_label():
    streams, y = make_digits_views(DigitsViewsConfig(n=200, pixel_noise=0.0, seed=4))
    images, labels = digit_images()
    whole = torch.cat([streams["top"], streams["bottom"]], dim=2)[:, 0]  # [n, 8, 8]
    assert whole.min() >= 0 and whole.max() <= 1 and whole.max() == 1  # scaled from 0..16 to [0, 1]
    match = (whole.flatten(1)[:, None] == images.flatten(1)[None]).all(-1)  # [n, 1797]: which image each is
    assert match.any(1).all()
    assert all(bool((labels[match[i]] == y[i]).all()) for i in range(len(y)))
    # the order is shuffled: sample i is not the library's image i
    first = match.float().argmax(1)
    assert not torch.equal(first, torch.arange(len(y)))
    noisy, _ = make_digits_views(DigitsViewsConfig(n=200, pixel_noise=0.3, seed=4))
    assert 0.25 < float((noisy["top"] - streams["top"]).std()) < 0.35  # the same images, with noise as asked


def test_the_same_seed_makes_the_same_tensors_and_another_seed_others():
    a, ya = make_digits_views(DigitsViewsConfig(n=300, seed=3))
    b, yb = make_digits_views(DigitsViewsConfig(n=300, seed=3))
    c, yc = make_digits_views(DigitsViewsConfig(n=300, seed=4))
    assert torch.equal(ya, yb) and all(torch.equal(a[m], b[m]) for m in MODALITIES)
    assert not torch.equal(ya, yc) and not any(torch.equal(a[m], c[m]) for m in MODALITIES)


def test_each_view_and_the_sensor_carry_the_label_and_the_distractor_does_not(default):
    cfg, streams, y = default
    acc = {m: _nearest_mean_accuracy(s, y) for m, s in streams.items()}
    for m in ("top", "bottom", "sensor"):
        assert acc[m] > 0.5, acc  # chance is 0.1
    assert acc["distractor"] < 0.2, acc
    both = _nearest_mean_accuracy(torch.cat([streams["top"], streams["bottom"]], dim=2), y)
    assert both > max(acc["top"], acc["bottom"]) + 0.05  # the halves tell apart different digits
    assert streams["sensor"][0].numel() < streams["top"][0].numel() < streams["distractor"][0].numel()


@pytest.mark.parametrize("corrupt", [0.2, 0.5])
def test_corruption_replaces_that_share_of_the_sensor_and_its_accuracy_falls_accordingly(corrupt):
    clean, y = make_digits_views(DigitsViewsConfig(corrupt=0.0, seed=2, distractor_dim=0))
    broken, y2 = make_digits_views(DigitsViewsConfig(corrupt=corrupt, seed=2, distractor_dim=0))
    assert torch.equal(y, y2) and torch.equal(clean["top"], broken["top"])
    changed = (clean["sensor"] != broken["sensor"]).any(1)
    assert int(changed.sum()) == round(corrupt * DIGITS)  # exactly that share, the rest untouched
    acc_clean = _nearest_mean_accuracy(clean["sensor"], y)
    hits = _nearest_mean_hits(broken["sensor"], y)
    expected = acc_clean * (1 - corrupt) + corrupt / CLASSES  # corrupted samples are guesses
    assert abs(float(hits.float().mean()) - expected) < 0.08, (acc_clean, float(hits.float().mean()), expected)
    tested = changed[DIGITS // 2:]
    assert float(hits[tested].float().mean()) < 0.2  # chance on the corrupted samples
    # the others are still read well (a little less: the class means are fit on corrupted samples too)
    assert float(hits[~tested].float().mean()) > acc_clean - 0.15
    # corrupted rows cannot be told by their scale
    ratio = broken["sensor"][changed].std() / broken["sensor"][~changed].std()
    assert 0.9 < float(ratio) < 1.1


def test_noisy_sensor_on_its_own():
    y = torch.arange(CLASSES).repeat(100)
    s = noisy_sensor(y, 4, 0.0, 0.0, torch.Generator().manual_seed(0))
    assert s.shape == (len(y), 4) and s.dtype == torch.float32
    assert torch.equal(s[:CLASSES], s[CLASSES:2 * CLASSES])  # without noise each class is its code
    assert _nearest_mean_accuracy(s, y) == 1.0


@pytest.mark.parametrize("field, value", [
    ("n", 0), ("n", DIGITS + 1), ("n", 2.5), ("sensor_dim", 0), ("distractor_dim", -1), ("corrupt", 1.5),
    ("corrupt", -0.1), ("pixel_noise", -1.0), ("sensor_noise", float("nan")), ("seed", -1), ("sensor_dim", True),
])
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        DigitsViewsConfig(**{field: value})


def test_without_scikit_learn_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # makes the import fail
    with pytest.raises(MissingDependencyError, match=r"pip install 'actzip\[bench\]'"):
        make_digits_views(DigitsViewsConfig(n=10))
