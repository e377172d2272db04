"""``compress_(model, DerivativeActivationConfig())``: pointwise activations keep their derivative, not their input.

Swapped for a :class:`~actzip.memory.modules.activation_derivative.DerivativeActivation` of the same kind:

- ``nn.GELU`` (either ``approximate``) and ``nn.SiLU``;
- transformers' ``GELUActivation``, ``GELUTanh`` and ``SiLUActivation`` whose forward is the PyTorch call
  (``NewGELUActivation`` and the others that write their formula out are left, and the report says why: the
  PyTorch call differs from them by rounding);
- the activation function of a module that declares ``actzip_mlp_layout`` (the reference GPT's MLP: ``act`` is
  ``F.gelu`` or ``F.silu``).

What changes is what backward keeps: ``f'(x)`` instead of ``x``, a linear input to the cache's rules (so a lossy
preset stores it with its unbiased linear-input codes instead of the 4-bit-or-more floor of a nonlinear input).
Forward outputs are the same bits; gradients equal autograd's up to rounding, and with a stochastic code unbiased.
``kinds`` narrows which activations are taken. ``restore_`` undoes it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from actzip.api import CompressReport, Config, FilterFn, add_undo, register_handler, replace_module, walk
from actzip.errors import ConfigError
from actzip.memory.modules.activation_derivative import KINDS, DerivativeActivation

__all__ = ["DerivativeActivationConfig", "activation_kind"]

_WRITTEN_OUT = ("NewGELUActivation", "FastGELUActivation", "QuickGELUActivation", "ClippedGELUActivation")


def _function_kind(fn) -> str | None:
    """The kind of a PyTorch activation function (``F.gelu``, its tanh form as a partial, ``F.silu``), or None."""
    if fn is F.gelu:
        return "gelu"
    if fn is F.silu:
        return "silu"
    if isinstance(fn, functools.partial) and fn.func is F.gelu and not fn.args and fn.keywords == {"approximate": "tanh"}:
        return "gelu_tanh"
    return None


def activation_kind(module: nn.Module) -> str | None:
    """The kind (:data:`~actzip.memory.modules.activation_derivative.KINDS`) of an activation module whose forward
    is the PyTorch call, or None."""
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    if isinstance(module, nn.SiLU):
        return "silu"
    cls = type(module)
    if not cls.__module__.startswith("transformers."):
        return None
    if cls.__name__ == "SiLUActivation":
        return "silu"
    if cls.__name__ in ("GELUActivation", "GELUTanh"):
        return _function_kind(getattr(module, "act", None))
    return None


@dataclass
class DerivativeActivationConfig(Config):
    """Activations keep ``f'(x)`` for backward instead of ``x`` (see the module docstring)."""

    # the activation kinds taken (of "gelu", "gelu_tanh", "silu"); others are left as they are
    kinds: tuple[str, ...] = KINDS

    def validate(self) -> None:
        self.kinds = tuple(self.kinds) if isinstance(self.kinds, (list, tuple)) else self.kinds
        if not isinstance(self.kinds, tuple) or not self.kinds or any(k not in KINDS for k in self.kinds):
            raise ConfigError(f"DerivativeActivationConfig.kinds must be a non-empty tuple of {KINDS}, "
                              f"got {self.kinds!r}")


def _layout_activation(module: nn.Module) -> tuple[str, str] | None:
    """(attribute, kind) of a declared MLP layout's activation function, or None."""
    layout = getattr(module, "actzip_mlp_layout", None)
    if not isinstance(layout, tuple) or len(layout) != 3:
        return None
    attr = layout[1]
    kind = _function_kind(module.__dict__.get(attr))  # a plain function attribute, not a submodule
    return (attr, kind) if kind is not None else None


def _swap_function(model: nn.Module, fqn: str, module: nn.Module, attr: str, kind: str,
                   report: CompressReport) -> None:
    fn = module.__dict__.pop(attr)
    module.add_module(attr, DerivativeActivation(kind))

    def undo() -> None:
        delattr(module, attr)
        setattr(module, attr, fn)

    add_undo(model, undo)
    report.swapped.append((f"{fqn}.{attr}" if fqn else attr, f"DerivativeActivation({kind!r})"))


@register_handler(DerivativeActivationConfig)
def keep_derivatives(model: nn.Module, config: DerivativeActivationConfig, filter_fn: FilterFn | None,
                     report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`DerivativeActivationConfig`."""

    def candidate(module: nn.Module, fqn: str):
        kind = activation_kind(module)
        if kind is not None:
            return kind in config.kinds or f"{kind} is not among kinds={config.kinds}"
        if type(module).__name__ in _WRITTEN_OUT and type(module).__module__.startswith("transformers."):
            return "its forward writes the formula out, which the PyTorch call matches only up to rounding"
        found = _layout_activation(module)
        if found is not None:
            return found[1] in config.kinds or f"{found[1]} is not among kinds={config.kinds}"
        return None

    for fqn, module in walk(model, candidate, filter_fn, report):
        kind = activation_kind(module)
        if kind is not None:
            replace_module(model, fqn, DerivativeActivation(kind), report, f"DerivativeActivation({kind!r})")
        else:
            attr, kind = _layout_activation(module)
            _swap_function(model, fqn, module, attr, kind, report)
