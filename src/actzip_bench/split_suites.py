"""The data sets ``actzip bench split`` trains on, behind one loader: each a dict of modality streams
(``[n, ...]`` float32, in a fixed order) and labels, cut into a training and a test part by sample index.

- ``synthetic``: :mod:`actzip_bench.data.multimodal` (a large weak image-like stream, a small strong sensor
  stream, a large distractor);
- ``digits``: :mod:`actzip_bench.data.digits_views` (scikit-learn's bundled 8x8 digits cut into two image views,
  with a noisy sensor stream and a distractor);
- ``spoken-digits``: :mod:`actzip_bench.data.spoken_digits` (the digit's image and its name spoken by espeak-ng);
- ``crema-d`` and ``mvsa``: :mod:`actzip_bench.data.crema_d` and :mod:`actzip_bench.data.mvsa`, read from a
  local copy (``root``).

The samples come shuffled by each loader's seed, so a cut by index is a random split.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import torch

from actzip.errors import ConfigError, DataError
from actzip_bench.data.multimodal import MultimodalConfig, make_multimodal

__all__ = ["CLIENTS", "SUITES", "Suite", "load_suite"]

SUITES = ("synthetic", "digits", "spoken-digits", "crema-d", "mvsa")
CLIENTS = ("linear", "conv")
SYNTHETIC_WIDTHS = (256, 16, 256)  # the synthetic suite's encoders: image, sensor, distractor
MAX_WIDTH = 256  # elsewhere a linear encoder sends its modality's input size, at most this


@dataclass
class Suite:
    """A loaded data set, cut into training and test samples."""

    name: str  # one of SUITES
    streams: dict[str, torch.Tensor]  # modality -> [n, ...] float32, in the data set's order
    labels: torch.Tensor  # [n] int64
    train: int  # samples [0, train) train
    test: int  # samples [train, train + test) test
    info: dict = field(default_factory=dict)  # the loader's config and notes (for the record)

    def widths(self, given: tuple[int, ...] | None) -> list[int]:
        """Features each linear encoder sends: ``given``, else the suite's default."""
        if given is not None:
            if len(given) != len(self.streams):
                raise ConfigError(f"split sim: widths needs one entry per modality of {self.name} "
                                  f"{tuple(self.streams)}, got {tuple(given)}")
            return [int(w) for w in given]
        if self.name == "synthetic":
            return list(SYNTHETIC_WIDTHS)
        return [min(MAX_WIDTH, math.prod(x.shape[1:])) for x in self.streams.values()]

    def describe(self) -> dict:
        """What a record keeps of the suite."""
        if self.name == "synthetic":
            return dict(self.info)
        return {"name": self.name, "modalities": {m: list(x.shape[1:]) for m, x in self.streams.items()},
                "train": self.train, "test": self.test, **self.info}


def _cut(name: str, n: int, train: int | None, test: int | None) -> tuple[int, int]:
    train = train if train is not None else (n * 4) // 5
    test = test if test is not None else n - train
    if train < 1 or test < 1 or train + test > n:
        raise DataError(f"split sim: {name} has {n} samples; cannot train on {train} and test on {test}")
    return train, test


def _from_disk(name: str, root: str | None):
    if root is None:
        raise ConfigError(f"split sim: dataset {name} is read from a local copy: give data_root (--data-root)")
    if name == "crema-d":
        from actzip_bench.data.crema_d import CremaDConfig, load_crema_d

        cfg = CremaDConfig(root=root)
        loaded = load_crema_d(cfg)
    else:
        from actzip_bench.data.mvsa import MVSAConfig, load_mvsa

        cfg = MVSAConfig(root=root)
        loaded = load_mvsa(cfg)
    return loaded[0], loaded[1], {"config": {k: str(v) for k, v in asdict(cfg).items()}}


def load_suite(name: str, *, root: str | None = None, train: int | None = None, test: int | None = None,
               synthetic: MultimodalConfig | None = None, switched: bool = False) -> Suite:
    """Load data set ``name`` (``root``: its local copy, for those read from disk) and cut it. ``switched``
    (synthetic only): ``train + test`` samples as usual, then as many more after the suite's switch of which
    stream is informative (``MultimodalConfig.switch_at``), from index ``train + test`` on."""
    if name not in SUITES:
        raise ConfigError(f"split sim: dataset must be one of {SUITES}, got {name!r}")
    if switched and name != "synthetic":
        raise ConfigError(f"split sim: only the synthetic suite has a switch, got {name!r}")
    if name == "synthetic":
        train = 5000 if train is None else train
        test = 1000 if test is None else test
        suite = synthetic or MultimodalConfig(n=train + test)
        if switched:
            suite = replace(suite, n=2 * (train + test), switch_at=train + test)
        streams, labels = make_multimodal(suite)
        train, test = _cut(name, suite.n, train, test)
        return Suite(name, streams, labels, train, test, asdict(suite))
    if name == "digits":
        from actzip_bench.data.digits_views import DigitsViewsConfig, make_digits_views

        cfg = DigitsViewsConfig()
        streams, labels = make_digits_views(cfg)
        info = {"config": asdict(cfg)}
    elif name == "spoken-digits":
        from actzip_bench.data.spoken_digits import SpokenDigitsConfig, make_spoken_digits

        cfg = SpokenDigitsConfig()
        streams, labels = make_spoken_digits(cfg)
        info = {"config": asdict(cfg)}
    else:
        streams, labels, info = _from_disk(name, root)
    train, test = _cut(name, len(labels), train, test)
    return Suite(name, streams, labels, train, test, info)
