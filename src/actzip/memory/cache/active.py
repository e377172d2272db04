"""The caches whose ``with`` block is open, and what code outside their hooks reports to them.

A rule's decision may depend on where in the step a tensor is saved (the n-th save of the block), and a fused
autograd function that keeps bytes for backward without the saved-tensor hooks still belongs in the step's
account: both ask for the innermost open cache here, which the cache context registers itself with.
"""

from __future__ import annotations

__all__ = ["close_cache", "current_cache", "open_cache", "record_external"]

_OPEN: list = []  # caches whose `with` block is open, innermost last


def current_cache():
    """The innermost open cache (a :class:`~actzip.memory.cache.context.CacheContext`), or ``None``."""
    return _OPEN[-1] if _OPEN else None


def open_cache(cache) -> None:
    """Make ``cache`` the innermost open cache (its ``with`` block has begun)."""
    _OPEN.append(cache)


def close_cache(cache) -> None:
    """``cache``'s ``with`` block has ended."""
    _OPEN.remove(cache)


def record_external(rule: str, dense_bytes: int, stored_bytes, *, compiled: bool = False) -> None:
    """Account bytes kept for backward outside the hooks (e.g. by a fused autograd function, or by a compiled
    graph: ``compiled``) in the innermost open cache's step, under ``rule``; nothing happens when no cache is
    open."""
    cache = current_cache()
    if cache is not None:
        cache.record(rule, dense_bytes, stored_bytes, compiled=compiled)
