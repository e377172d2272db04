"""Errors between ranks of the wire (every one an :class:`actzip.ActzipError`)."""

from __future__ import annotations

from actzip.core.errors import ActzipError

class WireError(ActzipError, RuntimeError):
    """Something went wrong between two ranks."""


class WireConfigMismatchError(WireError, ValueError):
    """The two ends of a link were configured differently (codecs, schedule, compressor, ...)."""


class WireDesyncError(WireError):
    """A message that does not fit what the receiver expects: order, schema, codec state or format."""


class WirePeerError(WireError):
    """The peer failed: it reported an error, or its process went away."""


class WireTimeoutError(WireError, TimeoutError):
    """No message arrived within the timeout."""
