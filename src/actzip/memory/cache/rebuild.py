"""Saved tensors rebuilt in backward from tensors autograd keeps anyway: lossless, no bytes stored.

Some tensors that autograd saves are cheap to make again from others it saves anyway: the output of a norm from
its input (which the norm's backward keeps), a contiguous copy from the tensor it copies, ``relu(h)²`` from the
sparse payload of ``relu(h)``. Inside :class:`rebuild_saved`, a save of such a *target* (or of a view of it) is
kept as a small handle that runs the target's ``make()`` when backward asks for it; ``make()`` must give the
same bits (the same deterministic op on the same inputs), so gradients are bit-identical.

``make`` closes over the tensors it rebuilds from: those stay alive until backward. That costs nothing only when
autograd keeps them anyway (a norm's input, an attention output): point ``make`` at nothing else. Saves that are
not targets go to the enclosing cache (``actzip.cache``) if one is open (these hooks hide it),
else to an enclosing :class:`rebuild_saved` block's targets, else are kept as they are. Rebuilt tensors are
accounted as stored in 0 bytes (account rule ``rebuilt``).

Inside a block opened with ``upcasts_of=x``, a save of an exact upcast of ``x`` (autograd's own cast of ``x`` to a
wider float dtype: bf16 or fp16 to float32, say, what transformers' RMSNorms do first) is kept as a handle that
casts ``x`` again: the cast is exact, so the bits are the same, and ``x`` costs half the bytes of its float32 copy.

A producer can also mark its output as rebuildable (:func:`mark_rebuildable`, what the fused MLPs' norm hooks
do), and a consumer that would save it asks :func:`rebuildable` for a target to open a block with.

Only targets that are contiguous from offset 0 of their storage are taken (the rebuilt tensor is made that way,
and a saved view of it is re-viewed with the same size, stride and offset); others are saved as usual.
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable, Sequence

import torch

from actzip.errors import ActzipError
from actzip.memory.cache.active import current_cache, record_external
from actzip.memory.cache.roles import storage_key

__all__ = ["Target", "autocast_as_now", "is_upcast_of", "mark_rebuildable", "rebuild_saved", "rebuildable", "recompute"]

Target = tuple[torch.Tensor, Callable[[], torch.Tensor]]


class _Rebuild:
    """What autograd keeps instead of a tensor that can be made again."""

    __slots__ = ("make", "size", "stride", "offset")

    def __init__(self, make: Callable[[], torch.Tensor], view: torch.Tensor) -> None:  # noqa: D107
        self.make = make
        self.size, self.stride, self.offset = view.size(), view.stride(), view.storage_offset()

    def get(self) -> torch.Tensor:
        return self.make().as_strided(self.size, self.stride, self.offset)


class _Open(threading.local):
    def __init__(self) -> None:
        self.blocks: list[list] = []  # target keys of the open rebuild_saved blocks, innermost last


_OPEN = _Open()


class rebuild_saved(torch.autograd.graph.saved_tensors_hooks):
    """``with rebuild_saved([(tensor, make), ...]):`` saves of ``tensor`` (or a view of it) become rebuild handles.

    Autograd keeps the hook functions with every tensor they packed, so they must not refer to the targets
    themselves (that would keep them alive, defeating the point): they know them by storage address, which
    cannot be reused while the targets are alive, i.e. during the block.
    """

    def __init__(self, targets: Sequence[Target], upcasts_of: torch.Tensor | None = None) -> None:
        keys = [(k, make) for t, make in targets
                if t.is_contiguous() and t.storage_offset() == 0 and (k := storage_key(t)) is not None]
        outer = [k for block in _OPEN.blocks for k in block]  # an enclosing block's targets stay rebuildable
        self._keys = keys
        every = keys + outer
        cache = current_cache()
        # weakly: the hooks outlive the block with every tensor they packed (see above)
        source = weakref.ref(upcasts_of) if upcasts_of is not None else lambda: None

        def pack(t: torch.Tensor):
            key = storage_key(t)
            if key is not None:
                for target, make in every:
                    if key == target:
                        record_external("rebuilt", t.numel() * t.element_size(), 0)
                        return _Rebuild(make, t)
            src = source()
            if src is not None and is_upcast_of(t, src):
                record_external("rebuilt", t.numel() * t.element_size(), 0)
                return _Rebuild(recompute(torch.Tensor.to, src, t.dtype), t)
            return cache.pack(t) if cache is not None else t.detach()  # detached: no node -> itself cycle

        def unpack(saved):
            if isinstance(saved, _Rebuild):
                return saved.get()
            return cache.unpack(saved) if cache is not None else saved

        super().__init__(pack, unpack)

    def __enter__(self):
        _OPEN.blocks.append(self._keys)
        return super().__enter__()

    def __exit__(self, *exc):
        _OPEN.blocks.pop()
        return super().__exit__(*exc)


# Casts that are exact: every value of the narrower float dtype is a value of the wider one.
_WIDER = {torch.float16: (torch.float32, torch.float64), torch.bfloat16: (torch.float32, torch.float64),
          torch.float32: (torch.float64,)}


def is_upcast_of(t: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether autograd made ``t`` as ``src.to(wider dtype)`` (same device, shape and contiguous layout), so
    that ``src.to(t.dtype)`` gives ``t`` again bit for bit."""
    fn = t.grad_fn
    if (fn is None or type(fn).__name__ != "ToCopyBackward0" or t.dtype not in _WIDER.get(src.dtype, ())
            or t.device != src.device or t.shape != src.shape or not (t.is_contiguous() and src.is_contiguous())):
        return False
    node = fn.next_functions[0][0] if fn.next_functions else None
    if src.grad_fn is not None:
        return node is src.grad_fn
    return node is not None and getattr(node, "variable", None) is src  # src a leaf: its AccumulateGrad


def recompute(fn: Callable[..., torch.Tensor], *args, **kwargs) -> Callable[[], torch.Tensor]:
    """``make`` for a target: ``fn(*args, **kwargs)`` again, without building a graph and under the autocast
    state of now (so a rebuilt tensor has the dtype and bits of the original). A tensor argument modified in
    place since (its version counter moved) would give other values: ``make()`` raises ActzipError then."""
    dev = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    again = autocast_as_now(dev)
    inputs = [(a, a._version) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]

    def make() -> torch.Tensor:
        if any(t._version != v for t, v in inputs):
            name = getattr(fn, "__qualname__", type(fn).__name__)
            raise ActzipError(f"rebuild: an input of {name} was modified in place after the forward, so its output "
                              "cannot be made again for backward")
        with torch.no_grad(), again():
            return fn(*args, **kwargs)

    return make


def autocast_as_now(device_type: str) -> Callable[[], torch.autocast]:
    """A factory of autocast contexts that restore the autocast state ``device_type`` has now."""
    enabled = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if enabled else None
    return lambda: torch.autocast(device_type, dtype=dtype, enabled=enabled)


_MARK = "actzip_rebuild"  # the attribute a marked tensor carries: (make, its version when marked)


def mark_rebuildable(t: torch.Tensor, make: Callable[[], torch.Tensor]) -> None:
    """Say that ``make()`` gives ``t`` again, bit for bit, for as long as ``t`` is not modified in place."""
    setattr(t, _MARK, (make, t._version))


def rebuildable(t: torch.Tensor) -> list[Target]:
    """``[(t, make)]`` if ``t`` was marked by :func:`mark_rebuildable` and not modified since, else ``[]``:
    the targets for a :class:`rebuild_saved` block around the ops that save ``t``."""
    mark = getattr(t, _MARK, None)
    if mark is None or mark[1] != t._version:
        return []
    return [(t, mark[0])]
