"""Pointwise activations that keep their derivative for backward instead of their input.

The backward of ``y = f(x)`` is ``dx = dy * f'(x)``: autograd keeps ``x`` and computes ``f'(x)`` again in
backward, so ``x`` is a nonlinear input, which the activation cache's presets keep at 4 bits or more (rounding a
nonlinear input changes ``f'`` in a way no unbiased code can undo). :class:`DerivativeActivation` computes
``f'(x)`` in forward and keeps that instead: the backward is then linear in what is kept, so an unbiased code of
it (stochastic rounding) gives an unbiased ``dx``, the guarantee the cache gives linear inputs. Inside an open
``actzip.cache`` the derivative goes through the cache's own rules as a ``linear_input`` (same codec, account and
role plan as the rest of the step); outside one it is kept as it is. The forward is the activation's own call
(the same bits); the gradient is ``dy * f'(x)`` with ``f'`` written out, equal to autograd's up to rounding. A
second derivative through it (``create_graph=True``) is refused with an :class:`~actzip.errors.ActzipError`.

Kinds (:data:`KINDS`): ``gelu`` (erf form), ``gelu_tanh`` (the tanh approximation) and ``silu``. Under
``torch.compile`` the module runs the plain activation (the compiled graph's saves go to the cache's compiled
path). :mod:`.activation_derivative_config` swaps these in with ``actzip.compress_``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.errors import ActzipError, ConfigError
from actzip.memory.cache.active import current_cache
from actzip.memory.cache.roles import assumed_role

__all__ = ["DERIVATIVE_ROLE", "KINDS", "DerivativeActivation", "activation", "derivative"]

DERIVATIVE_ROLE = "linear_input"  # the cache role a kept derivative is decided as: what backward does with it is linear
KINDS = ("gelu", "gelu_tanh", "silu")

_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


def activation(kind: str, x: torch.Tensor) -> torch.Tensor:
    """The activation ``kind`` of ``x``, by PyTorch's own functional call."""
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "silu":
        return F.silu(x)
    raise ConfigError(f"DerivativeActivation: kind must be one of {KINDS}, got {kind!r}")


def derivative(kind: str, x: torch.Tensor) -> torch.Tensor:
    """``f'(x)`` of the activation ``kind``, computed in float32 (float64 for float64 input), in ``x``'s dtype."""
    w = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    if kind == "gelu":
        d = 0.5 * (1 + torch.erf(w * (1 / math.sqrt(2)))) + w * torch.exp(-0.5 * w * w) * (1 / math.sqrt(2 * math.pi))
    elif kind == "gelu_tanh":
        inner = _SQRT_2_OVER_PI * (w + 0.044715 * w.pow(3))
        t = torch.tanh(inner)
        d = 0.5 * (1 + t) + 0.5 * w * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * w * w)
    elif kind == "silu":
        s = torch.sigmoid(w)
        d = s * (1 + w * (1 - s))
    else:
        raise ConfigError(f"DerivativeActivation: kind must be one of {KINDS}, got {kind!r}")
    return d.to(x.dtype)


class _KeepDerivative(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kind: str) -> torch.Tensor:
        y = activation(kind, x)
        ctx.stored = None
        if ctx.needs_input_grad[0]:
            d = derivative(kind, x)
            cache = current_cache()
            if cache is None:
                ctx.save_for_backward(d)
            else:  # through the cache's rules as a linear input (made here, it would look like a leaf and be kept)
                with assumed_role(DERIVATIVE_ROLE):
                    ctx.stored = cache.pack(d)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if torch.is_grad_enabled():  # create_graph: dy * f'(x) holds no f'', a second derivative would be wrong
            raise ActzipError("DerivativeActivation: a second derivative through it is not available (it keeps "
                              "f'(x), not x); restore_ the model's activations to differentiate twice")
        d = ctx.saved_tensors[0] if ctx.stored is None else ctx.stored.get()
        ctx.stored = None
        return grad * d, None


class DerivativeActivation(nn.Module):
    """The activation ``kind`` (one of :data:`KINDS`) keeping ``f'(x)`` for backward instead of ``x`` (see the
    module docstring)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in KINDS:
            raise ConfigError(f"DerivativeActivation: kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or not torch.is_grad_enabled():
            return activation(self.kind, x)
        return _KeepDerivative.apply(x, self.kind)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}"
