"""``compress_(model, PlannerConfig(budget_bytes=..., probe=...))``: each block of the model takes the option that
makes the step fastest while its peak stays under the budget (and lossy options' risk under ``max_risk``).

The handler finds the recovery units (:mod:`.units`), measures every option on the probe step
(:mod:`.profile`), solves (:mod:`.solver`) and wraps each unit's forward to run its option (:mod:`.planned`);
:func:`plan_of` returns the :class:`~actzip.memory.planner.plan.Plan` (``print(plan.table())``,
``plan.save(path)``; ``PlannerConfig(plan=path)`` uses a saved one instead of profiling). ``restore_`` unwraps.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from actzip.api import CompressReport, Config, FilterFn, add_undo, register_handler
from actzip.errors import ConfigError
from actzip.memory.planner.options import LOSSLESS, OPTIONS
from actzip.memory.planner.plan import Plan
from actzip.memory.planner.planned import PlannedUnits
from actzip.memory.planner.profile import NOISE_MARGIN, planned_peak, profile
from actzip.memory.planner.solver import UnitCosts
from actzip.memory.planner.units import GRANULARITIES, find_units, model_signature

__all__ = ["PlannerConfig", "plan_of", "set_exposure"]

_PLANNED = "actzip_planned_units"  # the model attribute holding its PlannedUnits
DEFAULT_OPTIONS = ("keep", "checkpoint", "lossless", "offload", "conservative", "balanced")
# Planned probe steps that check a fresh plan's peak on CUDA: the costs add up each unit's own measurements, and
# a mix of options can peak past their sum (one option's allocator blocks, gradients made while another unit's
# tensors are still held); each check past the budget counts its excess in the plan's base and solves again.
PEAK_CHECKS = 3


@dataclass
class PlannerConfig(Config):
    """A memory budget for the step, met by choosing per block among keep / checkpoint / cache presets."""

    # the step's peak above what is allocated before it (on the CPU: the units' saved bytes only); with a saved
    # plan, 0 keeps the plan's budget
    budget_bytes: int = 0
    # probe(model) -> loss: one step's forward on a representative batch (its shapes set the probe's tokens)
    probe: Callable[[nn.Module], torch.Tensor] | None = field(default=None, repr=False)
    max_risk: float = 0.0  # bound of Σ exposure · relative gradient error; 0 allows only the lossless options
    options: tuple[str, ...] = DEFAULT_OPTIONS  # the options a unit may take (see actzip.memory.planner.options)
    repeats: int = 3  # timed probe steps per option (after one warm-up)
    min_bytes: int = 0  # the cache options keep tensors smaller than this as they are
    plan: str | None = None  # path of a saved plan: used instead of profiling (its model must match)
    granularity: str = "block"  # "block": each repeated block is a unit; "sub-block": its attention, MLP, ...

    def validate(self) -> None:
        if self.plan is None and (not isinstance(self.budget_bytes, int) or isinstance(self.budget_bytes, bool)
                                  or self.budget_bytes <= 0):
            raise ConfigError(f"PlannerConfig.budget_bytes must be a positive int, got {self.budget_bytes!r}")
        if self.probe is not None and not callable(self.probe):
            raise ConfigError(f"PlannerConfig.probe must be a function probe(model) -> loss, got {self.probe!r}")
        if isinstance(self.max_risk, bool) or not isinstance(self.max_risk, (int, float)) or self.max_risk < 0:
            raise ConfigError(f"PlannerConfig.max_risk must be a number >= 0, got {self.max_risk!r}")
        bad = [o for o in self.options if o not in OPTIONS]
        if bad or "keep" not in self.options:
            raise ConfigError(f"PlannerConfig.options must include 'keep' and come from {list(OPTIONS)}; got "
                              f"{list(self.options)}")
        if self.granularity not in GRANULARITIES:
            raise ConfigError(f"PlannerConfig.granularity must be one of {list(GRANULARITIES)}, got "
                              f"{self.granularity!r}")
        if not isinstance(self.repeats, int) or self.repeats < 1:
            raise ConfigError(f"PlannerConfig.repeats must be an int >= 1, got {self.repeats!r}")


def plan_of(model: nn.Module) -> Plan:
    """The plan ``compress_(model, PlannerConfig(...))`` made for ``model``."""
    planned = getattr(model, _PLANNED, None)
    if planned is None or planned.plan is None:
        raise ConfigError(f"{type(model).__name__} has no plan: compress_(model, PlannerConfig(...)) first")
    return planned.plan


def set_exposure(model: nn.Module, exposure: float) -> None:
    """Set the exposure of the steps to come, relative to the probe step's (1.0): the plan weighs each unit's
    risk by it (an RL loss sets it from its token weights; see actzip.rl.PlannedGRPOMixin)."""
    planned = getattr(model, _PLANNED, None)
    if planned is None:
        raise ConfigError(f"{type(model).__name__} has no plan: compress_(model, PlannerConfig(...)) first")
    if isinstance(exposure, bool) or not isinstance(exposure, (int, float)) or exposure < 0:
        raise ConfigError(f"set_exposure: exposure must be a number >= 0, got {exposure!r}")
    planned.exposure = float(exposure)


def _usable(options: tuple[str, ...], device: torch.device, max_risk: float, report: CompressReport) -> tuple:
    out = []
    for o in options:
        if o == "offload" and device.type != "cuda":
            report.notes.append("planner: 'offload' left out: the model is not on a CUDA device")
        elif o not in LOSSLESS and max_risk == 0:
            continue  # lossy options need a risk budget
        else:
            out.append(o)
    return tuple(out)


@register_handler(PlannerConfig)
def _plan_model(model: nn.Module, config: PlannerConfig, filter_fn: FilterFn | None, report: CompressReport) -> None:
    if getattr(model, _PLANNED, None) is not None:
        raise ConfigError("planner: the model already has a plan; restore_(model) first")
    units = find_units(model, config.granularity)
    if filter_fn is not None:
        units = [(n, m) for n, m in units if filter_fn(m, n)]
    signature = model_signature(model, units)
    planned = PlannedUnits(units, config.min_bytes)
    try:
        plan = _make_plan(model, config, planned, signature, report)
        if config.plan is None:
            _check_peak(model, planned, plan, config.probe, report)
        chosen = plan.options_for(plan.probe_tokens)
    except BaseException:
        planned.remove()  # nothing of a failed plan stays on the model
        raise
    setattr(model, _PLANNED, planned)

    def undo() -> None:
        planned.remove()
        delattr(model, _PLANNED)

    add_undo(model, undo)
    planned.plan = plan
    for (name, _), option in zip(units, chosen):
        report.swapped.append((name, f"planned: {option}"))
    report.notes.append(f"planner: predicted peak {plan.predicted_peak(plan.probe_tokens) / 2**20:,.1f} MiB of "
                        f"{plan.budget_bytes / 2**20:,.1f} MiB at {plan.probe_tokens} tokens"
                        + (f" (measured {plan.checks[-1][1] / 2**20:,.1f} MiB)" if plan.checks else "")
                        + "; plan_of(model).table()")


def _make_plan(model: nn.Module, config: PlannerConfig, planned: PlannedUnits, signature: str,
               report: CompressReport) -> Plan:
    if config.plan is not None:
        plan = Plan.load(config.plan)
        if plan.signature != signature:
            raise ConfigError(f"planner: the plan {config.plan} was made for another model or other units "
                              f"(signature {plan.signature}, this model {signature}); profile this one instead")
        if config.budget_bytes > 0 and config.budget_bytes != plan.budget_bytes:
            plan.budget_bytes, plan.chosen = config.budget_bytes, {}  # the measured costs hold; solve again
        return plan
    if config.probe is None:
        raise ConfigError("PlannerConfig.probe must be a function probe(model) -> loss (one representative forward) "
                          "unless a saved plan is given")
    device = next(model.parameters()).device
    options = _usable(config.options, device, config.max_risk, report)
    measured = profile(model, planned, config.probe, options, config.repeats)
    if any(measured.noise_floor):
        report.notes.append(f"planner: two plain steps' gradients differ by up to {max(measured.noise_floor):.2e} "
                            f"(relative; non-deterministic kernels): lossless options were held to {NOISE_MARGIN:g} "
                            "times that")
    for option, why in measured.left_out.items():
        message = f"actzip planner: option {option!r} left out: {why}"
        warnings.warn(message, stacklevel=4)
        report.notes.append(message)
    if measured.inexact:
        report.notes.append(f"planner: lossless options changed gradients at {measured.inexact} (left out)")
    costs = [_without(c, {x.split(":")[1] for x in measured.inexact if x.startswith(c.name + ":")})
             for c in measured.costs]
    return Plan(signature, measured.tokens, config.budget_bytes, measured.base_bytes, config.max_risk, costs)


def _check_peak(model: nn.Module, planned: PlannedUnits, plan: Plan, probe, report: CompressReport) -> None:
    """Run the plan on the probe until its measured peak is within the budget (at most PEAK_CHECKS corrections)."""
    for correction in range(PEAK_CHECKS + 1):
        planned.plan = plan
        predicted = plan.predicted_peak(plan.probe_tokens)
        measured = planned_peak(model, probe)
        if measured is None:  # no peak to measure off CUDA: the budget counts the units' saved bytes only
            return
        plan.checks.append([predicted, measured])
        if measured <= plan.budget_bytes:
            return
        if correction == PEAK_CHECKS:
            break
        plan.base_bytes += measured - predicted
        plan.chosen = {}
        plan.options_for(plan.probe_tokens)  # a ConfigError with the smallest feasible peak once none fits
    message = (f"actzip planner: the plan's measured peak {measured / 2**20:,.1f} MiB is still past the budget "
               f"{plan.budget_bytes / 2**20:,.1f} MiB after {PEAK_CHECKS} corrections (plan_of(model).checks)")
    warnings.warn(message, stacklevel=3)
    report.notes.append(message)


def _without(costs: UnitCosts, drop: set) -> UnitCosts:
    """``costs`` without the options named in ``drop``."""
    keep = [k for k, o in enumerate(costs.options) if o not in drop]
    pick = lambda v: tuple(v[k] for k in keep)  # noqa: E731
    return UnitCosts(costs.name, pick(costs.options), pick(costs.bytes), pick(costs.seconds), pick(costs.risk),
                     pick(costs.transient), costs.exposure)
