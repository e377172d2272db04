"""Shapley contribution of each modality to a server-side value, from coalitions of modalities.

ModalShare scores a split-learning client's modalities on the server, from activations it has already received:
``value_fn(coalition)`` is the server model's quality (accuracy, negative loss) on a batch with only the
modalities in ``coalition`` present (the others masked), so scoring costs no uplink and no client work. The
Shapley value of modality ``i`` is its marginal gain ``v(S + i) - v(S)`` averaged over every order in which the
modalities could join:

    phi_i = sum over S not holding i of |S|! (n - |S| - 1)! / n! * (v(S + i) - v(S))

Exact for up to ``EXACT_MAX`` modalities (all ``2**n`` coalitions, each evaluated once); beyond, or when
``samples`` is given, estimated from ``samples`` random orders (every order's marginals sum to
``v(all) - v(none)``, so the estimate keeps that sum exactly), with the standard error of each mean reported.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable

from actzip.errors import ConfigError

__all__ = ["EXACT_MAX", "ShapleyScores", "shapley"]

EXACT_MAX = 8  # exact enumeration up to 2**8 = 256 coalitions


@dataclass(frozen=True)
class ShapleyScores:
    """Per-modality Shapley values and how they were had."""

    values: tuple[float, ...]  # phi_i, in the value function's unit
    stderr: tuple[float, ...]  # standard error of each value (0.0 when exact)
    exact: bool  # every coalition enumerated
    evaluations: int  # calls of the value function (distinct coalitions)
    orders: int  # random orders sampled (0 when exact)


def shapley(value_fn: Callable[[tuple[int, ...]], float], n_modalities: int, samples: int | None = None,
            seed: int = 0) -> ShapleyScores:  # fmt: skip
    """Shapley values of ``n_modalities`` modalities under ``value_fn`` (see the module docstring).

    ``value_fn`` takes a sorted tuple of the present modalities' indices (``()`` for none) and returns a number;
    each coalition is evaluated once. ``samples``: random orders to average (default: exact up to
    ``EXACT_MAX`` modalities, else 200 orders); ``seed`` fixes them.
    """
    if not isinstance(n_modalities, int) or n_modalities < 1:
        raise ConfigError(f"shapley: n_modalities must be a positive int, got {n_modalities!r}")
    if samples is not None and (not isinstance(samples, int) or samples < 2):
        raise ConfigError(f"shapley: samples must be an int of at least 2 (orders to average), got {samples!r}")
    cache: dict[tuple[int, ...], float] = {}

    def v(coalition) -> float:
        key = tuple(sorted(coalition))
        if key not in cache:
            out = value_fn(key)
            try:
                cache[key] = float(out)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"shapley: value_fn{key} returned {out!r}, not a number") from e
            if not math.isfinite(cache[key]):
                raise ConfigError(f"shapley: value_fn{key} returned {cache[key]}, not a finite number")
        return cache[key]

    n = n_modalities
    if samples is None and n <= EXACT_MAX:
        values = []
        for i in range(n):
            others = [j for j in range(n) if j != i]
            phi = 0.0
            for k in range(n):
                weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                phi += weight * sum(v((*s, i)) - v(s) for s in itertools.combinations(others, k))
            values.append(phi)
        return ShapleyScores(tuple(values), (0.0,) * n, True, len(cache), 0)
    orders = samples if samples is not None else 200
    rng = random.Random(seed)
    sums, squares = [0.0] * n, [0.0] * n
    for _ in range(orders):
        order = list(range(n))
        rng.shuffle(order)
        present: list[int] = []
        before = v(())
        for i in order:
            present.append(i)
            after = v(present)
            sums[i] += after - before
            squares[i] += (after - before) ** 2
            before = after
    means = [s / orders for s in sums]
    stderr = [math.sqrt(max(q / orders - m * m, 0.0) * orders / (orders - 1) / orders) for q, m in zip(squares, means)]
    return ShapleyScores(tuple(means), tuple(stderr), False, len(cache), orders)
