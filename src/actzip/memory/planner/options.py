"""What a recovery unit can do with the tensors it saves for backward, and how each option is run.

- ``keep``: nothing (autograd keeps what it keeps);
- ``checkpoint``: keep only the unit's inputs and run its forward again in backward
  (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant, RNG state restored: bit-identical);
- a cache preset (``lossless``, ``conservative``, ``balanced``, ``4bit``, ``2bit``): the unit's forward inside an
  activation cache block of that preset (:mod:`actzip.memory.cache`);
- ``offload``: the lossless cache with what it stores moved to pinned CPU memory (CUDA only).

Lossless options (``keep``, ``checkpoint``, ``lossless``, ``offload``) give bit-identical gradients.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from actzip.errors import ConfigError
from actzip.memory.cache import CacheConfig, CacheContext, preset_names

__all__ = ["LOSSLESS", "OPTIONS", "run_option", "option_context"]

LOSSLESS = ("keep", "checkpoint", "lossless", "offload")
OPTIONS = LOSSLESS + ("conservative", "balanced", "4bit", "2bit")


def _cache_config(option: str, min_bytes: int) -> CacheConfig:
    if option == "offload":
        return CacheConfig(preset="lossless", offload=True, min_bytes=min_bytes)
    if option not in preset_names():
        raise ConfigError(f"planner: unknown option {option!r}; choose from {list(OPTIONS)}")
    return CacheConfig(preset=option, min_bytes=min_bytes)


def option_context(option: str, min_bytes: int = 0) -> Callable[[], contextlib.AbstractContextManager]:
    """A factory of the ``with`` block option ``option`` runs a unit's forward in (checkpoint and keep: none);
    a cache option gets one :class:`CacheContext`, entered once per forward."""
    if option in ("keep", "checkpoint"):
        return contextlib.nullcontext
    ctx = CacheContext(_cache_config(option, min_bytes))
    return lambda: ctx


def run_option(option: str, forward: Callable, block, args: tuple, kwargs: dict):
    """``forward(*args, **kwargs)`` under ``option`` (``block`` from :func:`option_context`)."""
    if option == "checkpoint" and torch.is_grad_enabled():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    with block():
        return forward(*args, **kwargs)
