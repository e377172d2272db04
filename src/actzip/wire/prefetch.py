"""The next message from a peer, received by a daemon thread while the receiver computes.

Over gloo a point-to-point message moves only once its receiver has posted the receive: the sender announces
it and waits for the receiver's ready notice before the bytes go out. A stage that posts each receive only when
it needs the message leaves the link idle while it computes, so its input arrives after its compute instead of
during it. A :class:`Prefetch` posts the receive ahead, in a thread of its own, and hands the message (or the
error it met) to whoever asks for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from actzip.errors import WireTimeoutError

__all__ = ["Prefetch"]

T = TypeVar("T")


class Prefetch(Generic[T]):
    """``read()`` running in a daemon thread from now on; :meth:`result` waits for what it returned."""

    def __init__(self, read: Callable[[], T], name: str) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(read,), name=name, daemon=True).start()

    def _run(self, read: Callable[[], T]) -> None:
        try:
            self._value = read()
        except BaseException as e:  # noqa: BLE001 - raised again by result(), on the caller's thread
            self._error = e
        finally:
            self._done.set()

    def result(self, timeout_s: float, what: str) -> T:
        """What ``read()`` returned (or raise what it raised); :class:`WireTimeoutError` naming ``what`` if it has
        not finished within ``timeout_s`` seconds."""
        if not self._done.wait(timeout_s):
            raise WireTimeoutError(f"{what} did not arrive within {timeout_s:g} s (received ahead, still waiting)")
        if self._error is not None:
            raise self._error
        return self._value
