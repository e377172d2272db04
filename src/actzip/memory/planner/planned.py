"""Units running the option a plan gives them: each unit's ``forward`` wrapped, undone by :meth:`remove`."""

from __future__ import annotations

import torch
import torch.nn as nn

from actzip.memory.cache import CacheContext
from actzip.memory.planner.options import option_context, run_option
from actzip.memory.planner.plan import Plan

__all__ = ["PlannedUnits", "tokens_of"]


def tokens_of(args: tuple) -> int:
    """Rows of a unit's first tensor input (all dimensions but the last): the step's token count."""
    t = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return 0 if t is None or t.dim() == 0 else t.numel() // t.size(-1)


class PlannedUnits:
    """The units of one model with their forwards wrapped.

    ``plan`` set: each call runs the plan's option for its token count. ``forced`` set (profiling): every unit
    runs that option, and ``measure`` keeps per-unit records of what each call kept (``kept_bytes``) and of its
    inputs (``input_bytes``).
    """

    def __init__(self, units: list[tuple[str, nn.Module]], min_bytes: int = 0) -> None:
        self.units = units
        self.plan: Plan | None = None
        self.forced: str | None = None
        self.measure = False
        self.min_bytes = min_bytes
        self.tokens = 0  # the last call's token count
        self.exposure = 1.0  # the current step's exposure relative to the probe's (set_exposure)
        self.input_bytes = [0] * len(units)
        self._blocks: dict[tuple[int, str], object] = {}
        self._counters: list[CacheContext] = [CacheContext.count_only() for _ in units]
        for i, (_, module) in enumerate(units):
            original = module.forward

            def planned(*args, _i=i, _original=original, **kwargs):
                return self._run(_i, _original, args, kwargs)

            module.forward = planned

    def _block(self, i: int, option: str):
        if self.measure and option == "keep":
            return lambda: self._counters[i]
        key = (i, option)
        if key not in self._blocks:
            self._blocks[key] = option_context(option, self.min_bytes)
        return self._blocks[key]

    def _run(self, i: int, original, args: tuple, kwargs: dict):
        self.tokens = tokens_of(args)
        if self.forced is not None:
            option = self.forced
        elif self.plan is not None and torch.is_grad_enabled():
            option = self.plan.options_for(self.tokens, self.exposure)[i]
        else:
            option = "keep"
        if self.measure:
            self.input_bytes[i] = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
        return run_option(option, original, self._block(i, option), args, kwargs)

    def kept_bytes(self, i: int, option: str) -> int:
        """What unit ``i`` kept in its last call under ``option`` (cache options and keep, while measuring)."""
        ctx = self._counters[i] if option == "keep" else self._block(i, option)()
        return ctx.last.bytes_after

    def remove(self) -> None:
        for _, module in self.units:
            module.__dict__.pop("forward", None)
