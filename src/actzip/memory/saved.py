"""The compressed activation cache: compress what autograd saves for backward.

``ActivationCache`` is a context manager over :func:`torch.autograd.graph.saved_tensors_hooks`. Every tensor
autograd saves inside the block goes through the rules (:mod:`actzip.memory.rules`); the first rule that
accepts it picks a codec, and autograd keeps the payload instead of the tensor. In backward the payload is
decoded when autograd asks for the tensor. A tensor saved twice (the same storage, view and version, like a
ReLU output that both ReLU and the next op save) is encoded and counted once, unless the first save was
stored lossily: then each save goes through the rules on its own.

With a lossless codec (the default) backward sees bit-identical tensors, so gradients are bit-identical.

Composition:
- ``torch.utils.checkpoint`` (non-reentrant): checkpointed regions install their own hooks, which take
  precedence inside them; the cache compresses the tensors saved outside those regions.
- ``torch.compile``: the hooks run, outside the compiled code, on the tensors the compiled graph saves; those
  are chosen by the compiler and can differ from eager mode (a fused kernel may save a pre-activation instead
  of a ReLU output), so what is compressed and how much is saved can differ too.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from actzip.core.payload import Payload
from actzip.memory.account import StepAccount
from actzip.memory.handout import Handout
from actzip.memory.roles import role_query
from actzip.memory.rules import CacheConfig, Rule, count_only_rules, default_rules


class _Saved(Handout):
    """What autograd holds in place of a saved tensor: a payload, or the tensor (detached: a node that saves its
    own output would otherwise hold itself through it, a cycle that keeps the whole graph alive)."""

    __slots__ = ("payload", "tensor", "codec", "__weakref__")

    def __init__(self, tensor: torch.Tensor | None, payload: Payload | None, codec) -> None:
        super().__init__()
        self.tensor = tensor
        self.payload = payload
        self.codec = codec

    def get(self) -> torch.Tensor:
        if self.payload is None:
            return self.tensor
        return self.hand_out(lambda: self.codec.decode(self.payload))


class _Name:
    """A saved tensor's name in a codec's error message, formatted only when one is raised (a save's host time
    is the step time of a small model)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = t.shape, t.dtype

    def __str__(self) -> str:
        return f"saved tensor {tuple(self.shape)} {self.dtype}"


_ACTIVE: list["ActivationCache"] = []  # caches whose `with` block is open, innermost last


def current_cache() -> "ActivationCache | None":
    """The innermost open :class:`ActivationCache`, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


def record_external(rule: str, dense_bytes: int, stored_bytes: int) -> None:
    """Account bytes kept for backward outside the hooks (e.g. by a fused autograd function)."""
    cache = current_cache()
    if cache is not None and cache._account is not None:
        cache._account.add(rule, dense_bytes, stored_bytes)


class ActivationCache:
    """Compress the tensors autograd saves inside a ``with`` block.

    >>> cache = ActivationCache()            # lossless sparse for mostly-zero tensors
    >>> with cache:
    ...     loss = model(x).sum()
    >>> loss.backward()
    >>> cache.last.bytes_before, cache.last.bytes_after

    Args:
      config: options of the default rules (:class:`CacheConfig`).
      rules: an explicit rule list instead of the defaults (see :mod:`actzip.memory.rules`).

    Each ``with`` block is one step of accounting: ``cache.last`` is the latest :class:`StepAccount`,
    ``cache.history`` keeps them all (call ``cache.history.clear()`` to drop them).
    """

    def __init__(self, config: CacheConfig | None = None, *, rules: Sequence[Rule] | None = None) -> None:
        self.config = config or CacheConfig()
        self.rules: list[Rule] = list(rules) if rules is not None else default_rules(self.config)
        self.history: list[StepAccount] = []
        self._hooks = None
        self._account: StepAccount | None = None
        self._seen: dict[tuple, tuple[StorageWeakRef, weakref.ref]] = {}
        self._rule_of: dict[int, Rule | None] = {}  # id of a live lossy save -> the rule that made it
        # saves stored so far in the open `with` block, minus one: names a save site (None while rules are only
        # asked about a tensor, not storing it)
        self.save_index: int | None = -1

    @classmethod
    def count_only(cls) -> "ActivationCache":
        """A cache that stores everything as it is and only counts it (same dedup, same accounting)."""
        return cls(rules=count_only_rules())

    @property
    def last(self) -> StepAccount:
        if not self.history:
            raise RuntimeError("ActivationCache has no account yet: use it in a `with` block first")
        return self.history[-1]

    def __enter__(self) -> "ActivationCache":
        if self._hooks is not None:
            raise RuntimeError("ActivationCache is already active; it cannot be entered twice at once")
        self._account = StepAccount()
        self.save_index = -1
        self._seen.clear()
        self._rule_of.clear()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None
        _ACTIVE.remove(self)
        self.history.append(self._account)
        self._account = None
        self._seen.clear()
        self._rule_of.clear()

    # -- hooks -------------------------------------------------------------------------------------------

    def _key(self, t: torch.Tensor):
        if t.layout != torch.strided or t.is_nested:
            return None
        return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t._version)

    def _pack(self, t: torch.Tensor) -> _Saved:
        with role_query():  # the rules ask for t's role, each of them: work it out once
            return self._pack_in_query(t)

    def _pack_in_query(self, t: torch.Tensor) -> _Saved:
        key = self._key(t) if self.config.dedup else None
        if key is not None:
            hit = self._seen.get(key)
            if hit is not None:
                storage_ref, saved_ref = hit
                saved = saved_ref()
                # The storage is still alive, so the same address means the same data (no reuse). A lossy copy
                # is shared only with a save the rules treat the same way (same role, same codec): another
                # save may need more precision than the first got.
                shareable = saved is not None and (
                    saved.codec is None or saved.codec.lossless
                    or _same_treatment(self._rule_for(t), self._rule_of.get(id(saved)))
                )
                if shareable and not storage_ref.expired():
                    saved.shares += 1  # rebuilt once for all of them (actzip.memory.handout)
                    self._account.duplicates += 1
                    self._account.duplicate_bytes += t.numel() * t.element_size()
                    return saved
        saved, rule = self._store(t)
        if key is not None:
            self._seen[key] = (StorageWeakRef(t.untyped_storage()), weakref.ref(saved))
            if saved.codec is not None and not saved.codec.lossless:
                self._rule_of[id(saved)] = rule  # read only while `saved` is alive (checked above)
        return saved

    def _rule_for(self, t: torch.Tensor) -> Rule | None:
        index, self.save_index = self.save_index, None  # a question about t, not a save: no save site
        try:
            return next((rule for rule in self.rules if rule.matches(t)), None)
        finally:
            self.save_index = index

    def _store(self, t: torch.Tensor) -> tuple[_Saved, Rule | None]:
        self.save_index += 1
        dense = t.numel() * t.element_size()
        for rule in self.rules:
            if rule.matches(t):
                name, saved, stored = rule.name, _Saved(t.detach(), None, None), dense
                if rule.codec is not None:
                    payload = rule.codec.encode(t, name=_Name(t))
                    nbytes = payload.nbytes
                    if nbytes >= dense:  # no gain: keep the tensor, drop the payload
                        name = "incompressible"
                    else:
                        saved, stored = _Saved(None, payload, rule.codec), nbytes
                if rule.offload is not None:  # to pinned CPU memory; `stored` becomes the device bytes kept
                    saved, stored = rule.offload.stash(saved, stored)
                self._account.add(name, dense, stored)
                return saved, rule
        self._account.add("unmatched", dense, dense)
        return _Saved(t.detach(), None, None), None

    def pack(self, t: torch.Tensor) -> _Saved:
        """Store ``t`` as the hooks would (for code that installs hooks of its own inside the block)."""
        return self._pack(t)

    @staticmethod
    def unpack(saved: _Saved) -> torch.Tensor:
        return saved.get()

    _unpack = unpack


def _same_treatment(a: Rule | None, b: Rule | None) -> bool:
    """Would rule ``a`` store a tensor exactly as rule ``b`` did (same codec and options, same offload)? Then a
    second save may share the first one's lossy copy, whichever roles the two rules are for."""
    if a is b:
        return True
    if a is None or b is None or a.codec is None or b.codec is None or a.offload is not b.offload:
        return False
    opts = getattr(type(a.codec), "options", None)
    return type(a.codec) is type(b.codec) and callable(opts) and a.codec.options() == b.codec.options()
