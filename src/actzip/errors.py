"""Every exception actzip raises on purpose, in one place.

Each error names the tensor or option at fault and the reason, so a user can act on it without reading
actzip's source. All derive from :class:`ActzipError`; each also derives from the closest built-in type so
that existing ``except ValueError`` / ``except TypeError`` code keeps working. This module imports nothing
from actzip, so every layer can use it.
"""

from __future__ import annotations

__all__ = [
    "ActzipError",
    "CodebookDesyncError",
    "ConfigError",
    "DataError",
    "InvalidValueError",
    "KernelUnavailableError",
    "MissingDependencyError",
    "NothingToCompressError",
    "NothingToRestoreError",
    "PayloadError",
    "PromptVectorMismatchError",
    "UnknownCodecError",
    "UnknownConfigError",
    "UnsupportedDtypeError",
    "UnsupportedLayoutError",
    "WireConfigMismatchError",
    "WireDesyncError",
    "WireError",
    "WirePeerError",
    "WireTimeoutError",
]


class ActzipError(Exception):
    """Base class of every error actzip raises on purpose."""


# -- options and configs -------------------------------------------------------------------------------------


class ConfigError(ActzipError, ValueError):
    """An option or config field has a value actzip cannot use."""


class UnknownCodecError(ConfigError, KeyError):
    """A codec name that is not registered."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class UnknownConfigError(ConfigError, TypeError):
    """``compress_`` was given an object of a type no handler is registered for."""


class NothingToCompressError(ConfigError):
    """``compress_`` found nothing in the model that its config can change (the message lists why)."""


class NothingToRestoreError(ConfigError):
    """``restore_`` was called on a model that ``compress_`` never changed."""


class MissingDependencyError(ActzipError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra that installs it."""


class KernelUnavailableError(ConfigError):
    """A Triton kernel was asked for (``kernel="triton"``) but cannot run here; the message says why."""


class PromptVectorMismatchError(ConfigError):
    """A saved prompt vector was fitted on another model (class, width or block count) than the one given."""


# -- tensors and payloads ------------------------------------------------------------------------------------


class UnsupportedDtypeError(ActzipError, TypeError):
    """A tensor whose dtype the chosen codec cannot take."""


class UnsupportedLayoutError(ActzipError, TypeError):
    """A tensor whose layout (sparse, nested, ...) the chosen codec cannot take."""


class InvalidValueError(ActzipError, ValueError):
    """A tensor whose values break the codec's contract (e.g. a negative value under sign packing)."""


class PayloadError(ActzipError, ValueError):
    """A payload that does not belong to the codec asked to decode it, or is damaged."""


class CodebookDesyncError(PayloadError):
    """The receiver's codebook is not the one the sender encoded with; resynchronize with a full snapshot."""


class DataError(ActzipError, ValueError):
    """A data source that cannot be read or is too small for what was asked."""


# -- the wire ------------------------------------------------------------------------------------------------


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
