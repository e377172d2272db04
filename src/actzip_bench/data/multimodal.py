"""A synthetic multimodal classification suite where a modality's size and its usefulness disagree.

Three streams per sample (ModalShare's setting, made without downloads):

- ``image``: large (``image_dim`` features) but weak: the class lives only in a small patch of ``patch``
  features, the rest is noise, and the patch itself is noisy;
- ``sensor``: small (``sensor_dim`` features) and strong: the class's pattern plus little noise, except that a
  ``corrupt`` share of samples have their sensor stream replaced by noise (per-sample corruption);
- ``distractor``: large (``distractor_dim`` features), pure noise.

``switch_at``: samples from that index on swap the roles of ``image`` and ``sensor`` (the sensor goes silent,
the image patch becomes clean): a mid-training switch of which stream is informative, for a loader that walks
the samples in order. Every sample is made from ``seed`` alone, so a split is the same on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from actzip.errors import ConfigError

__all__ = ["MODALITIES", "MultimodalConfig", "make_multimodal"]

MODALITIES = ("image", "sensor", "distractor")


@dataclass
class MultimodalConfig:
    """The suite's shape and difficulty."""

    n: int = 4096  # samples
    classes: int = 10  # labels
    image_dim: int = 1024  # features of the large, weak stream
    patch: int = 16  # of which carry the class
    image_noise: float = 3.0  # noise on the patch (the rest is unit noise)
    sensor_dim: int = 32  # features of the small, strong stream
    sensor_noise: float = 0.5  # noise on the sensor's class pattern
    corrupt: float = 0.2  # share of samples whose sensor stream is noise
    distractor_dim: int = 1024  # features of the noise stream
    switch_at: int | None = None  # from this sample on, image informative and sensor silent
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1 or self.classes < 2:
            raise ConfigError(f"multimodal: n must be >= 1 and classes >= 2, got n={self.n}, classes={self.classes}")
        if not 0 < self.patch <= self.image_dim:
            raise ConfigError(f"multimodal: patch must be in 1..image_dim ({self.image_dim}), got {self.patch}")
        if not 0.0 <= self.corrupt <= 1.0:
            raise ConfigError(f"multimodal: corrupt is a share of samples in [0, 1], got {self.corrupt}")
        if self.switch_at is not None and not 0 <= self.switch_at <= self.n:
            raise ConfigError(f"multimodal: switch_at must be a sample index in [0, n], got {self.switch_at}")

    def sizes(self) -> dict[str, int]:
        """Features per modality."""
        return {"image": self.image_dim, "sensor": self.sensor_dim, "distractor": self.distractor_dim}


def make_multimodal(cfg: MultimodalConfig) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``(streams, labels)``: a float32 ``[n, dim]`` tensor per modality of :data:`MODALITIES`, int64 labels."""
    g = torch.Generator().manual_seed(cfg.seed)
    y = torch.randint(0, cfg.classes, (cfg.n,), generator=g)
    patterns = torch.randn(cfg.classes, cfg.patch, generator=g)  # the image patch's class means
    codes = torch.randn(cfg.classes, cfg.sensor_dim, generator=g)  # the sensor's class means
    image = torch.randn(cfg.n, cfg.image_dim, generator=g)
    start = int(torch.randint(0, cfg.image_dim - cfg.patch + 1, (1,), generator=g))
    patch_noise = torch.randn(cfg.n, cfg.patch, generator=g) * cfg.image_noise
    sensor = codes[y] + torch.randn(cfg.n, cfg.sensor_dim, generator=g) * cfg.sensor_noise
    corrupted = torch.rand(cfg.n, generator=g) < cfg.corrupt
    sensor[corrupted] = torch.randn(int(corrupted.sum()), cfg.sensor_dim, generator=g)
    distractor = torch.randn(cfg.n, cfg.distractor_dim, generator=g)
    late = torch.zeros(cfg.n, dtype=torch.bool)
    if cfg.switch_at is not None:
        late[cfg.switch_at:] = True
    image[:, start:start + cfg.patch] = patterns[y] + torch.where(late[:, None], patch_noise * 0.1, patch_noise)
    sensor[late] = torch.randn(int(late.sum()), cfg.sensor_dim, generator=g)
    return {"image": image, "sensor": sensor, "distractor": distractor}, y
