"""actzip: compress PyTorch activations wherever they are held or sent."""

from actzip import codecs, compat, errors, memory
from actzip.errors import *  # noqa: F401,F403  (every error is exported at the top level too)
from actzip.api import CompressReport, compress_, restore_
from actzip.memory.cache import CacheConfig, cache
from actzip.memory.lora import LoRAConfig
from actzip.memory.modules import Fp8LinearConfig, SketchedLinearConfig, SparseMLPConfig

__version__ = "0.1.0"

compat.install()

__all__ = [
    "CacheConfig",
    "CompressReport",
    "Fp8LinearConfig",
    "LoRAConfig",
    "SketchedLinearConfig",
    "SparseMLPConfig",
    "cache",
    "codecs",
    "compress_",
    "errors",
    "memory",
    "restore_",
    *errors.__all__,
]
