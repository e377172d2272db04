"""Keep-ratios for a split-learning client's modalities under one uplink budget.

Every policy gets the same expected payload: ``sum(ratio_i * size_i) == budget``, with each ratio in ``[0, 1]``
(a ratio is the expected share of a modality's elements sent). ModalShare's ratios give each modality a share of
the payload that follows its score: ``ratio_i * size_i = min(size_i, lam * w_i)`` with ``w_i = max(score_i, 0)``,
``lam`` set so the payload is the budget (water-filling: a modality sent whole hands what it cannot take to the
others, in proportion to their scores). A small but useful modality is thus sent whole before a large weak one
gets more, where equal keep-ratios (``ratio_i = budget / sum(sizes)``) give every modality bytes by its size.
A modality whose score is not positive gets ratio 0 (listed in ``dropped``); when no score is positive, every
modality gets the equal ratio and ``fallback`` says so. With ``floor``, each modality first gets its least ratio
(a compressor's smallest sendable payload, say: a modality that never arrives can never be scored again) and
the scores share what the floors leave of the budget, each modality up to what is left of its size.
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


def keep_ratios(scores: Sequence[float], sizes: Sequence[float], budget: float,
                floor: Sequence[float] | None = None) -> KeepRatios:
    """ModalShare's keep-ratios from ``scores`` (Shapley values, say) for modalities of ``sizes`` elements under
    ``budget`` expected elements (see the module docstring).

    ``floor``: a least ratio per modality, given before the scores share the rest (a compressor's smallest
    sendable payload, so that a modality scored out still arrives and can be scored again). Floors that do not
    fit the budget together are dropped, the largest payload first, and ``fallback`` says which."""
    sizes = _check(sizes, budget)
    if len(scores) != len(sizes):
        raise ConfigError(f"keep_ratios: {len(scores)} scores for {len(sizes)} modalities")
    if any(not math.isfinite(float(s)) for s in scores):
        raise ConfigError(f"keep_ratios: scores must be finite, got {list(scores)}")
    floors, note = _floors(floor, sizes, budget)
    caps = [s * (1.0 - f) for s, f in zip(sizes, floors)]  # what the scores can still add, in elements
    left = budget - math.fsum(f * s for f, s in zip(floors, sizes))
    w = [max(float(s), 0.0) for s in scores]
    live = [i for i, x in enumerate(w) if x > 0 and caps[i] > 0]
    extra, saturated, fallback = _water_fill(w, caps, left, live)
    ratios = tuple(min(1.0, f + (e / s)) for f, e, s in zip(floors, extra, sizes))
    saturated = tuple(i for i in range(len(sizes)) if ratios[i] == 1.0 and (i in saturated or caps[i] == 0))
    dropped = tuple(i for i in range(len(sizes)) if w[i] == 0 and fallback is None)
    reasons = "; ".join(r for r in (fallback, note) if r)
    return KeepRatios(ratios, dropped, saturated, reasons or None)


def _floors(floor: Sequence[float] | None, sizes: list[float], budget: float) -> tuple[list[float], str | None]:
    if floor is None:
        return [0.0] * len(sizes), None
    floors = [float(f) for f in floor]
    if len(floors) != len(sizes) or any(not 0.0 <= f <= 1.0 for f in floors):
        raise ConfigError(f"keep_ratios: floor must be one ratio in [0, 1] per modality ({len(sizes)}), got {floors}")
    cut = []
    for i in sorted(range(len(sizes)), key=lambda j: -floors[j] * sizes[j]):
        if math.fsum(f * s for f, s in zip(floors, sizes)) <= budget:
            break
        floors[i] = 0.0
        cut.append(i)
    note = (f"the floors do not fit the budget together: modalities {sorted(cut)} get none" if cut else None)
    return floors, note


def _water_fill(w: list[float], caps: list[float], left: float, live: list[int]):
    """Extra elements per modality: ``left`` shared by score ``w`` up to ``caps`` (by decreasing score per
    element, a modality whose share would pass its cap gets the cap); the saturated ones; a fallback reason."""
    n = len(caps)
    if left <= 0:
        return [0.0] * n, (), None
    if not live:
        total = math.fsum(caps)
        return [left * c / total for c in caps], (), "no modality has a positive score: equal keep-ratios"
    if left >= math.fsum(caps[i] for i in live):
        # the useful modalities cannot absorb the budget: send them whole, the rest share what is left equally
        rest = [i for i in range(n) if i not in live]
        spare = left - math.fsum(caps[i] for i in live)
        total = math.fsum(caps[i] for i in rest)
        extra = [caps[i] if i in live else (spare * caps[i] / total if total else 0.0) for i in range(n)]
        return extra, tuple(live), ("the positively scored modalities sent whole take less than the budget: "
                                    "the others share the rest equally")
    order = sorted(live, key=lambda i: -w[i] / caps[i])
    saturated: list[int] = []
    for i in order:
        free = order[len(saturated):]
        lam = (left - math.fsum(caps[j] for j in saturated)) / math.fsum(w[j] for j in free)
        if lam * w[i] <= caps[i]:
            break
        saturated.append(i)
    extra = [0.0] * n
    for i in saturated:
        extra[i] = caps[i]
    for i in order[len(saturated):]:
        extra[i] = min(caps[i], lam * w[i])
    return extra, tuple(saturated), None
