"""actzip: compress PyTorch activations wherever they are held or sent."""

from actzip import codecs, memory
from actzip.core.errors import (
    ActzipError,
    ConfigError,
    InvalidValueError,
    UnknownCodecError,
    UnsupportedDtypeError,
    UnsupportedLayoutError,
)

from actzip.memory.apply import compress_

__version__ = "0.1.0"

__all__ = [
    "ActzipError",
    "ConfigError",
    "InvalidValueError",
    "UnknownCodecError",
    "UnsupportedDtypeError",
    "UnsupportedLayoutError",
    "codecs",
    "compress_",
    "memory",
]
