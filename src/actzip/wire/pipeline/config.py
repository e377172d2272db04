"""How a pipeline runs: :class:`PipelineConfig`, the same on every stage (the handshake checks)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from actzip.api import Config
from actzip.compat import warn_once
from actzip.core.lr_schedule import check_lr_schedule
from actzip.core.optim import OPTIMIZERS
from actzip.errors import ConfigError
from actzip.wire.boundaries import format_boundary, parse_boundary
from actzip.wire.codecs import WireCodec
from actzip.wire.pipeline.schedule import SCHEDULES

__all__ = ["PipelineConfig"]


@dataclass
class PipelineConfig(Config):
    """How a pipeline runs; every stage must be given the same one (the handshake checks).

    ``boundary`` names the boundary ends the stages hold (built with :func:`actzip.wire.make_boundary`), if
    given;
    ``codec`` is the byte codec applied to what crosses each boundary, both ways unless ``fwd_codec`` /
    ``bwd_codec`` say otherwise.
    """

    schedule: str = "1f1b"  # microbatch order: "gpipe" or "1f1b"
    microbatches: int = 4  # microbatches per step; the batch size must be a multiple
    # spec of the stages' boundary ends ("stiefel:16"), checked against them; None: whatever they hold (each
    # link's two ends still compare their kinds in the handshake)
    boundary: str | None = None
    codec: str = "none"  # byte codec spec of both directions (see actzip.wire.codecs)
    fwd_codec: str | None = None  # codec spec for activations sent forward; None: codec
    bwd_codec: str | None = None  # codec spec for gradients sent backward; None: codec
    timeout_s: float = 60.0  # longest wait for a message from a peer before a WireTimeoutError
    lr: float = 1e-3  # learning rate (each stage has its own optimizer)
    # "adamw", or "muon": Muon on the hidden matrices (boundary projections included), AdamW on embeddings, the
    # output head, biases and norms, at the same rate (see actzip.core.optim)
    optimizer: str = "adamw"
    # "constant", or "cosine": 5% linear warm-up, then cosine decay to lr / 10 over lr_steps optimizer steps
    # (see actzip.core.lr_schedule); a stage's own optimizer (configure_optimizer) follows it too
    lr_schedule: str = "constant"
    lr_steps: int | None = None  # length of the cosine schedule in steps (needed for "cosine")
    # one factor per stage: stage i trains at lr * stage_lr_scale[i] (each stage owns its optimizer, so the stages
    # on either side of a narrow boundary can learn at different rates); None: lr everywhere
    stage_lr_scale: tuple[float, ...] | None = None
    weight_decay: float = 0.1  # AdamW weight decay on matrices and embeddings (>= 2 dims)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW betas
    seed: int = 0  # base seed of the codecs' random draws
    compressor: str | None = None  # deprecated: the boundary's name, now part of `boundary`
    ratio: float | None = None  # deprecated: the boundary's ratio, now part of `boundary`

    def validate(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"PipelineConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        m = self.microbatches
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ConfigError(f"PipelineConfig.microbatches must be a positive int, got {m!r}")
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
            raise ConfigError(f"PipelineConfig.timeout_s must be a positive number of seconds, got {t!r}")
        check_lr_schedule("PipelineConfig", self.lr_schedule, self.lr_steps)
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"PipelineConfig.optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.compressor is not None or self.ratio is not None:
            warn_once("PipelineConfig(compressor=..., ratio=...)", "PipelineConfig(boundary='name:ratio')")
            name = self.compressor or parse_boundary(self.boundary or "dense")[0]
            self.boundary = format_boundary(name, None if self.ratio in (None, 1, 1.0) else {"ratio": self.ratio})
            self.compressor = self.ratio = None
        try:
            if self.boundary is not None:
                parse_boundary(self.boundary)
        except ConfigError as e:
            raise ConfigError(f"PipelineConfig.boundary: {e}") from None
        WireCodec(self.fwd_spec, direction="fwd")  # raises a ConfigError naming a bad spec now, not later
        WireCodec(self.bwd_spec, direction="bwd")
        if self.stage_lr_scale is not None:
            scale = self.stage_lr_scale
            if not isinstance(scale, (tuple, list)) or not scale or not all(
                    isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f < math.inf for f in scale):
                raise ConfigError(f"PipelineConfig.stage_lr_scale must be positive finite numbers, one per stage, "
                                  f"got {scale!r}")
            self.stage_lr_scale = tuple(float(f) for f in scale)

    @property
    def fwd_spec(self) -> str:
        """The forward codec spec in force."""
        return self.codec if self.fwd_codec is None else self.fwd_codec

    @property
    def bwd_spec(self) -> str:
        """The backward codec spec in force."""
        return self.codec if self.bwd_codec is None else self.bwd_codec

    def stage_lr(self, stage: int, n_stages: int) -> float:
        """The learning rate of ``stage`` of ``n_stages``."""
        if self.stage_lr_scale is None:
            return self.lr
        if len(self.stage_lr_scale) != n_stages:
            raise ConfigError(f"PipelineConfig.stage_lr_scale has {len(self.stage_lr_scale)} factors for "
                              f"{n_stages} stages: give one per stage")
        return self.lr * self.stage_lr_scale[stage]
