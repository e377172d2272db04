"""The CREMA-D loader on a tiny copy made here: tones whose pitch and frames whose brightness follow the emotion."""

import math
import wave

import numpy as np
import pytest
import torch
from PIL import Image

from actzip.errors import ConfigError, DataError
from actzip_bench.data.crema_d import CLASSES, MODALITIES, CremaDConfig, actor_split, load_crema_d

RATE = 16000
PITCH = {"ANG": 220.0, "DIS": 440.0, "FEA": 880.0, "HAP": 1500.0, "NEU": 2500.0, "SAD": 4000.0}
ACTORS = (1001, 1002, 1003)


def _write_wav(path, freq, seconds, rate=RATE, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.5 * np.sin(2 * math.pi * freq * t + rng.uniform(0, 2 * math.pi)) + 0.01 * rng.standard_normal(len(t))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())


def _write_frame(path, level, size=(24, 18)):
    Image.fromarray(np.full((size[1], size[0], 3), level, dtype=np.uint8)).save(path)


def _make_copy(root, frames=3, missing=("1003_IEO_SAD_HI",)):
    """Every actor says one sentence in every emotion; ``missing`` clips get no frames."""
    (root / "AudioWAV").mkdir(parents=True)
    (root / "visual").mkdir()
    clips = []
    for a, actor in enumerate(ACTORS):
        for e, emotion in enumerate(CLASSES):
            clip = f"{actor}_IEO_{emotion}_HI"
            clips.append(clip)
            # 0.6 s or 1.4 s: both shorter and longer than the 1 s kept, so padding and cutting both run
            _write_wav(root / "AudioWAV" / f"{clip}.wav", PITCH[emotion], 0.6 + 0.8 * (a % 2), seed=a * 10 + e)
            if clip in missing:
                continue
            (root / "visual" / clip).mkdir()
            for f in range(frames):
                _write_frame(root / "visual" / clip / f"{f + 1:04d}.png", 20 + 40 * e + f)
    return clips


@pytest.fixture
def copy(tmp_path):
    root = tmp_path / "crema"
    return root, _make_copy(root)


def _small(root, **kw):
    return CremaDConfig(root=root, seconds=1.0, n_mels=16, frames_per_clip=2, image_size=8, **kw)


def _load(cfg):
    with pytest.warns(UserWarning, match=r"1 of 18 clips have no frames"):
        return load_crema_d(cfg)


def _nearest_mean_accuracy(x, y, test):
    """Accuracy on the ``test`` samples of a nearest-class-mean classifier fit on the others."""
    x, train = x.flatten(1), ~test
    means = torch.stack([x[train & (y == c)].mean(0) for c in range(len(CLASSES))])
    return float((torch.cdist(x[test], means).argmin(1) == y[test]).float().mean())


def test_shapes_dtypes_labels_and_the_skipped_clip(copy):
    root, clips = copy
    cfg = _small(root)
    streams, labels, info = _load(cfg)
    n = len(clips) - 1
    assert tuple(streams) == MODALITIES
    assert streams["audio"].shape == (n, 16, cfg.audio_frames) == (n, *cfg.shapes()["audio"])
    assert cfg.audio_frames == 51  # 1 s every 20 ms, plus the centred first frame
    assert streams["visual"].shape == (n, 6, 8, 8) == (n, *cfg.shapes()["visual"])
    assert all(x.dtype == torch.float32 for x in streams.values()) and labels.dtype == torch.int64
    assert torch.isfinite(streams["audio"]).all()
    assert 0.0 <= streams["visual"].min() and streams["visual"].max() <= 1.0
    assert info.skipped == 1 and info.skipped_clips == ("1003_IEO_SAD_HI",)
    assert sorted(info.clips) == sorted(c for c in clips if c != "1003_IEO_SAD_HI")
    for clip, label, actor in zip(info.clips, labels.tolist(), info.actors.tolist()):
        assert CLASSES[label] == clip.split("_")[2] and actor == int(clip.split("_")[0])


def test_each_modality_separates_the_emotions(copy):
    streams, labels, info = _load(_small(copy[0]))
    # speaker-independent: fit on actors 1001 (short clips) and 1002 (long ones), so every class mean holds the
    # same padding, and score on 1003's five clips
    test = info.actors == 1003
    assert int(test.sum()) == 5
    assert _nearest_mean_accuracy(streams["audio"], labels, test) == 1.0
    assert _nearest_mean_accuracy(streams["visual"], labels, test) == 1.0


def test_frames_are_chosen_evenly_and_stacked_frame_by_frame(tmp_path):
    root = tmp_path / "crema"
    _make_copy(root, frames=11, missing=())
    cfg = CremaDConfig(root=root, seconds=0.5, n_mels=8, frames_per_clip=3, image_size=4, rgb=False)
    streams, labels, info = load_crema_d(cfg)
    assert streams["visual"].shape == (18, 3, 4, 4) and info.skipped == 0
    # frame f of emotion e has level 20 + 40 e + f; frames 1, 6 and 11 of 11 (named 0001..0011) are chosen
    want = (20 + 40 * labels[:, None] + torch.tensor([0, 5, 10])).float() / 255
    assert torch.allclose(streams["visual"].mean((2, 3)), want, atol=1e-5)
    rgb = load_crema_d(CremaDConfig(root=root, seconds=0.5, n_mels=8, frames_per_clip=3, image_size=4))
    assert rgb.streams["visual"].shape == (18, 9, 4, 4)
    assert torch.allclose(rgb.streams["visual"][:, 3:6], streams["visual"][:, 1:2].expand(-1, 3, -1, -1))


def test_too_few_frames_repeat(tmp_path):
    root = tmp_path / "crema"
    _make_copy(root, frames=1, missing=())
    streams, _, _ = load_crema_d(CremaDConfig(root=root, seconds=0.5, frames_per_clip=4, image_size=4, rgb=False))
    v = streams["visual"]
    assert v.shape[1] == 4 and torch.equal(v[:, :1].expand_as(v), v)


def test_the_seed_fixes_the_order_and_limit_takes_a_prefix(copy):
    root, _ = copy
    a, b, c = (_load(_small(root, seed=s)) for s in (4, 4, 5))
    assert a.info.clips == b.info.clips and torch.equal(a.labels, b.labels)
    assert all(torch.equal(a.streams[m], b.streams[m]) for m in MODALITIES)
    assert a.info.clips != c.info.clips and sorted(a.info.clips) == sorted(c.info.clips)
    d = _load(_small(root, seed=4, limit=5))
    assert d.info.clips == a.info.clips[:5] and torch.equal(d.streams["audio"], a.streams["audio"][:5])


def test_actor_split_keeps_each_actor_on_one_side(copy):
    _, labels, info = _load(_small(copy[0]))
    train, test = actor_split(info.actors, test_share=0.34, seed=1)
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))
    assert len(torch.unique(info.actors[test])) == 1  # round(0.34 * 3) actors
    assert not set(info.actors[train].tolist()) & set(info.actors[test].tolist())
    assert torch.equal(actor_split(info.actors, 0.34, seed=1)[1], test)
    with pytest.raises(DataError):
        actor_split(torch.tensor([1001, 1001]))
    with pytest.raises(ConfigError):
        actor_split(info.actors, test_share=1.0)


def test_other_rates_and_stereo_give_the_same_shape(tmp_path):
    root = tmp_path / "crema"
    _make_copy(root, missing=())
    wav = root / "AudioWAV" / "1001_IEO_ANG_HI.wav"
    t = np.arange(44100) / 44100
    x = (0.3 * np.sin(2 * math.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(np.stack([x, x], 1).tobytes())
    cfg = _small(root)
    streams, labels, info = load_crema_d(cfg)
    assert streams["audio"].shape == (18, 16, cfg.audio_frames)
    # the 44.1 kHz tone lands in the same mel band as the 16 kHz tones of its emotion
    i = info.clips.index("1001_IEO_ANG_HI")
    j = info.clips.index("1002_IEO_ANG_HI")
    assert streams["audio"][i].mean(1).argmax() == streams["audio"][j].mean(1).argmax()


def test_errors_name_the_path(tmp_path, copy):
    root, _ = copy
    with pytest.raises(DataError, match="nowhere"):
        load_crema_d(_small(tmp_path / "nowhere"))
    (tmp_path / "empty" / "AudioWAV").mkdir(parents=True)
    with pytest.raises(DataError, match=r"empty.AudioWAV"):
        load_crema_d(_small(tmp_path / "empty"))
    with pytest.raises(DataError, match="frames_here"):
        load_crema_d(_small(root, frames_dir="frames_here"))
    (root / "AudioWAV" / "1001_IEO_ANG_HI.wav").write_bytes(b"RIFF\x00\x00not a wav")
    with pytest.raises(DataError, match="1001_IEO_ANG_HI.wav"), pytest.warns(UserWarning):
        load_crema_d(_small(root))
    _write_wav(root / "AudioWAV" / "1001_IEO_ANG_HI.wav", 220.0, 0.5)
    (root / "visual" / "1002_IEO_HAP_HI" / "0003.png").write_bytes(b"not a png")  # the last frame is chosen
    with pytest.raises(DataError, match=r"1002_IEO_HAP_HI.0003\.png"), pytest.warns(UserWarning):
        load_crema_d(_small(root))
    (root / "AudioWAV" / "1001_IEO_XXX_HI.wav").write_bytes(b"")
    with pytest.raises(DataError, match="1001_IEO_XXX_HI.wav"):
        load_crema_d(_small(root))


def test_no_clip_with_frames_is_an_error(tmp_path):
    root = tmp_path / "crema"
    _make_copy(root, missing=tuple(f"{a}_IEO_{e}_HI" for a in ACTORS for e in CLASSES))
    with pytest.raises(DataError, match="no clip"), pytest.warns(UserWarning, match="18 of 18"):
        load_crema_d(_small(root))


def test_bad_settings_are_refused():
    for bad in ({"n_mels": 0}, {"frames_per_clip": 0}, {"image_size": 1.5}, {"seconds": 0}, {"limit": 0}):
        with pytest.raises(ConfigError):
            CremaDConfig(root="x", **bad)
