"""Offload: keep what the activation cache stores in pinned CPU memory instead of GPU memory.

A rule with an :class:`Offloader` (``Rule(name, when, codec, offload=Offloader())``, or every rule of a preset
with ``actzip.cache(name, offload=True)``) hands what it stores (the saved tensor itself, or the payload a codec
made of it, lossless or quantized) to the offloader, which moves it to the host and back:

- **pack** (forward, on the compute stream ``C``): the offloader's side stream ``S`` waits for ``C`` (the data
  is ready), copies every buffer into pinned host memory (``non_blocking``) and records an event when done.
  Each device buffer is then marked as used on ``S`` (``record_stream``) and dropped: PyTorch's caching
  allocator hands that memory out again only once ``S`` has passed the copy, so ``C`` never overwrites data
  still being read, and nothing waits for the copy: forward goes on while it runs.
- **unpack** (backward): ``C`` waits for the copy's event (on the GPU, not the host) and copies the buffers
  back, then the codec, if any, decodes them. With ``prefetch=k`` (default 1) unpacking a tensor also starts,
  on ``S``, the copy back of the ``k`` tensors stored just before it (the ones backward needs next), so those
  copies overlap backward's compute; their use then only waits for an event.

No step synchronizes with the host. Pinned memory comes from PyTorch's caching host allocator, which reuses a
block only after the copies that used it are done.

On the CPU (or any tensor not on a CUDA device) there is no device memory to free: the offloader keeps the
tensor or payload where it is, warns once per device type and counts it (:func:`offload_fallbacks`).

Accounting: the activation cache counts an offloaded tensor with the device bytes it keeps, 0;
``Offloader.stats`` counts the bytes sent to the host and the copies made.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from collections import Counter
from dataclasses import dataclass

import torch

from actzip.api import Config
from actzip.core.layout import memory_order, restore_order
from actzip.errors import ConfigError
from actzip.memory.cache.stored import StoredActivation

__all__ = ["OffloadConfig", "OffloadStats", "Offloader", "offload_fallbacks", "reset_offload_fallbacks"]


@dataclass
class OffloadConfig(Config):
    """Options of an :class:`Offloader` (``actzip.cache(..., offload=OffloadConfig(prefetch=2))``)."""

    prefetch: int = 1  # tensors copied back ahead of their use when one is unpacked (0: each on its own use)

    def validate(self) -> None:
        if not isinstance(self.prefetch, int) or isinstance(self.prefetch, bool) or self.prefetch < 0:
            raise ConfigError(f"OffloadConfig.prefetch must be an int >= 0, got {self.prefetch!r}")


@dataclass
class OffloadStats:
    """What an :class:`Offloader` has done so far."""

    offloaded: int = 0  # tensors or payloads moved to pinned host memory
    offloaded_bytes: int = 0  # bytes copied to the host
    host_bytes: int = 0  # pinned bytes held now (for tensors autograd still keeps)
    prefetched: int = 0  # copies back started ahead of use
    loaded_on_use: int = 0  # copies back started when unpacked (nothing prefetched)
    kept: int = 0  # left where they were (not on a CUDA device)


_lock = threading.Lock()
_fallbacks: Counter[str] = Counter()


def offload_fallbacks() -> dict[str, int]:
    """How many stored tensors were kept in place because they were not on a CUDA device, by device type."""
    with _lock:
        return dict(_fallbacks)


def reset_offload_fallbacks() -> None:
    """Forget the counts (and so warn again)."""
    with _lock:
        _fallbacks.clear()


def _announce_kept(device_type: str) -> None:
    with _lock:
        first = device_type not in _fallbacks
        _fallbacks[device_type] += 1
    if first:
        warnings.warn(
            f"actzip offload: saved tensors on a {device_type} device stay where they are (offloading moves CUDA "
            f"memory to pinned host memory; there is nothing to free here). Warned once; "
            f"actzip.memory.cache.offload.offload_fallbacks() counts every time",
            RuntimeWarning,
            stacklevel=4,
        )


class _Stash(StoredActivation):
    """What autograd holds for an offloaded tensor or payload: host buffers and how to rebuild it."""

    __slots__ = ("__weakref__", "codec", "copied", "dev", "device", "host", "nbytes", "owner",
                 "payload", "perm", "prev", "ready", "shape")  # fmt: skip

    def __init__(self, owner, codec, payload, shape, perm, device, host, copied) -> None:
        super().__init__()
        self.owner = owner  # the Offloader
        self.codec = codec  # decodes the payload; None for a tensor kept as is (the cache's dedup reads it)
        self.payload = payload  # the payload without its buffers, or None
        self.shape, self.perm = shape, perm  # a kept tensor's shape and memory order
        self.device = device
        self.host = host  # name -> pinned host tensor
        self.copied = copied  # event on the side stream: the host copies are complete
        self.dev = None  # name -> device tensors copied back ahead of use (prefetch), or None
        self.ready = None  # event: those copies are complete
        self.prev = None  # weak reference to the stash stored just before this one
        self.nbytes = sum(h.numel() * h.element_size() for h in host.values())

    def get(self) -> torch.Tensor:
        return self.hand_out(self._rebuild)  # a save shared by several ops loads once

    def _rebuild(self) -> torch.Tensor:
        bufs = self.owner._load(self)
        if self.payload is None:
            t = restore_order(bufs["tensor"], self.shape, self.perm)
        else:
            t = self.codec.decode(dataclasses.replace(self.payload, buffers=bufs))
        self.owner._prefetch_before(self)
        return t

    def __del__(self) -> None:
        try:
            with self.owner._lock:
                self.owner.stats.host_bytes -= self.nbytes
        except (AttributeError, TypeError):  # interpreter shutdown: nothing left to count
            pass


class Offloader:
    """Moves what the activation cache stores to pinned CPU memory on a side CUDA stream, and back.

    Give it to the rules whose output should leave the GPU (one offloader can serve many rules, and keeps one
    side stream per device). See the module docstring for how copies are ordered. ``stats`` says what it did.
    """

    def __init__(self, config: OffloadConfig | None = None) -> None:
        self.config = config or OffloadConfig()
        self.stats = OffloadStats()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._last = None  # weak reference to the latest stash
        self._lock = threading.RLock()  # re-entrant: a stash freed (its __del__) while the lock is held

    def __repr__(self) -> str:
        return f"Offloader(prefetch={self.config.prefetch})"

    def _side(self, device: torch.device) -> torch.cuda.Stream:
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        return stream

    def stash(self, saved, stored_bytes: int):
        """Offload ``saved`` (what the cache would keep: ``.tensor``, or ``.payload`` and ``.codec``).

        Returns ``(what autograd holds, device bytes it keeps)``: a handle and 0, or, off CUDA, ``saved``
        itself and ``stored_bytes``.
        """
        payload = saved.payload
        if payload is None:
            flat, perm = memory_order(saved.tensor.detach())
            buffers, shape = {"tensor": flat}, saved.tensor.shape
        else:
            buffers, shape, perm = payload.buffers, payload.shape, None
        device = flat.device if payload is None else payload.device
        if device.type != "cuda" or not all(b.is_cuda for b in buffers.values()):
            with self._lock:
                self.stats.kept += 1
            _announce_kept(device.type)
            return saved, stored_bytes
        side = self._side(device)
        side.wait_stream(torch.cuda.current_stream(device))  # the data is ready before it is copied
        host = {}
        with torch.cuda.stream(side):
            for k, b in buffers.items():
                host[k] = torch.empty(b.shape, dtype=b.dtype, pin_memory=True)
                host[k].copy_(b, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(side)
        for b in buffers.values():
            b.record_stream(side)  # its memory is reused only after the copy
        empty = None if payload is None else dataclasses.replace(payload, buffers={})
        stash = _Stash(self, saved.codec, empty, shape, perm, device, host, copied)
        with self._lock:
            stash.prev, self._last = self._last, weakref.ref(stash)
            self.stats.offloaded += 1
            self.stats.offloaded_bytes += stash.nbytes
            self.stats.host_bytes += stash.nbytes
        return stash, 0

    def _load(self, stash: _Stash) -> dict[str, torch.Tensor]:
        """The stash's buffers on its device, usable on the current stream."""
        cur = torch.cuda.current_stream(stash.device)
        if stash.dev is not None:  # prefetched: wait for the copy back (on the GPU)
            bufs, stash.dev = stash.dev, None
            cur.wait_event(stash.ready)
            for b in bufs.values():
                b.record_stream(cur)  # harmless if it was allocated on this stream
            return bufs
        cur.wait_event(stash.copied)  # the host copy is complete before it is read
        with self._lock:
            self.stats.loaded_on_use += 1
        return {k: torch.empty_like(h, device=stash.device).copy_(h, non_blocking=True) for k, h in stash.host.items()}

    def _prefetch_before(self, stash: _Stash) -> None:
        """Start copying back the ``prefetch`` stashes stored before ``stash`` (backward needs them next)."""
        node = stash
        for _ in range(self.config.prefetch):
            node = node.prev() if node.prev is not None else None
            if node is None:
                return
            if node.dev is None and node.last() is None and node.device == stash.device:
                self._prefetch(node)

    def _prefetch(self, node: _Stash) -> None:
        cur = torch.cuda.current_stream(node.device)
        side = self._side(node.device)
        dev = {k: torch.empty_like(h, device=node.device) for k, h in node.host.items()}  # from cur's memory
        side.wait_stream(cur)  # that memory's previous users on cur are done before it is written
        with torch.cuda.stream(side):  # the side stream already passed the host copy (same stream)
            for k, h in node.host.items():
                dev[k].copy_(h, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(side)
        for b in dev.values():
            b.record_stream(side)
        node.dev, node.ready = dev, ready
        with self._lock:
            self.stats.prefetched += 1
