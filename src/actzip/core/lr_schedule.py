"""Learning-rate schedules shared by the runners and benchmarks.

``cosine``: a linear warm-up over the first 5% of ``total`` steps, times a cosine decay from the base rate to a
tenth of it over ``total`` steps; after ``total`` the rate stays at a tenth (a run that trains on towards a
target keeps its final rate). ``constant``: the base rate throughout.
"""

from __future__ import annotations

import math

import torch

from actzip.errors import ConfigError

LR_SCHEDULES = ("constant", "cosine")


def lr_factor(kind: str, step: int, total: int | None) -> float:
    """The multiple of the base rate at optimizer step ``step`` (0-based) of a ``kind`` schedule ``total`` long."""
    if kind == "constant":
        return 1.0
    warm = max(1, total // 20)
    return min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))


def check_lr_schedule(owner: str, kind: str, total: int | None) -> None:
    """A :class:`ConfigError` naming ``owner`` unless ``kind`` is known and a cosine has a positive length."""
    if kind not in LR_SCHEDULES:
        raise ConfigError(f"{owner}: lr_schedule must be one of {list(LR_SCHEDULES)}, got {kind!r}")
    if kind == "cosine" and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
        raise ConfigError(f"{owner}: a cosine lr_schedule needs its length in steps (a positive int), got {total!r}")


def lr_scheduler(optimizer: torch.optim.Optimizer, kind: str, total: int | None,
                 owner: str = "lr_scheduler") -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` of ``optimizer`` following :func:`lr_factor`; call its ``step()`` after each optimizer step."""
    check_lr_schedule(owner, kind, total)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(kind, s, total))
