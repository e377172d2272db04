"""Norm outputs marked as rebuildable, so that a fused MLP keeps no copy of its input.

A pre-norm block feeds its MLP ``n = norm(x)``; the MLP's first projection saves ``n`` for its weight
gradient, while the norm's backward keeps ``x``. :func:`mark_norm_outputs` puts a forward hook on each norm
module that marks its output with how to make it again (``norm.forward(x)``, the same op on the same input:
the same bits); a fused MLP that receives a marked tensor keeps a rebuild handle in its place
(:func:`actzip.memory.cache.rebuild.rebuildable`). Nothing else reads the mark, so other consumers of ``n``
(attention, say) save it as before. The saving is real where the norm's backward keeps ``x`` itself
(``nn.LayerNorm``, ``nn.RMSNorm`` on CUDA); a norm that saves only an upcast copy of ``x`` leaves ``x`` alive
through the handle, which then costs as much as the copy of ``n`` it replaces, plus one norm forward.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from actzip.memory.cache.rebuild import mark_rebuildable, recompute

__all__ = ["is_norm", "mark_norm_outputs"]

_NORM_SUFFIXES = ("RMSNorm", "LayerNorm")  # transformers' norm classes (LlamaRMSNorm, NemotronHRMSNorm, ...)


def is_norm(module: nn.Module) -> bool:
    """A norm whose forward is ``f(x)`` of one tensor: ``nn.LayerNorm``, ``nn.RMSNorm``, or a transformers class
    named ``*RMSNorm`` / ``*LayerNorm`` (gated norms, which take a second input, are named otherwise)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    cls = type(module)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith(_NORM_SUFFIXES)


def _mark(module: nn.Module, args: tuple, output) -> None:
    if (torch.is_grad_enabled() and len(args) == 1 and isinstance(args[0], torch.Tensor)
            and isinstance(output, torch.Tensor) and output.requires_grad
            and len(module._forward_hooks) == 1):  # another hook may have changed the output
        mark_rebuildable(output, recompute(module.forward, args[0]))


def mark_norm_outputs(model: nn.Module) -> list:
    """Hook every norm of ``model`` (see :func:`is_norm`) to mark its outputs; returns the hook handles."""
    return [m.register_forward_hook(_mark) for m in model.modules() if is_norm(m)]
