"""Stochastic rounding that draws new noise on every replay of a captured CUDA graph.

A codec's random stream is keyed on the host (:func:`actzip.codecs.counter_rng.stream_keys`): each encode
takes the next keys of a counter, so eager steps never repeat their noise. A CUDA graph, though, replays the
kernels it captured with the arguments they had then, keys included, and would round every replay the same
way: the rounding is then no longer independent from step to step, and its errors add up instead of averaging
out.

:class:`StepNoise` keeps, per device, an int32 offset on the device itself, added to the first key of every
stochastic ``quant`` encode made while it is active (``with noise:``). :meth:`StepNoise.advance` adds one to
it with a device operation, which a graph captures and replays: call it once per step inside the captured
region (the activation cache does it when it opens its block with ``CacheConfig(graph_safe=True)``), and every
replay draws a stream no step drew before. An offset is made (zeros) the first time a device needs one; making it
while a graph is being captured would capture the reset too, so that is an error: run a step eagerly first,
as torch's capture recipe does anyway.
"""

from __future__ import annotations

import threading

import torch

from actzip.errors import ConfigError

__all__ = ["StepNoise", "current_offset"]

_LOCAL = threading.local()  # the active StepNoise objects of this thread, innermost last


class StepNoise:
    """Per-device offsets of the stochastic encodes' keys (see the module docstring)."""

    def __init__(self) -> None:
        self._offsets: dict[torch.device, torch.Tensor] = {}

    def offset(self, device: torch.device) -> torch.Tensor:
        """The offset of ``device``: an int32 tensor of one element there, made on first use."""
        device = torch.device(device)
        got = self._offsets.get(device)
        if got is None:
            if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ConfigError("StepNoise: the first stochastic encode on a device is being captured into a "
                                  "CUDA graph, which would capture resetting its noise too; run one step "
                                  "eagerly before the capture")
            got = self._offsets[device] = torch.zeros(1, dtype=torch.int32, device=device)
        return got

    def advance(self) -> None:
        """One step further on every device seen so far (device operations: no synchronization)."""
        for t in self._offsets.values():
            t.add_(1)

    def __enter__(self) -> "StepNoise":
        stack = getattr(_LOCAL, "stack", None)
        if stack is None:
            stack = _LOCAL.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _LOCAL.stack.pop()


def current_offset(device: torch.device) -> torch.Tensor | None:
    """The innermost active :class:`StepNoise`'s offset for ``device``, or ``None`` outside every one."""
    stack = getattr(_LOCAL, "stack", None)
    return stack[-1].offset(device) if stack else None
