"""Norm outputs marked as rebuildable, so that the layers they feed keep no copy of them.

A pre-norm block feeds its MLP and its attention ``n = norm(x)``; their first projections save ``n`` for
their weight gradients, while the norm's backward keeps ``x``. :func:`mark_norm_outputs` puts a forward hook on
each norm module that marks its output with how to make it again (``norm.forward(x)``, the same op on the same
input: the same bits). A fused MLP that receives a marked tensor keeps a rebuild handle in its place
(:func:`actzip.memory.cache.rebuild.rebuildable`), and so does every ``nn.Linear`` / transformers ``Conv1D``
hooked by :func:`rebuild_projection_inputs` (attention's q/k/v or fused qkv projection, a Mamba in-projection,
an output head): once all consumers keep handles, ``n`` itself is freed after the forward. The saving is
real where the norm's backward keeps ``x`` itself (``nn.LayerNorm``, ``nn.RMSNorm`` on CUDA); a norm that saves
only an upcast copy of ``x`` leaves ``x`` alive through the handle, which then costs as much as the copy of
``n`` it replaces, plus one norm forward per consumer.

A Mamba mixer's in-projection reads a norm output too, and the fused scan after it saves the projection's whole
output (the mixer's largest saved tensor): :func:`rebuild_mamba_in_projections` makes that save a handle as well,
rebuilt by running the in-projection again on the rebuilt norm output (one matmul more per mixer in backward).

A rebuild checks that the norm's input was not modified in place since the forward (an in-place residual
update, say) and raises :class:`~actzip.errors.ActzipError` rather than rebuild from changed values (the check
of :func:`~actzip.memory.cache.rebuild.recompute`); ``SparseMLPConfig(rebuild_norms=False)`` suits such a model.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.memory.cache.rebuild import mark_rebuildable, rebuild_saved, rebuildable, recompute

__all__ = ["is_mamba_mixer", "is_norm", "is_projection", "mark_norm_outputs", "rebuild_mamba_in_projections",
           "rebuild_projection_inputs"]

_NORM_SUFFIXES = ("RMSNorm", "LayerNorm")  # transformers' norm classes (LlamaRMSNorm, NemotronHRMSNorm, ...)


def is_norm(module: nn.Module) -> bool:
    """A norm whose forward is ``f(x)`` of one tensor: ``nn.LayerNorm``, ``nn.RMSNorm``, or a transformers class
    named ``*RMSNorm`` / ``*LayerNorm`` (gated norms, which take a second input, are named otherwise)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    cls = type(module)
    return cls.__module__.startswith("transformers.") and cls.__name__.endswith(_NORM_SUFFIXES)


def is_projection(module: nn.Module) -> bool:
    """A layer that saves its input for its weight gradient: ``nn.Linear`` (and subclasses) or transformers'
    ``Conv1D``."""
    if isinstance(module, nn.Linear):
        return True
    cls = type(module)
    return cls.__module__.startswith("transformers.") and cls.__name__ == "Conv1D"


def _opened(blocks: list, module: nn.Module, args: tuple) -> None:
    x = args[0] if len(args) == 1 and isinstance(args[0], torch.Tensor) else None
    block = rebuild_saved([], upcasts_of=x) if torch.is_grad_enabled() and x is not None and x.requires_grad else None
    if block is not None:
        block.__enter__()
    blocks.append(block)


def _closed(blocks: list, module: nn.Module, args: tuple, output) -> None:
    block = blocks.pop() if blocks else None
    if block is not None:
        block.__exit__(None, None, None)
    if (torch.is_grad_enabled() and len(args) == 1 and isinstance(args[0], torch.Tensor)
            and isinstance(output, torch.Tensor) and output.requires_grad
            and len(module._forward_hooks) == 1):  # another hook may have changed the output
        mark_rebuildable(output, recompute(module.forward, args[0]))


def mark_norm_outputs(model: nn.Module) -> list:
    """Hook every norm of ``model`` (see :func:`is_norm`) to mark its outputs and, inside its forward, to keep
    its input in place of an exact upcast of it (transformers' RMSNorms save a float32 copy of a bf16 input
    twice: see :class:`~actzip.memory.cache.rebuild.rebuild_saved`); returns the hook handles."""
    handles = []
    for m in model.modules():
        if is_norm(m):
            blocks: list = []  # one entry per call in flight: the open block, or None
            handles.append(m.register_forward_pre_hook(functools.partial(_opened, blocks)))
            handles.append(m.register_forward_hook(functools.partial(_closed, blocks), always_call=True))
    return handles


def rebuild_projection_inputs(model: nn.Module, skip: tuple[type, ...] = ()) -> list:
    """Hook every projection of ``model`` (see :func:`is_projection`) outside modules of the ``skip`` types so
    that, fed a marked norm output, it keeps a rebuild handle instead of it; returns the hook handles."""
    inside = {id(d) for m in model.modules() if isinstance(m, skip) for d in m.modules()}
    handles = []
    for m in model.modules():
        if id(m) in inside or not is_projection(m):
            continue
        blocks: list = []  # one entry per call in flight: the open rebuild block, or None

        def opened(module, args, blocks=blocks) -> None:
            targets = (rebuildable(args[0]) if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor)
                       else [])
            block = rebuild_saved(targets) if targets else None
            if block is not None:
                block.__enter__()
            blocks.append(block)

        def closed(module, args, output, blocks=blocks) -> None:
            block = blocks.pop() if blocks else None
            if block is not None:
                block.__exit__(None, None, None)

        handles.append(m.register_forward_pre_hook(opened))
        handles.append(m.register_forward_hook(closed, always_call=True))
    return handles


def is_mamba_mixer(module: nn.Module) -> bool:
    """A transformers Mamba mixer: an ``in_proj`` ``nn.Linear`` and a ``conv1d`` (NemotronH's, Mamba-2's, ...)."""
    return (type(module).__module__.startswith("transformers.") and isinstance(getattr(module, "in_proj", None), nn.Linear)
            and isinstance(getattr(module, "conv1d", None), nn.Module))


def _linear_of(make_input, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(make_input(), weight, bias)


def rebuild_mamba_in_projections(model: nn.Module) -> list:
    """Hook every Mamba mixer of ``model`` (see :func:`is_mamba_mixer`) so that, when its in-projection reads a
    marked norm output, what the mixer saves of the projection's output (the fused scan keeps all of it, the
    mixer's largest saved tensor) is a rebuild handle: in backward the norm output is rebuilt and the
    in-projection run again (the same matmul on the same bits: the same output). Returns the hook handles."""
    handles = []
    for m in model.modules():
        if not is_mamba_mixer(m):
            continue
        blocks: list = []  # the rebuild block opened after the in-projection, closed with the mixer

        def projected(module, args, output, blocks=blocks) -> None:
            targets = (rebuildable(args[0]) if torch.is_grad_enabled() and args and isinstance(args[0], torch.Tensor)
                       else [])
            if targets and isinstance(output, torch.Tensor) and output.requires_grad:
                block = rebuild_saved([(output, recompute(_linear_of, targets[0][1], module.weight, module.bias))])
                block.__enter__()
                blocks.append(block)

        def closed(module, args, output, blocks=blocks) -> None:
            while blocks:
                blocks.pop().__exit__(None, None, None)

        handles.append(m.in_proj.register_forward_hook(projected))
        handles.append(m.register_forward_hook(closed, always_call=True))
    return handles
