"""actzip's exception types.

Every error names the tensor or option at fault and the reason, so a user can act on it without reading
actzip's source. All derive from :class:`ActzipError`; each also derives from the closest built-in type so
that existing ``except ValueError`` / ``except TypeError`` code keeps working.
"""

from __future__ import annotations


class ActzipError(Exception):
    """Base class of every error actzip raises on purpose."""


class ConfigError(ActzipError, ValueError):
    """An option or config field has a value actzip cannot use."""


class UnknownCodecError(ConfigError, KeyError):
    """A codec name that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class UnsupportedDtypeError(ActzipError, TypeError):
    """A tensor whose dtype the chosen codec cannot take."""


class UnsupportedLayoutError(ActzipError, TypeError):
    """A tensor whose layout (sparse, nested, ...) the chosen codec cannot take."""


class InvalidValueError(ActzipError, ValueError):
    """A tensor whose values break the codec's contract (e.g. a negative value under sign packing)."""


class PayloadError(ActzipError, ValueError):
    """A payload that does not belong to the codec asked to decode it, or is damaged."""


class DataError(ActzipError, ValueError):
    """A data source that cannot be read or is too small for what was asked."""
