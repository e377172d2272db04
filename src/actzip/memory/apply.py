"""``compress_(model, config)``: apply a memory config to a model in place, torchao-style.

Each config type has a handler registered with :func:`register_handler`; ``compress_`` dispatches on the
config's type. :class:`SparseMLPConfig` swaps ReLU / ReLU² MLPs for the fused ones of
:mod:`actzip.memory.relu_mlp`, which keep only the compressed ReLU output for backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory.relu_mlp import SparseGatedReLUMLP, SparseReLUMLP

FilterFn = Callable[[nn.Module, str], bool]
_HANDLERS: dict[type, Callable] = {}


def register_handler(config_type: type):
    """Decorator: ``fn(model, config, filter_fn) -> CompressReport`` handles ``config_type``."""

    def deco(fn):
        _HANDLERS[config_type] = fn
        return fn

    return deco


@dataclass
class CompressReport:
    """What ``compress_`` changed: swapped modules and the candidates it left alone, with the reason."""

    swapped: list[tuple[str, str]] = field(default_factory=list)  # (module name, what it became)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (module name, why not)

    def __len__(self) -> int:
        return len(self.swapped)


def compress_(model: nn.Module, config, *, filter_fn: FilterFn | None = None) -> CompressReport:
    """Apply ``config`` to ``model`` in place; ``filter_fn(module, name)`` limits which modules change."""
    handler = _HANDLERS.get(type(config))
    if handler is None:
        known = ", ".join(t.__name__ for t in _HANDLERS)
        raise ConfigError(f"compress_: no handler for config type {type(config).__name__}; known: {known}")
    return handler(model, config, filter_fn)


# -- sparse ReLU / ReLU² MLPs --------------------------------------------------------------------------------


@dataclass
class SparseMLPConfig:
    """Swap ReLU / ReLU² MLPs for fused ones that keep only the lossless sparse payload of ReLU's output."""

    codec_options: dict = field(default_factory=dict)  # options of the "sparse" codec (sign_pack, tile_size, ...)
    trust_structure: bool = False  # also swap MLP classes not known to actzip that have a known attribute layout

    def __post_init__(self) -> None:
        registry.get("sparse", **self.codec_options)  # unknown options fail here, with the list of valid ones


# Known MLP classes: (up, act, down) or (gate, up, act, down) attribute layouts, with their forward known
# to be exactly down(act(up(x))) [then dropout] or down(act(gate(x)) * up(x)).
_PLAIN = {"MLP": ("c_fc", "act", "c_proj"), "GPT2MLP": ("c_fc", "act", "c_proj"), "NemotronHMLP": ("up_proj", "act_fn", "down_proj")}
_GATED = {n: ("gate_proj", "up_proj", "act_fn", "down_proj") for n in ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")}
_KNOWN_MODULES = ("actzip_bench.models.gpt", "transformers.")


def _activation_kind(module: nn.Module, act) -> str | None:
    """'relu', 'relu2' or None, from the activation object (and the actzip GPT's ``activation`` field)."""
    name = getattr(module, "activation", None)
    if name in ("relu", "relu2"):
        return name
    if isinstance(act, nn.ReLU) or act in (F.relu, torch.relu):
        return "relu"
    if type(act).__name__ == "ReLUSquaredActivation":
        return "relu2"
    return None


def _layout(module: nn.Module, trust: bool):
    cls = type(module).__name__
    known = type(module).__module__.startswith(_KNOWN_MODULES)
    for table, gated in ((_GATED, True), (_PLAIN, False)):
        if cls in table and (known or trust):
            return table[cls], gated
    if trust:
        for table, gated in ((_GATED, True), (_PLAIN, False)):
            for names in table.values():
                if all(hasattr(module, n) for n in names):
                    return names, gated
    return None, None


@register_handler(SparseMLPConfig)
def _apply_sparse_mlp(model: nn.Module, config: SparseMLPConfig, filter_fn: FilterFn | None) -> CompressReport:
    report = CompressReport()
    codec = registry.get("sparse", **config.codec_options)
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, (SparseReLUMLP, SparseGatedReLUMLP)):
            report.skipped.append((name, "already swapped"))
            continue
        names, gated = _layout(module, config.trust_structure)
        if names is None:
            continue
        if filter_fn is not None and not filter_fn(module, name):
            report.skipped.append((name, "excluded by filter_fn"))
            continue
        act = getattr(module, names[-2])
        kind = _activation_kind(module, act)
        if kind is None:
            report.skipped.append((name, f"activation {type(act).__name__} is not relu or relu2"))
            continue
        targets.append((name, module, names, gated, kind))
    for name, module, names, gated, kind in targets:
        square = kind == "relu2"
        if gated:
            gate, up, _, down = (getattr(module, n) for n in names)
            new = SparseGatedReLUMLP(gate, up, down, square=square, codec=codec, names=(names[0], names[1], names[3]))
        else:
            up, _, down = (getattr(module, n) for n in names)
            dropout = getattr(module, "dropout", None)
            new = SparseReLUMLP(up, down, square=square, codec=codec, names=(names[0], names[2]),
                                dropout=dropout if isinstance(dropout, nn.Module) else None)
        new.train(module.training)
        _replace(model, name, new)
        report.swapped.append((name, f"{type(new).__name__}({kind})"))
    if not report.swapped:
        why = "; ".join(f"{n or '<root>'}: {r}" for n, r in report.skipped) or (
            "no module with a known MLP layout (c_fc/act/c_proj, up_proj/act_fn/down_proj, gate_proj/up_proj/act_fn/"
            "down_proj); pass trust_structure=True for other classes with these attributes"
        )
        raise ConfigError(f"compress_(SparseMLPConfig): nothing to swap in {type(model).__name__}: {why}")
    return report


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    if not name:
        raise ConfigError("compress_: the model itself is an MLP; wrap it in a parent module to swap it")
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
