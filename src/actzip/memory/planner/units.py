"""Recovery units: the repeated blocks of a model (a transformer's layers), or their parts, each planned on its own.

``granularity="block"``: each block is a unit. ``"sub-block"``: each block's direct children that hold parameters
(attention, MLP, a Mamba mixer), norms left out (they keep little and are rebuilt cheaply), so that a block may
checkpoint its MLP and keep its attention, say.
"""

from __future__ import annotations

import hashlib

import torch.nn as nn

from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.modules.norm_rebuild import is_norm

__all__ = ["GRANULARITIES", "find_units", "model_signature"]

GRANULARITIES = ("block", "sub-block")


def _sub_blocks(name: str, block: nn.Module) -> list[tuple[str, nn.Module]]:
    parts = [(f"{name}.{n}", c) for n, c in block.named_children()
             if not is_norm(c) and any(True for _ in c.parameters())]
    return parts or [(name, block)]


def find_units(model: nn.Module, granularity: str = "block") -> list[tuple[str, nn.Module]]:
    """The children of the model's largest ``nn.ModuleList`` whose members all share one class (GPT-2's ``h``,
    Llama's ``layers``, ...), as ``(path, module)``; the first such list if several tie. ``"sub-block"``: their
    parameter-holding children instead (see the module docstring)."""
    best: tuple[str, nn.ModuleList] | None = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) >= 1 and len({type(c) for c in m}) == 1:
            if best is None or len(m) > len(best[1]):
                best = (name, m)
    if best is None:
        raise NothingToCompressError(f"planner: {type(model).__name__} has no nn.ModuleList of repeated blocks to "
                                     "plan (a transformer's layers)")
    prefix = f"{best[0]}." if best[0] else ""
    blocks = [(f"{prefix}{i}", c) for i, c in enumerate(best[1])]
    if granularity == "block":
        return blocks
    if granularity == "sub-block":
        return [part for name, block in blocks for part in _sub_blocks(name, block)]
    raise ConfigError(f"planner: granularity {granularity!r}; choose from {list(GRANULARITIES)}")


def model_signature(model: nn.Module, units: list[tuple[str, nn.Module]]) -> str:
    """A digest of the units' paths and classes and every parameter's name, shape and dtype: a plan made for
    one model is refused by another."""
    h = hashlib.sha256()
    for name, m in units:
        h.update(f"{name}:{type(m).__qualname__};".encode())
    for name, p in model.named_parameters():
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    return h.hexdigest()[:16]
