"""actzip: compress PyTorch activations wherever they are held or sent."""

from actzip import codecs, compat, errors, memory
from actzip.errors import *  # noqa: F401,F403  (every error is exported at the top level too)
from actzip.memory.apply import compress_

__version__ = "0.1.0"

compat.install()

__all__ = ["codecs", "compress_", "errors", "memory", *errors.__all__]
