"""The MVSA-Single loader on a tiny copy made here: image colour and words follow the sentiment."""

import numpy as np
import pytest
import torch
from PIL import Image

from actzip.errors import ConfigError, DataError
from actzip_bench.data.mvsa import CLASSES, MODALITIES, MVSAConfig, combine_labels, hash_text, load_mvsa

COLOUR = {"positive": (230, 200, 40), "neutral": (128, 128, 128), "negative": (30, 40, 200)}
WORDS = {"positive": "love great happy sunshine #blessed", "neutral": "meeting schedule report today",
         "negative": "awful sad angry broken #fail"}
FILLER = ("the", "a", "at", "on", "we", "it", "with", "for")


def _rows():
    """``(id, text label, image label)``: 4 agreeing pairs per class, 2 with one neutral view, 2 conflicts."""
    rows, i = [], 1
    for c in CLASSES:
        for _ in range(4):
            rows.append((str(i), c, c))
            i += 1
    rows += [(str(i), "neutral", "positive"), (str(i + 1), "negative", "neutral")]  # -> positive, negative
    rows += [(str(i + 2), "positive", "negative"), (str(i + 3), "negative", "positive")]  # dropped
    return rows


def _make_copy(root):
    data = root / "data"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = _rows()
    for k, (tweet, text_label, image_label) in enumerate(rows):
        pixels = np.clip(np.array(COLOUR[image_label]) + rng.normal(0, 12, (30, 40, 3)), 0, 255).astype(np.uint8)
        # a wide image: the loader keeps its central square; every third one a PNG
        Image.fromarray(pixels).save(data / f"{tweet}.{'png' if k % 3 == 2 else 'jpg'}")
        words = WORDS[text_label].split() + list(rng.choice(FILLER, 4))
        rng.shuffle(words)
        text = " ".join(words) + f" http://t.co/x{k}"
        # tweets come in several encodings: a Latin-1 byte that is not UTF-8 must not stop the loader
        (data / f"{tweet}.txt").write_bytes(text.encode("utf-8") + (b" caf\xe9" if k % 4 == 0 else b""))
    lines = ["ID\ttext,image"] + [f"{t}\t{a},{b}" for t, a, b in rows]
    (root / "labelResultAll.txt").write_text("\n".join(lines) + "\n")
    return rows


@pytest.fixture
def copy(tmp_path):
    root = tmp_path / "mvsa"
    return root, _make_copy(root)


def _nearest_mean_accuracy(x, y):
    """Leave-one-out nearest-class-mean accuracy."""
    x = x.flatten(1)
    hits = 0
    for i in range(len(y)):
        rest = torch.arange(len(y)) != i
        means = torch.stack([x[rest & (y == c)].mean(0) for c in range(len(CLASSES))])
        hits += int(torch.cdist(x[i:i + 1], means).argmin() == y[i])
    return hits / len(y)


def test_the_labelling_rule():
    assert [combine_labels(a, b) for a, b in [("positive", "positive"), ("neutral", "neutral"),
                                              ("neutral", "negative"), ("positive", "neutral"),
                                              ("positive", "negative"), ("negative", "positive")]] == \
        ["positive", "neutral", "negative", "positive", None, None]


def test_shapes_dtypes_labels_and_dropped_conflicts(copy):
    root, rows = copy
    cfg = MVSAConfig(root=root, image_size=16, text_dim=64)
    streams, labels, info = load_mvsa(cfg)
    assert tuple(streams) == MODALITIES
    assert streams["image"].shape == (14, 3, 16, 16) == (14, *cfg.shapes()["image"])
    assert streams["text"].shape == (14, 64) == (14, *cfg.shapes()["text"])
    assert all(x.dtype == torch.float32 for x in streams.values()) and labels.dtype == torch.int64
    assert 0.0 <= streams["image"].min() and streams["image"].max() <= 1.0
    assert info.rows == 16 and info.conflicts == 2 and set(info.conflict_ids) == {"15", "16"}
    want = {t: combine_labels(a, b) for t, a, b in rows}
    assert sorted(info.ids, key=int) == [str(i) for i in range(1, 15)]
    assert [CLASSES[y] for y in labels.tolist()] == [want[t] for t in info.ids]
    assert CLASSES[labels[info.ids.index("13")]] == "positive" and CLASSES[labels[info.ids.index("14")]] == "negative"


def test_each_modality_separates_the_sentiments(copy):
    root, _ = copy
    streams, labels, info = load_mvsa(MVSAConfig(root=root, image_size=8, text_dim=256))
    agree = torch.tensor([int(t) <= 12 for t in info.ids])  # pairs 13 and 14: one view is neutral
    assert _nearest_mean_accuracy(streams["image"][agree], labels[agree]) == 1.0
    assert _nearest_mean_accuracy(streams["text"][agree], labels[agree]) == 1.0


def test_the_image_is_centre_cropped_rgb(copy):
    root, _ = copy
    pixels = np.zeros((20, 60, 3), dtype=np.uint8)
    pixels[:, 20:40] = (255, 0, 0)  # only the central square is red
    Image.fromarray(pixels).save(root / "data" / "1.jpg", quality=100)
    streams, _, info = load_mvsa(MVSAConfig(root=root, image_size=4, text_dim=8))
    red = streams["image"][info.ids.index("1")]
    assert red[0].min() > 0.9 and red[1:].max() < 0.1


def test_text_hashing():
    a = hash_text("Love this! #blessed http://t.co/abc", 512)
    assert a.shape == (512,) and a.dtype == torch.float32
    assert torch.equal(a, hash_text("love THIS #blessed https://t.co/zzz", 512))  # case and links do not matter
    assert float(a.sum()) == pytest.approx(7 * np.log(2))  # 4 unigrams + 3 bigrams, no collision at 512 here
    go = hash_text("go go go", 512)  # "go" three times, "go go" twice: log(1 + 3) and log(1 + 2)
    assert sorted(go[go > 0].tolist()) == pytest.approx([np.log(3.0), np.log(4.0)])
    assert not torch.equal(hash_text("good not bad", 512), hash_text("bad not good", 512))  # bigrams keep order
    assert hash_text("", 16).abs().sum() == 0


def test_the_seed_fixes_the_order_and_limit_takes_a_prefix(copy):
    root, _ = copy
    a, b, c = (load_mvsa(MVSAConfig(root=root, image_size=8, text_dim=32, seed=s)) for s in (3, 3, 4))
    assert a.info.ids == b.info.ids and torch.equal(a.labels, b.labels)
    assert all(torch.equal(a.streams[m], b.streams[m]) for m in MODALITIES)
    assert a.info.ids != c.info.ids and sorted(a.info.ids) == sorted(c.info.ids)
    d = load_mvsa(MVSAConfig(root=root, image_size=8, text_dim=32, seed=3, limit=4))
    assert d.info.ids == a.info.ids[:4] and torch.equal(d.streams["text"], a.streams["text"][:4])
    assert d.info.conflicts == 2  # counted over the whole label file


def test_errors_name_the_path(tmp_path, copy):
    root, _ = copy
    cfg = dict(image_size=8, text_dim=16)
    with pytest.raises(DataError, match="nowhere"):
        load_mvsa(MVSAConfig(root=tmp_path / "nowhere", **cfg))
    (tmp_path / "bare").mkdir()
    with pytest.raises(DataError, match=r"bare.data"):
        load_mvsa(MVSAConfig(root=tmp_path / "bare", **cfg))
    (tmp_path / "bare" / "data").mkdir()
    with pytest.raises(DataError, match="labelResultAll"):
        load_mvsa(MVSAConfig(root=tmp_path / "bare", **cfg))
    (root / "data" / "1.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=r"data.1\.jpg"):
        load_mvsa(MVSAConfig(root=root, **cfg))
    (root / "data" / "1.jpg").unlink()
    with pytest.raises(DataError, match=r"data.1\.jpg"):
        load_mvsa(MVSAConfig(root=root, **cfg))
    Image.new("RGB", (4, 4)).save(root / "data" / "1.jpg")
    (root / "data" / "4.txt").unlink()
    with pytest.raises(DataError, match=r"data.4\.txt"):
        load_mvsa(MVSAConfig(root=root, **cfg))
    labels = root / "labelResultAll.txt"
    labels.write_text("ID\ttext,image\n1\tpositive,happy\n")
    with pytest.raises(DataError, match=r"labelResultAll\.txt' line 2"):
        load_mvsa(MVSAConfig(root=root, **cfg))
    labels.write_text("ID\ttext,image\n1\tpositive,negative\n")
    with pytest.raises(DataError, match="conflict"):
        load_mvsa(MVSAConfig(root=root, **cfg))


def test_bad_settings_are_refused():
    for bad in ({"image_size": 0}, {"text_dim": -1}, {"limit": 0}, {"text_dim": True}):
        with pytest.raises(ConfigError):
            MVSAConfig(root="x", **bad)
