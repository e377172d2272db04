"""MVSA-Single read from a local copy: a tweet's image (``image``) and its text (``text``), three sentiments.

MVSA-Single (Niu et al., "Sentiment Analysis on Multi-view Social Data", MMM 2016) pairs the image and the text
of 4,869 tweets, each view labelled positive, neutral or negative by one annotator. It is distributed from the
MCRLab page https://mcrlab.net/research/mvsa-sentiment-analysis-on-multi-view-social-data/ as an archive.

Expected layout under ``root``::

    data/<id>.jpg           the tweet's image (a .jpeg or .png of the same id is read too)
    data/<id>.txt           the tweet's text (any encoding: read as UTF-8, else Latin-1)
    labelResultAll.txt      tab-separated: a header ``ID<TAB>text,image``, then e.g. ``1<TAB>positive,neutral``

One label per pair, by the rule common in work on this data (e.g. MultiSentiNet, Xu and Mao, CIKM 2017): when
text and image agree, that label; when one of them is neutral, the other one; a positive/negative conflict is
dropped (the count is in the returned :class:`MVSAInfo`).

Streams, in the order of :data:`MODALITIES`:

- ``image``: ``[n, 3, image_size, image_size]`` RGB in [0, 1], the image's central square resized;
- ``text``: ``[n, text_dim]`` hashed bag of words: the lowercased text is cut into word tokens (``#tags`` and
  ``@names`` kept whole, every link as one token), every unigram and adjacent bigram is hashed (CRC-32,
  so the same on every machine) into one of ``text_dim`` buckets, and each bucket holds ``log(1 + count)``.
  No tokenizer or vocabulary is needed.

Pairs are shuffled by ``seed`` before ``limit`` is taken, so a cut by index is a random split.
"""

from __future__ import annotations

import pathlib
import re
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.images import read_square_image

__all__ = ["CLASSES", "MODALITIES", "MVSA", "MVSAConfig", "MVSAInfo", "combine_labels", "hash_text",
           "load_mvsa"]

MODALITIES = ("image", "text")
CLASSES = ("positive", "neutral", "negative")  # label i is CLASSES[i]
LABEL_FILE = "labelResultAll.txt"
DATA_DIR = "data"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_URL = re.compile(r"https?://\S+|www\.\S+")
_TOKEN = re.compile(r"[#@]?\w+(?:'\w+)?")  # words with an inner apostrophe; #tags and @names stay whole


@dataclass
class MVSAConfig:
    """Where the copy is and how each pair becomes tensors."""

    root: str | pathlib.Path = ""  # the folder holding data/ and labelResultAll.txt
    image_size: int = 64  # images are resized to image_size x image_size
    text_dim: int = 1024  # hash buckets of the text stream
    limit: int | None = None  # at most this many pairs (after shuffling); None: all
    seed: int = 0  # the order of the pairs

    def __post_init__(self) -> None:
        for name in ("image_size", "text_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"mvsa: {name} must be a positive int, got {value!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ConfigError(f"mvsa: limit must be a positive int or None, got {self.limit!r}")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each modality's per-sample shape."""
        return {"image": (3, self.image_size, self.image_size), "text": (self.text_dim,)}


@dataclass
class MVSAInfo:
    """What the loader found, beside the tensors."""

    ids: tuple[str, ...]  # tweet ids, in sample order
    rows: int  # labelled pairs in the label file
    conflicts: int  # pairs dropped: one view positive, the other negative
    conflict_ids: tuple[str, ...]  # their ids


class MVSA(NamedTuple):
    """``(streams, labels, info)``: unpacks like ``(streams, labels)`` plus the notes."""

    streams: dict[str, torch.Tensor]  # modality -> float32 [n, ...], in MODALITIES order
    labels: torch.Tensor  # [n] int64 indices into CLASSES
    info: MVSAInfo


def combine_labels(text: str, image: str) -> str | None:
    """The pair's label from its two views' labels; None for a positive/negative conflict."""
    if text == image or image == "neutral":
        return text
    if text == "neutral":
        return image
    return None


def hash_text(text: str, dim: int) -> torch.Tensor:
    """``[dim]`` float32: ``log(1 + count)`` of the text's hashed word unigrams and bigrams."""
    words = _TOKEN.findall(_URL.sub(" url_token ", text.lower()))  # a link's characters say nothing
    grams = words + [f"{a} {b}" for a, b in zip(words, words[1:])]  # the space keeps "a b" apart from "ab"
    counts = np.zeros(dim, dtype=np.float32)
    for g in grams:
        counts[zlib.crc32(g.encode("utf-8")) % dim] += 1.0
    return torch.from_numpy(np.log1p(counts))


def load_mvsa(cfg: MVSAConfig) -> MVSA:
    """Read the copy under ``cfg.root``: see the module's docstring for the layout, the labels and the streams."""
    root = pathlib.Path(cfg.root)
    if not root.is_dir():
        raise DataError(f"mvsa: root {str(root)!r} is not a directory")
    data = root / DATA_DIR
    if not data.is_dir():
        raise DataError(f"mvsa: {str(data)!r} is not a directory (expected MVSA-Single's data folder)")
    rows = _read_labels(root / LABEL_FILE)
    kept, conflicts = [], []
    for tweet, text_label, image_label in rows:
        label = combine_labels(text_label, image_label)
        if label is None:
            conflicts.append(tweet)
        else:
            kept.append((tweet, CLASSES.index(label)))
    if not kept:
        raise DataError(f"mvsa: every pair in {str(root / LABEL_FILE)!r} is a positive/negative conflict")
    order = torch.randperm(len(kept), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    chosen = [kept[i] for i in order[:cfg.limit]]
    image = torch.stack([read_square_image(_image_path(data, tweet), cfg.image_size, True, "mvsa") for tweet, _ in chosen])
    text = torch.stack([hash_text(_read_text(data / f"{tweet}.txt"), cfg.text_dim) for tweet, _ in chosen])
    labels = torch.tensor([label for _, label in chosen], dtype=torch.int64)
    info = MVSAInfo(ids=tuple(t for t, _ in chosen), rows=len(rows), conflicts=len(conflicts),
                    conflict_ids=tuple(conflicts))
    return MVSA({"image": image, "text": text}, labels, info)


# -- files ---------------------------------------------------------------------------------------------------


def _read_labels(path: pathlib.Path) -> list[tuple[str, str, str]]:
    """``(id, text label, image label)`` per row of the label file."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise DataError(f"mvsa: label file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        fields = line.strip().split("\t")
        if not line.strip() or (number == 1 and fields[0].strip().lstrip("\ufeff").upper() == "ID"):
            continue  # blank lines and the header
        labels = fields[1].split(",") if len(fields) == 2 else []
        labels = [s.strip().lower() for s in labels]
        if len(labels) != 2 or not fields[0].strip() or any(s not in CLASSES for s in labels):
            raise DataError(f"mvsa: {str(path)!r} line {number} is not 'ID<TAB>text,image' with labels in "
                            f"{CLASSES}: {line.strip()[:80]!r}")
        rows.append((fields[0].strip(), labels[0], labels[1]))
    if not rows:
        raise DataError(f"mvsa: label file {str(path)!r} has no rows")
    return rows


def _read_text(path: pathlib.Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"mvsa: text {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # the tweets' files are a mix of encodings; Latin-1 decodes any byte
        return raw.decode("latin-1")


def _image_path(data: pathlib.Path, tweet: str) -> pathlib.Path:
    for suffix in IMAGE_SUFFIXES:
        path = data / f"{tweet}{suffix}"
        if path.is_file():
            return path
    raise DataError(f"mvsa: image {str(data / (tweet + '.jpg'))!r} (or .jpeg, .png) of a labelled pair is missing")


