"""scikit-learn's handwritten digits cut into views, plus a noisy sensor and a noise stream: no download.

``sklearn.datasets.load_digits()`` ships 1,797 grayscale 8x8 images of the digits 0-9 inside the scikit-learn
wheel. Each image becomes several streams, in the order of :data:`MODALITIES`:

- ``top``: rows 0-3 of the image, ``[n, 1, 4, 8]``, pixels scaled to [0, 1] plus ``pixel_noise``;
- ``bottom``: rows 4-7, ``[n, 1, 4, 8]``, likewise;
- ``sensor``: ``[n, sensor_dim]``: a per-class code plus ``sensor_noise``, except that a ``corrupt`` share of
  the samples carry pure noise instead (a sensor that fails now and then);
- ``distractor``: ``[n, distractor_dim]`` of pure noise, left out of the dict when ``distractor_dim`` is 0.

Why the modalities disagree: the two image halves are the same size and about as telling overall, but about
different digits (the top tells a 5 from the rest far better than the bottom, the bottom a 7 or a 2 better than
the top), so the pair beats either half; the sensor is the smallest stream and the most accurate on the
samples where it works, but useless on the corrupted ones; the distractor is the largest stream and tells
nothing. A client under one uplink budget should spend it on the small sensor and the image,
not on the distractor, and the views stay spatial so that a convolution or a DCT along space can read them.

The sample order is shuffled by ``seed``, so a cut by index is a random split; every stream is made from
``seed`` alone with a private ``torch.Generator``, so the same config gives bit-identical tensors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from actzip.errors import ConfigError, MissingDependencyError

__all__ = ["CLASSES", "DIGITS", "MODALITIES", "DigitsViewsConfig", "digit_images", "make_digits_views",
           "noisy_sensor"]

MODALITIES = ("top", "bottom", "sensor", "distractor")  # the dict's order; "distractor" only when its width > 0
CLASSES = 10  # the digits 0-9; label i is the digit i
DIGITS = 1797  # images in scikit-learn's digits
PIXEL_MAX = 16.0  # the digits' pixels are counts 0..16 (4x4 blocks of a 32x32 bitmap)


@dataclass
class DigitsViewsConfig:
    """How many samples, and how noisy each stream is."""

    n: int | None = None  # samples, each a distinct image; None: all 1,797
    pixel_noise: float = 0.1  # std of Gaussian noise added to the image views (pixels are in [0, 1])
    sensor_dim: int = 8  # features of the small sensor stream
    sensor_noise: float = 1.0  # std of the noise on the sensor's unit-variance class code
    corrupt: float = 0.2  # share of samples whose sensor stream is pure noise
    distractor_dim: int = 256  # features of the noise stream; 0 leaves it out
    seed: int = 0  # the sample order, the class codes and every noise draw

    def __post_init__(self) -> None:
        if self.n is not None and (not _is_int(self.n) or not 1 <= self.n <= DIGITS):
            raise ConfigError(f"digits_views: n must be None or an int in 1..{DIGITS} (scikit-learn has that many "
                              f"images), got {self.n!r}")
        _check_int("digits_views", "sensor_dim", self.sensor_dim, minimum=1)
        _check_int("digits_views", "distractor_dim", self.distractor_dim, minimum=0)
        _check_int("digits_views", "seed", self.seed, minimum=0)
        for name in ("pixel_noise", "sensor_noise"):
            _check_noise("digits_views", name, getattr(self, name))
        _check_share("digits_views", "corrupt", self.corrupt)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Each stream's shape, in the order of :data:`MODALITIES` (``distractor`` only when it is made)."""
        n = DIGITS if self.n is None else self.n
        shapes = {"top": (n, 1, 4, 8), "bottom": (n, 1, 4, 8), "sensor": (n, self.sensor_dim)}
        if self.distractor_dim:
            shapes["distractor"] = (n, self.distractor_dim)
        return shapes


def make_digits_views(cfg: DigitsViewsConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(streams, labels)``: float32 streams shaped as :meth:`DigitsViewsConfig.shapes`, int64 labels ``[n]``."""
    images, labels = digit_images()
    g = torch.Generator().manual_seed(cfg.seed)
    n = DIGITS if cfg.n is None else cfg.n
    order = torch.randperm(DIGITS, generator=g)[:n]  # shuffled, so a cut by index is a random split
    x, y = images[order], labels[order]
    x = x + torch.randn(x.shape, generator=g) * cfg.pixel_noise
    streams = {"top": x[:, None, :4, :].contiguous(), "bottom": x[:, None, 4:, :].contiguous()}
    streams["sensor"] = noisy_sensor(y, cfg.sensor_dim, cfg.sensor_noise, cfg.corrupt, g)
    if cfg.distractor_dim:
        streams["distractor"] = torch.randn(n, cfg.distractor_dim, generator=g)
    return streams, y


def digit_images() -> tuple[torch.Tensor, torch.Tensor]:
    """All of scikit-learn's digits: float32 ``[1797, 8, 8]`` in [0, 1] and int64 labels ``[1797]``.

    Fresh tensors on every call (the loaded arrays are cached), so a caller may change them in place.
    """
    try:  # on every call, not only the first: the arrays are cached, the check is cheap
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise MissingDependencyError(
            "digits_views: scikit-learn's bundled digits need scikit-learn; pip install 'actzip[bench]'") from e
    pixels, labels = _load_digits(load_digits)
    return torch.from_numpy(pixels).reshape(DIGITS, 8, 8).float() / PIXEL_MAX, torch.from_numpy(labels).long()


def noisy_sensor(labels: torch.Tensor, dim: int, noise: float, corrupt: float,
                 generator: torch.Generator) -> torch.Tensor:
    """A float32 ``[n, dim]`` sensor stream for int ``labels``: each class's code plus noise, a share corrupted.

    The codes are unit-variance Gaussian vectors drawn from ``generator``; exactly ``round(corrupt * n)``
    samples, chosen at random, are replaced by unit noise, so the stream's accuracy drops by that share (less
    the chance hits among them) and a classifier cannot tell a corrupted sample by its scale.
    """
    n = labels.shape[0]
    codes = torch.randn(CLASSES, dim, generator=generator)
    sensor = codes[labels] + torch.randn(n, dim, generator=generator) * noise
    # the clean streams' per-feature spread is sqrt(1 + noise^2); matching it keeps corruption invisible by scale
    broken = torch.randperm(n, generator=generator)[:round(corrupt * n)]
    sensor[broken] = torch.randn(len(broken), dim, generator=generator) * math.sqrt(1.0 + noise ** 2)
    return sensor


@functools.lru_cache(maxsize=1)
def _load_digits(load_digits):
    """The digits' pixels and labels as numpy arrays (read once per process; the caller must not change them)."""
    bunch = load_digits()
    return bunch.data, bunch.target


# -- config checks ------------------------------------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(where: str, name: str, value, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        raise ConfigError(f"{where}: {name} must be an int >= {minimum}, got {value!r}")


def _check_noise(where: str, name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value < math.inf:
        raise ConfigError(f"{where}: {name} is a noise std, a finite number >= 0, got {value!r}")


def _check_share(where: str, name: str, value) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{where}: {name} is a share of samples in [0, 1], got {value!r}")
