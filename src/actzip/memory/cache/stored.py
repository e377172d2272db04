"""What autograd holds for a stored activation: rebuilt once, handed to every save that shares it.

A tensor saved twice (the q, k and v projections of one input, the gate and up projections of a SwiGLU, a norm's
input saved by two of its ops) is stored once, and autograd unpacks it once per save, one after another. What
holds it (the cache's payload, an offloaded copy) rebuilds it on the first unpack and hands the same tensor to
the others: kept alive until each sharer has had it, then only weakly referenced, so it is freed with its last
user and rebuilt only if asked for again (a second backward).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from actzip import compat

__all__ = ["StoredActivation"]


class StoredActivation:
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
        """The tensor for one unpack: the one handed out last if it is alive, else ``rebuild()``."""
        t = self.last()
        if t is None:
            t = rebuild()
            self._last = weakref.ref(t)
        self._unpacks += 1
        self._held = t if self._unpacks < self.shares else None
        return t


_OLD_NAMES = {"Handout": compat.deprecated(StoredActivation, "actzip.memory.handout.Handout",
                                            "actzip.memory.cache.stored.StoredActivation")}


def __getattr__(name: str):  # the old name of this module's class (actzip.memory.handout), for one release
    try:
        return _OLD_NAMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
