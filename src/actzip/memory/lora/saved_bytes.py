"""Which module saved what for backward: the bytes autograd keeps, attributed to the module that saved them."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["saved_bytes_by_module"]


def saved_bytes_by_module(model: nn.Module, run: Callable[[], object], modules: dict[str, nn.Module] | None = None):
    """Run ``run()`` (a forward) and attribute every tensor autograd saves to the innermost module of ``modules``
    (default: all named submodules) being called; return ``(bytes by module name, output of run)``.

    Each storage counts once, in full (a saved view keeps its whole storage alive), at the first module that
    saved it; parameters and buffers of ``model`` are left out. Tensors saved outside any listed module go under
    ``""``. Saved tensors are kept as they are: backward on the output works as usual.
    """
    if modules is None:
        modules = dict(model.named_modules())
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    stack: list[str] = []
    seen: set[int] = set()
    totals: dict[str, int] = {}

    def pack(t: torch.Tensor):
        if t.layout == torch.strided and not t.is_nested and t.device.type != "meta":
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in skip and ptr not in seen:
                seen.add(ptr)
                name = stack[-1] if stack else ""
                totals[name] = totals.get(name, 0) + s.nbytes()
        # Not t itself: a tensor saved as an output of its own node would then hold that node through its grad_fn,
        # a cycle no collector sees, and the whole graph would never be freed. The alias shares storage and version.
        return t.detach()

    def enter(name):
        return lambda mod, args: stack.append(name)

    def leave(mod, args, out):
        stack.pop()

    handles = []
    for name, mod in modules.items():
        handles.append(mod.register_forward_pre_hook(enter(name)))
        handles.append(mod.register_forward_hook(leave, always_call=True))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = run()
    finally:
        for hd in handles:
            hd.remove()
    return totals, out
