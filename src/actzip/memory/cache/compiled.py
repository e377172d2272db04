"""Tensors saved by ``torch.compile``'d code where the cache's hooks are not inlined into the graph: kept.

The cache's own hooks are inlined into compiled graphs, which then compress what they save
(:mod:`actzip.memory.cache.graph_hooks`). Where that does not happen (hooks of the user's own that hand their
saves to ``CacheContext.pack``, compiled autograd, a PyTorch that cannot inline hooks) the hooks run eagerly on
a compiled region's saves, and this module is the safety net. AOTAutograd runs a compiled graph (inductor's, the default backend, or ``aot_eager``'s) as one
``torch.autograd.Function``. The graph's intermediates that its backward needs are made inside that function's
``forward``, where autograd records nothing, so they reach the pack hook without history, exactly like
parameters and inputs, and the ``leaf`` rule would keep them uncompressed and out of the account's totals: the
cache would compress nothing and report nothing. The compiler also chose them (fused pre-activations, its own
strides) for its own backward kernels. So they are recognized here, and the cache keeps them, counts them in
the totals under ``compiled`` (:attr:`StepAccount.uncompressed_compiled`) and warns once.

The signal: autograd packs what a function saved right after its ``forward`` returns, from the Python frame of
``torch.autograd.Function.apply``; that frame holds the function's class (AOTAutograd's carries an ``_aot_id``)
and its inputs. A saved tensor that is none of those inputs, nor a view of one, was made by the compiled graph.
Saves of the code around compiled regions (graph breaks, ``backend="eager"``) are ordinary and compressed.
"""

from __future__ import annotations

import sys
import threading
import warnings

import torch

__all__ = ["compiled_graph_inputs", "made_by_graph", "reset_warning", "warn_uncompressed"]

_APPLY_CODE = torch.autograd.Function.apply.__func__.__code__
# Frames between the pack hook and Function.apply: the cache's own (a few), and another hook that hands its
# saves on to the cache (rebuild_saved's).
_SEARCH_DEPTH = 10

_lock = threading.Lock()
_warned = False


def compiled_graph_inputs() -> tuple | None:
    """The inputs of the compiled graph whose saves are being packed, or ``None`` when the save being packed was
    not made by an AOTAutograd function (eager code, another autograd function). Call it from a pack hook."""
    frame = sys._getframe(1)
    for _ in range(_SEARCH_DEPTH):
        if frame is None:
            return None
        if frame.f_code is _APPLY_CODE:
            local = frame.f_locals
            if getattr(local.get("cls"), "_aot_id", None) is None:
                return None
            args = local.get("args")
            return tuple(args) if isinstance(args, (tuple, list)) else ()
        frame = frame.f_back
    return None


def made_by_graph(t: torch.Tensor, inputs: tuple) -> bool:
    """Whether ``t``, saved by a compiled graph with ``inputs``, is one of the graph's own intermediates (not an
    input, a view of one, or a tensor sharing an input's storage)."""
    base = t._base
    if any(a is t or (base is not None and a is base) for a in inputs):
        return False
    ptr = t.untyped_storage().data_ptr()
    return not any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in inputs)


def warn_uncompressed(shape, dtype) -> None:
    """Warn, once per process, that a compiled graph's saves are kept uncompressed."""
    global _warned
    with _lock:
        first, _warned = not _warned, True
    if first:
        warnings.warn(
            f"actzip.cache: the tensors torch.compile'd code saves for backward (first: {tuple(shape)} {dtype}) are "
            "kept uncompressed: the cache's hooks were not inlined into that graph (hooks of your own, compiled "
            "autograd, or a PyTorch that cannot inline them), and its intermediates, chosen by the compiler for its "
            "backward kernels, reached the hooks without their roles. The account "
            "counts them under 'compiled' (StepAccount.uncompressed_compiled); code run eagerly around the compiled "
            "part (or compiled with backend='eager') is compressed as usual (warned once)",
            RuntimeWarning,
            stacklevel=2,
        )


def reset_warning() -> None:
    """Warn again at the next compiled graph's save (the warning is given once per process)."""
    global _warned
    with _lock:
        _warned = False
