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

``batched=True`` hands ``value_fn`` every coalition needed at once (a list of sorted tuples) and takes a value
for each back: a server can score them all in one forward over the batch repeated once a coalition, instead of
one small forward a coalition.
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


def shapley(value_fn: Callable, n_modalities: int, samples: int | None = None, seed: int = 0,
            batched: bool = False) -> ShapleyScores:  # fmt: skip
    """Shapley values of ``n_modalities`` modalities under ``value_fn`` (see the module docstring).

    ``value_fn`` takes a sorted tuple of the present modalities' indices (``()`` for none) and returns a number;
    each coalition is evaluated once. With ``batched``, it takes the list of every coalition needed and returns
    a number for each, in order, in one call. ``samples``: random orders to average (default: exact up to
    ``EXACT_MAX`` modalities, else 200 orders); ``seed`` fixes them.
    """
    if not isinstance(n_modalities, int) or n_modalities < 1:
        raise ConfigError(f"shapley: n_modalities must be a positive int, got {n_modalities!r}")
    if samples is not None and (not isinstance(samples, int) or samples < 2):
        raise ConfigError(f"shapley: samples must be an int of at least 2 (orders to average), got {samples!r}")
    n = n_modalities
    exact = samples is None and n <= EXACT_MAX
    orders: list[list[int]] = []
    if exact:
        needed = [s for k in range(n + 1) for s in itertools.combinations(range(n), k)]
    else:
        rng = random.Random(seed)
        for _ in range(samples if samples is not None else 200):
            order = list(range(n))
            rng.shuffle(order)
            orders.append(order)
        needed = list(dict.fromkeys([()] + [tuple(sorted(o[:k])) for o in orders for k in range(1, n + 1)]))
    v = _evaluate(value_fn, needed, batched)
    if exact:
        values = []
        for i in range(n):
            others = [j for j in range(n) if j != i]
            phi = 0.0
            for k in range(n):
                weight = math.factorial(k) * math.factorial(n - k - 1) / math.factorial(n)
                phi += weight * sum(v[tuple(sorted((*s, i)))] - v[s] for s in itertools.combinations(others, k))
            values.append(phi)
        return ShapleyScores(tuple(values), (0.0,) * n, True, len(v), 0)
    sums, squares = [0.0] * n, [0.0] * n
    for order in orders:
        before = v[()]
        for k, i in enumerate(order, 1):
            after = v[tuple(sorted(order[:k]))]
            sums[i] += after - before
            squares[i] += (after - before) ** 2
            before = after
    count = len(orders)
    means = [s / count for s in sums]
    stderr = [math.sqrt(max(q / count - m * m, 0.0) * count / (count - 1) / count) for q, m in zip(squares, means)]
    return ShapleyScores(tuple(means), tuple(stderr), False, len(v), count)


def _evaluate(value_fn: Callable, coalitions: list[tuple[int, ...]], batched: bool) -> dict[tuple[int, ...], float]:
    """Every coalition's value, checked to be a finite number."""
    if batched:
        out = value_fn(list(coalitions))
        try:
            got = list(out)
        except TypeError as e:
            raise ConfigError(f"shapley: a batched value_fn must return one value a coalition, got {out!r}") from e
        if len(got) != len(coalitions):
            raise ConfigError(f"shapley: the batched value_fn returned {len(got)} values for {len(coalitions)} "
                              "coalitions")
    else:
        got = [value_fn(c) for c in coalitions]
    values = {}
    for key, out in zip(coalitions, got):
        try:
            values[key] = float(out)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"shapley: value_fn{key} returned {out!r}, not a number") from e
        if not math.isfinite(values[key]):
            raise ConfigError(f"shapley: value_fn{key} returned {values[key]}, not a finite number")
    return values
