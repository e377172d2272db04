"""One rebuilt tensor for every save that shares a stored activation.

A tensor saved twice (the q, k and v projections of one input, the gate and up projections of a SwiGLU, a norm's
input saved by two of its ops) is stored once, and autograd unpacks it once per save, one after another. What
holds it (the cache's payload, an offloaded stash) rebuilds it on the first unpack and hands the same tensor to
the others: kept alive until each sharer has had it, then only weakly referenced, so it is freed with its last
user and rebuilt only if asked for again (a second backward).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch


class Handout:
    """Base of what autograd holds for a stored activation: ``shares`` saves hold it (the cache counts them)."""

    __slots__ = ("shares", "_unpacks", "_last", "_held")

    def __init__(self) -> None:
        self.shares = 1
        self._unpacks = 0
        self._last = None  # weak reference to the tensor last handed out
        self._held = None  # that tensor, while sharers have yet to unpack it

    def last(self) -> torch.Tensor | None:
        """The tensor last handed out, if it is still alive."""
        return self._last() if self._last is not None else None

    def hand_out(self, rebuild: Callable[[], torch.Tensor]) -> torch.Tensor:
        t = self.last()
        if t is None:
            t = rebuild()
            self._last = weakref.ref(t)
        self._unpacks += 1
        self._held = t if self._unpacks < self.shares else None
        return t
