"""The one-liner strategies of the model benchmarks: ``compress_`` on a copy of the model that shares its weights.

``compress_`` swaps the MLPs and hooks the norms and projections of the model it is given; a copy that holds
the very same parameter and buffer tensors keeps those hooks off the model the other strategies run, while every
strategy still trains one set of weights with one optimizer.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn as nn

from actzip.errors import ConfigError

__all__ = ["ONE_LINERS", "compressed_copies", "compressed_copy", "max_grad_diffs", "shared_copy"]

# the one-liner strategies and their sparse codec options
ONE_LINERS = {"compress": {}, "compress-signpack": {"sign_pack": True, "check": False}}


def shared_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` whose parameters and buffers are ``model``'s own tensors (no memory, one set of
    weights)."""
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


def compressed_copy(model: nn.Module, codec_options: dict, kernel: str) -> tuple[nn.Module, object]:
    """``compress_(shared_copy(model), SparseMLPConfig(codec_options=...))`` and the copy's arena (None where
    the kernels cannot run: the report says why)."""
    from actzip.memory.modules import SparseMLPConfig, arena_of, compress_

    twin = shared_copy(model)
    compress_(twin, SparseMLPConfig(codec_options={"kernel": kernel, **codec_options}))
    try:
        arena = arena_of(twin)
    except ConfigError:
        arena = None
    return twin, arena


def compressed_copies(model: nn.Module, strategies, kernel: str, arenas: dict) -> dict:
    """A compressed copy of ``model`` per one-liner strategy in ``strategies``; their arenas go into ``arenas``."""
    copies = {}
    for s, opts in ONE_LINERS.items():
        if s in strategies:
            copies[s], arena = compressed_copy(model, opts, kernel)
            if arena is not None:
                arenas[s] = arena
    return copies


def max_grad_diffs(backwards: dict[str, Callable[[], None]], params: list[torch.Tensor]) -> dict[str, float]:
    """Max |grad − grad of ``"none"``| over ``params`` after one forward and backward of each strategy (each
    ``backwards[name]()`` runs one, from the same weights; gradients are cleared between them). The reference
    runs twice: ``"none"`` is the difference between its two runs, the floor that non-deterministic kernels
    (attention's backward on a GPU, say) put under every other figure."""
    out = {}
    ref = None
    first = min(backwards, key=lambda n: n != "none")  # "none", else the first strategy, is the reference
    for name in [first, *backwards]:
        for p in params:
            p.grad = None
        backwards[name]()
        grads = [p.grad for p in params]
        if ref is None:
            ref = [g.clone() if g is not None else None for g in grads]
            continue
        diffs = [(g.float() - r.float()).abs().max() for g, r in zip(grads, ref) if g is not None and r is not None]
        missing = sum((g is None) != (r is None) for g, r in zip(grads, ref))
        out[name] = float("inf") if missing else float(torch.stack(diffs).max()) if diffs else 0.0
    for p in params:
        p.grad = None
    return out
