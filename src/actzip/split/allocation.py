"""Keep-ratios for a split-learning client's modalities under one uplink budget.

Every policy gets the same expected payload: ``sum(ratio_i * size_i) == budget``, with each ratio in ``[0, 1]``
(a ratio is the expected share of a modality's elements sent). ModalShare's ratios give each modality a share of
the payload that follows its score: ``ratio_i * size_i = min(size_i, lam * w_i)`` with ``w_i = max(score_i, 0)``,
``lam`` set so the payload is the budget (water-filling: a modality sent whole hands what it cannot take to the
others, in proportion to their scores). A small but useful modality is thus sent whole before a large weak one
gets more, where equal keep-ratios (``ratio_i = budget / sum(sizes)``) give every modality bytes by its size.
A modality whose score is not positive gets ratio 0 (listed in ``dropped``); when no score is positive, every
modality gets the equal ratio and ``fallback`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from actzip.errors import ConfigError

__all__ = ["KeepRatios", "equal_keep_ratios", "keep_ratios"]


@dataclass(frozen=True)
class KeepRatios:
    """Per-modality keep-ratios and why some are what they are."""

    ratios: tuple[float, ...]  # in [0, 1], sum(ratio * size) == budget
    dropped: tuple[int, ...]  # modalities given 0 for a score that is not positive
    saturated: tuple[int, ...]  # modalities sent whole (ratio 1)
    fallback: str | None  # why the ratios are not score-driven, else None

    def payload(self, sizes: Sequence[float]) -> float:
        """Expected elements sent: ``sum(ratio * size)``."""
        return math.fsum(r * s for r, s in zip(self.ratios, sizes))


def _check(sizes: Sequence[float], budget: float) -> list[float]:
    sizes = [float(s) for s in sizes]
    if not sizes or any(not math.isfinite(s) or s <= 0 for s in sizes):
        raise ConfigError(f"keep_ratios: sizes must be positive element counts, one per modality, got {sizes}")
    total = math.fsum(sizes)
    if not math.isfinite(budget) or budget <= 0 or budget > total:
        raise ConfigError(f"keep_ratios: budget must be in (0, {total:g}] (the modalities' total size), got {budget}")
    return sizes


def equal_keep_ratios(sizes: Sequence[float], budget: float) -> KeepRatios:
    """The same ratio for every modality: ``budget / sum(sizes)``."""
    sizes = _check(sizes, budget)
    r = min(1.0, budget / math.fsum(sizes))
    return KeepRatios((r,) * len(sizes), (), tuple(range(len(sizes))) if r == 1.0 else (), None)


def keep_ratios(scores: Sequence[float], sizes: Sequence[float], budget: float) -> KeepRatios:
    """ModalShare's keep-ratios from ``scores`` (Shapley values, say) for modalities of ``sizes`` elements under
    ``budget`` expected elements (see the module docstring)."""
    sizes = _check(sizes, budget)
    if len(scores) != len(sizes):
        raise ConfigError(f"keep_ratios: {len(scores)} scores for {len(sizes)} modalities")
    if any(not math.isfinite(float(s)) for s in scores):
        raise ConfigError(f"keep_ratios: scores must be finite, got {list(scores)}")
    w = [max(float(s), 0.0) for s in scores]
    live = [i for i, x in enumerate(w) if x > 0]
    if not live:
        eq = equal_keep_ratios(sizes, budget)
        return KeepRatios(eq.ratios, (), eq.saturated, "no modality has a positive score: equal keep-ratios")
    if budget > math.fsum(sizes[i] for i in live):
        # the useful modalities cannot absorb the budget: send them whole, the rest share what is left equally
        rest = [i for i in range(len(sizes)) if i not in live]
        left = budget - math.fsum(sizes[i] for i in live)
        r = left / math.fsum(sizes[i] for i in rest)
        ratios = [1.0 if i in live else r for i in range(len(sizes))]
        return KeepRatios(tuple(ratios), (), tuple(live), "the positively scored modalities sent whole take less "
                          "than the budget: the others share the rest equally")
    # water-filling on bytes: by decreasing score per element, a modality that lam * w would give more than its
    # size is sent whole
    order = sorted(live, key=lambda i: -w[i] / sizes[i])
    saturated: list[int] = []
    for i in order:
        free = order[len(saturated):]
        lam = (budget - math.fsum(sizes[j] for j in saturated)) / math.fsum(w[j] for j in free)
        if lam * w[i] <= sizes[i]:
            break
        saturated.append(i)
    ratios = [0.0] * len(sizes)
    for i in saturated:
        ratios[i] = 1.0
    for i in order[len(saturated):]:
        ratios[i] = min(1.0, lam * w[i] / sizes[i])
    dropped = tuple(i for i in range(len(sizes)) if w[i] == 0)
    return KeepRatios(tuple(ratios), dropped, tuple(saturated), None)
