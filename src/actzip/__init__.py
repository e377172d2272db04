"""actzip: compress PyTorch activations wherever they are held or sent."""

from actzip import codecs, compat, errors, memory, prompt
from actzip.errors import *  # noqa: F401,F403  (every error is exported at the top level too)
from actzip.api import CompressReport, compress_, restore_
from actzip.memory.cache import CacheConfig, cache
from actzip.memory.lora import LoRAConfig
from actzip.memory.modules import (DerivativeActivationConfig, Fp8LinearConfig, NormRebuildConfig, SketchedLinearConfig,
                                   SparseMLPConfig)
from actzip.memory.planner import PlannerConfig
from actzip.prompt import PromptVectorConfig

__version__ = "0.1.0"

compat.install()


def __getattr__(name: str):
    # actzip.wire (torch.distributed and the pipeline runner) loads on first use, so `import actzip` stays light
    if name == "wire":
        import importlib

        return importlib.import_module("actzip.wire")
    raise AttributeError(f"module 'actzip' has no attribute {name!r}")

__all__ = [
    "CacheConfig",
    "CompressReport",
    "DerivativeActivationConfig",
    "Fp8LinearConfig",
    "NormRebuildConfig",
    "LoRAConfig",
    "SketchedLinearConfig",
    "SparseMLPConfig",
    "PlannerConfig",
    "PromptVectorConfig",
    "cache",
    "codecs",
    "compress_",
    "errors",
    "memory",
    "prompt",
    "restore_",
    "wire",
    *errors.__all__,
]
