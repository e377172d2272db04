"""Spoken digits: espeak-ng's words become log-mels that carry the digit, paired with an image and a sensor."""

import shutil
import wave

import numpy as np
import pytest
import torch

from actzip.errors import ConfigError, DataError, MissingDependencyError
from actzip_bench.data.digits_views import CLASSES, digit_images
from actzip_bench.data.spoken_digits import (MODALITIES, WORDS, SpokenDigitsConfig, log_mel, make_spoken_digits,
                                             speak)

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
pytest.importorskip("sklearn")


def _nearest_mean_accuracy(x, y):
    """Accuracy of a nearest-class-mean classifier fit on the first half of the samples, scored on the rest."""
    x = x.flatten(1)
    cut = len(y) // 2
    means = torch.stack([x[:cut][y[:cut] == c].mean(0) for c in range(CLASSES)])
    return float((torch.cdist(x[cut:], means).argmin(1) == y[cut:]).float().mean())


def _small(**kw):
    return SpokenDigitsConfig(**{"n": 600, "variants": 3, **kw})


@pytest.fixture(scope="module")
def small():
    cfg = _small(seed=1)
    streams, y = make_spoken_digits(cfg)
    return cfg, streams, y


@needs_espeak
def test_streams_come_in_order_with_their_shapes_and_dtypes(small):
    cfg, streams, y = small
    assert tuple(streams) == MODALITIES
    assert {m: tuple(s.shape) for m, s in streams.items()} == cfg.shapes()
    assert streams["audio"].shape == (600, 32, 48) and streams["image"].shape == (600, 1, 8, 8)
    assert all(s.dtype == torch.float32 and torch.isfinite(s).all() for s in streams.values())
    assert y.dtype == torch.int64 and y.shape == (600,) and set(y.tolist()) == set(range(CLASSES))


@needs_espeak
def test_the_same_seed_makes_the_same_tensors_and_another_seed_others(small):
    cfg, a, ya = small
    b, yb = make_spoken_digits(_small(seed=1))
    c, yc = make_spoken_digits(_small(seed=2))
    assert torch.equal(ya, yb) and all(torch.equal(a[m], b[m]) for m in MODALITIES)
    assert not torch.equal(ya, yc) and not any(torch.equal(a[m], c[m]) for m in MODALITIES)


@needs_espeak
def test_every_stream_carries_the_digit_and_noise_drowns_the_audio(small):
    cfg, streams, y = small
    acc = {m: _nearest_mean_accuracy(s, y) for m, s in streams.items()}
    assert acc["image"] > 0.7 and acc["audio"] > 0.4 and acc["sensor"] > 0.4, acc  # chance is 0.1
    drowned, yd = make_spoken_digits(_small(seed=1, snr_db=-25.0))
    assert torch.equal(drowned["image"], streams["image"])  # only the audio changed
    assert _nearest_mean_accuracy(drowned["audio"], yd) < 0.2


@needs_espeak
def test_one_clean_unshifted_recording_per_digit_tells_the_ten_words_apart():
    streams, y = make_spoken_digits(SpokenDigitsConfig(n=200, variants=1, shift_ms=0.0, snr_db=60.0, seed=3))
    assert _nearest_mean_accuracy(streams["audio"], y) == 1.0


@needs_espeak
def test_the_word_starts_after_a_random_delay_up_to_shift_ms():
    def onsets(shift_ms):
        cfg = SpokenDigitsConfig(n=200, variants=1, shift_ms=shift_ms, snr_db=60.0, seed=5)
        streams, y = make_spoken_digits(cfg)
        energy = streams["audio"].exp().sum(1)  # [n, frames]
        # a low bar: words like "three" and "nine" start softly, the noise sits 60 dB down
        loud = energy > energy.amax(1, keepdim=True) * 1e-3
        return loud.float().argmax(1), y, cfg.hop_ms

    fixed, y, _ = onsets(0.0)
    spread, y2, hop_ms = onsets(240.0)
    assert torch.equal(y, y2)
    for c in range(CLASSES):  # one recording per digit: without a delay every sample starts in the same frame
        assert len(set(fixed[y == c].tolist())) == 1
    delays = (spread - fixed) * hop_ms
    assert delays.min() >= -hop_ms and delays.max() <= 240.0 + hop_ms
    assert len(set(delays.tolist())) >= 8  # 12 frames of delay to draw from


@needs_espeak
def test_each_image_is_a_scikit_learn_digit_of_the_label():
    streams, y = make_spoken_digits(SpokenDigitsConfig(n=100, variants=1, pixel_noise=0.0, seed=4))
    images, labels = digit_images()
    match = (streams["image"].flatten(1)[:, None] == images.flatten(1)[None]).all(-1)
    assert match.any(1).all()
    assert all(bool((labels[match[i]] == y[i]).all()) for i in range(len(y)))


@needs_espeak
def test_speak_gives_a_trimmed_unit_rms_recording():
    rate, seven = speak("seven")
    _, one = speak("one", voice="en-gb", speed=200, pitch=30)
    assert rate == 22050 and seven.dtype == np.float32 and not seven.flags.writeable
    assert abs(float(np.mean(seven.astype(np.float64) ** 2)) - 1.0) < 1e-4
    assert 0.2 * rate < len(seven) < 1.5 * rate and len(one) != len(seven)
    assert abs(seven[0]) > 0.0 and abs(seven[-1]) > 0.0  # the silence around the word is cut


def test_log_mel_puts_a_higher_tone_in_a_higher_band():
    rate, n_mels = 16000, 24
    t = torch.arange(rate) / rate
    tones = torch.stack([torch.sin(2 * torch.pi * f * t) for f in (300.0, 1000.0, 3000.0)])
    feats = log_mel(tones, rate, n_mels, hop=160, win=400)
    assert feats.shape == (3, n_mels, 1 + (rate - 400) // 160) and feats.dtype == torch.float32
    peaks = feats.mean(2).argmax(1).tolist()
    assert peaks[0] < peaks[1] < peaks[2]
    # the peak band's centre sits near the tone (bands evenly spaced on the HTK mel scale up to 8 kHz)
    mel_top = 2595 * np.log10(1 + 8000 / 700)
    centres = 700 * (10 ** (np.linspace(0, mel_top, n_mels + 2)[1:-1] / 2595) - 1)
    for f, peak in zip((300.0, 1000.0, 3000.0), peaks):
        assert peak in np.argsort(np.abs(centres - f))[:2], (f, centres[peak])  # one of the two bands around f
    assert (feats.mean(2).amax(1) - feats.mean(2).median(1).values > 5).all()  # the tone stands out


@needs_espeak
def test_cache_dir_keeps_the_recordings_and_reads_them_back(tmp_path):
    cfg = SpokenDigitsConfig(n=40, variants=2, cache_dir=tmp_path / "a", seed=6)
    streams, y = make_spoken_digits(cfg)
    files = sorted((tmp_path / "a").glob("*.wav"))
    assert 10 <= len(files) <= 20 and {f.name.split("_")[0] for f in files} == set(WORDS)
    again, _ = make_spoken_digits(cfg)
    assert all(torch.equal(streams[m], again[m]) for m in MODALITIES)
    # a second folder whose recordings are all silent: a cache that is read makes the synthesis fail
    (tmp_path / "b").mkdir()
    for f in files:
        with wave.open(str(tmp_path / "b" / f.name), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(22050)
            w.writeframes(b"\0\0" * 1000)
    with pytest.raises(DataError, match="silence"):
        make_spoken_digits(SpokenDigitsConfig(n=40, variants=2, cache_dir=tmp_path / "b", seed=6))


@needs_espeak
def test_an_unknown_voice_is_a_config_error():
    with pytest.raises(ConfigError, match="nosuchvoice"):
        make_spoken_digits(SpokenDigitsConfig(n=10, variants=1, voices=("nosuchvoice",)))


@pytest.mark.parametrize("field, value", [
    ("n", 0), ("variants", 0), ("n_mels", 0), ("frames", 0), ("voices", ()), ("voices", "en-us"),
    ("speed", (300, 200)), ("speed", (100,)), ("pitch", (0, 100)), ("snr_db", float("nan")), ("hop_ms", 0.0),
    ("shift_ms", 5000.0), ("shift_ms", -1.0), ("corrupt", 2.0), ("pixel_noise", -0.5), ("seed", -1),
])
def test_bad_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        SpokenDigitsConfig(**{field: value})


def test_without_espeak_ng_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    with pytest.raises(MissingDependencyError, match=r"apt-get install espeak-ng"):
        make_spoken_digits(SpokenDigitsConfig(n=10, variants=1))
    with pytest.raises(MissingDependencyError, match="espeak-ng"):
        speak("one")
