"""Choose one option per recovery unit: least step time under a memory budget and a risk budget (HiGHS MILP).

Each unit ``u`` takes exactly one option ``o`` (binary ``x[u, o]``). The step's predicted peak is
``base + Σ bytes[u, o]·x[u, o] + z``, where ``z`` is the largest recompute working set of a chosen option (a
checkpointed unit makes all its saved tensors again during its backward: ``z ≥ transient[u, o]·x[u, o]``). The
objective is the added step time ``Σ seconds[u, o]·x[u, o]``; the risk constraint
``Σ exposure[u]·risk[u, o]·x[u, o] ≤ max_risk`` keeps lossy options out where the gradient they would perturb
weighs most. Solved with :func:`scipy.optimize.milp` (HiGHS).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from actzip.errors import ConfigError, MissingDependencyError

__all__ = ["UnitCosts", "minimum_peak", "solve"]


@dataclass(frozen=True)
class UnitCosts:
    """What each option of one unit costs, as measured by the profiler."""

    name: str  # the unit's module path
    options: tuple[str, ...]  # option names, in the order of the tuples below
    bytes: tuple[float, ...]  # bytes the unit keeps for backward under each option
    seconds: tuple[float, ...]  # step time each option adds (keep: 0)
    risk: tuple[float, ...]  # relative gradient error each option causes (lossless ones: 0)
    transient: tuple[float, ...]  # bytes made again during the unit's backward (checkpoint), else 0
    exposure: float = 1.0  # weight of this unit's risk (how much gradient its activations carry)

    def __post_init__(self) -> None:
        n = len(self.options)
        if n == 0 or any(len(v) != n for v in (self.bytes, self.seconds, self.risk, self.transient)):
            raise ConfigError(f"planner: unit {self.name!r} needs one bytes, seconds, risk and transient value per "
                              f"option ({n} options)")


def _milp():
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError as e:
        raise MissingDependencyError("the memory planner solves with scipy's HiGHS: pip install 'actzip[planner]' "
                                     "(scipy >= 1.9)") from e
    return Bounds, LinearConstraint, milp


def _byte_unit(units: list[UnitCosts]) -> float:
    """The bytes the problem counts in: its largest byte figure. Raw byte counts (1e9 and more) beside added
    seconds (1e-3) leave HiGHS's tolerances far too coarse: it proved plans optimal that cost four times the
    optimum's time. In units of the largest figure every coefficient is at most 1."""
    return max([1.0, *(b for u in units for b in (*u.bytes, *u.transient))])


def _problem(units: list[UnitCosts], max_risk: float):
    """The one-option-per-unit, transient and risk rows shared by both problems; ``z`` is the last variable.
    Bytes are counted in units of :func:`_byte_unit`."""
    Bounds, LinearConstraint, _ = _milp()
    unit = _byte_unit(units)
    n = sum(len(u.options) for u in units)
    rows, lo, hi = [], [], []
    col = 0
    risk = np.zeros(n + 1)
    for u in units:
        one = np.zeros(n + 1)
        for k in range(len(u.options)):
            one[col + k] = 1.0
            risk[col + k] = u.exposure * u.risk[k]
            if u.transient[k] > 0:
                t = np.zeros(n + 1)
                t[col + k], t[n] = u.transient[k] / unit, -1.0
                rows.append(t), lo.append(-np.inf), hi.append(0.0)
        rows.append(one), lo.append(1.0), hi.append(1.0)
        col += len(u.options)
    rows.append(risk), lo.append(-np.inf), hi.append(max_risk)
    bytes_row = np.concatenate([np.array([b for u in units for b in u.bytes], dtype=float) / unit, [1.0]])
    integrality = np.concatenate([np.ones(n), [0]])
    bounds = Bounds(np.zeros(n + 1), np.concatenate([np.ones(n), [np.inf]]))
    return LinearConstraint(np.array(rows), lo, hi), bytes_row, integrality, bounds


def _choices(units: list[UnitCosts], x: np.ndarray) -> list[int]:
    out, col = [], 0
    for u in units:
        out.append(int(np.argmax(x[col:col + len(u.options)])))
        col += len(u.options)
    return out


def minimum_peak(units: list[UnitCosts], base_bytes: float, max_risk: float, time_limit: float = 10.0) -> float:
    """The smallest predicted peak any plan within ``max_risk`` reaches."""
    _, LinearConstraint, milp = _milp()
    shared, bytes_row, integrality, bounds = _problem(units, max_risk)
    res = milp(bytes_row, constraints=[shared], integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit})
    if res.x is None:
        raise ConfigError(f"planner: no plan keeps the risk within max_risk={max_risk} (HiGHS: {res.message})")
    return base_bytes + float(res.fun) * _byte_unit(units)


def solve(units: list[UnitCosts], budget_bytes: float, base_bytes: float, max_risk: float,
          time_limit: float = 10.0) -> list[int]:
    """The chosen option index of each unit; a ConfigError giving the smallest feasible peak if none fits."""
    if not units:
        raise ConfigError("planner: no units to plan")
    _, LinearConstraint, milp = _milp()
    shared, bytes_row, integrality, bounds = _problem(units, max_risk)
    # the added time alone: a bytes tie-break would give every unit its own objective and the branch and bound
    # many near-equal plans to tell apart (several times slower on hundreds of units)
    seconds = np.concatenate([np.array([s for u in units for s in u.seconds], dtype=float), [0.0]])
    budget = LinearConstraint(bytes_row[None, :], -np.inf, (budget_bytes - base_bytes) / _byte_unit(units))
    res = milp(seconds, constraints=[shared, budget], integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit})
    if res.x is not None and res.status != 0:
        warnings.warn(f"actzip planner: HiGHS stopped before proving the plan fastest ({res.message}); the plan "
                      "fits the budgets", stacklevel=2)
    if res.x is None:
        least = minimum_peak(units, base_bytes, max_risk, time_limit)
        raise ConfigError(f"planner: budget_bytes={budget_bytes:,.0f} is below the smallest feasible peak "
                          f"{least:,.0f} bytes (max_risk={max_risk}); raise the budget or allow lossy options")
    return _choices(units, res.x)
