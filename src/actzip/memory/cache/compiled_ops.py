"""The codecs as operators a compiled graph can hold: ``actzip::encode_saved`` and ``actzip::decode_saved``.

When the activation cache decides that a tensor a ``torch.compile``'d graph saves is to be compressed
(:mod:`actzip.memory.cache.graph_hooks`), AOTAutograd puts ``encode_saved`` at the end of the forward graph
and ``decode_saved`` at the start of the backward graph, and the graph keeps the payload's buffers instead of
the tensor. Both are ``torch.library`` custom ops: opaque to the compiler, so they run the codec itself (its
Triton kernels on CUDA, the same payloads, the same guarantees as in eager code) and draw new stochastic
rounding noise on every call. Their fake kernels run the codec's PyTorch code on fake tensors, so the shapes
and strides the compiler plans with are those the real kernels make, by construction.

Only codecs whose payload size follows from the tensor's shape and dtype (``Codec.fixed_size``: ``quant``,
``fp8``, ``cast``) can be held by a graph. A graph names its codec by a key (:func:`codec_key`); the codec
object, with its random stream, lives in this module's table for the life of the process.

``encode_saved`` also tells the open cache what it stored (rule, bytes before and after), and
``note_kept`` what a graph keeps as it is (it returns an empty tensor the graph saves, so that it runs), so the
cache's account reports a compiled step as it does an eager one. Where shapes are static, one ``note_graph``
call per graph run accounts for all its saves at once from a table made at compile time (:func:`graph_saves`).
"""

from __future__ import annotations

import threading

import torch

from actzip.codecs.base import Codec
from actzip.core import registry
from actzip.core.payload import Payload
from actzip.errors import ConfigError
from actzip.memory.cache.active import record_external

__all__ = ["codec_key", "codec_of", "graph_saves", "register"]

_lock = threading.Lock()
_CODECS: dict[str, Codec] = {}  # key -> the codec a graph runs (it keeps its random stream)
_TWINS: dict[str, Codec] = {}  # key -> the same codec on its PyTorch code: what the fake kernels run
_KEYS: dict[int, str] = {}  # id of a codec -> its key


def codec_key(codec: Codec) -> str:
    """The key a compiled graph names ``codec`` by (one per codec object; the table keeps the object)."""
    if not getattr(codec, "fixed_size", False):
        raise ConfigError(f"codec {codec.name!r} cannot run inside a compiled graph: its payload size depends on "
                          "the data")
    with _lock:
        key = _KEYS.get(id(codec))
        if key is None:
            key = f"{codec.name}#{len(_CODECS)}"
            options = codec.options()
            if "kernel" in options:
                options["kernel"] = "torch"
            _CODECS[key], _TWINS[key], _KEYS[id(codec)] = codec, registry.get(codec.name, **options), key
        return key


def codec_of(key: str, *, fake: bool = False) -> Codec:
    """The codec a graph names by ``key`` (``fake``: its PyTorch twin, for fake tensors)."""
    try:
        return (_TWINS if fake else _CODECS)[key]
    except KeyError:
        raise ConfigError(f"no codec is registered for compiled graphs under {key!r} (graphs compiled in another "
                          "process cannot be reused: recompile)") from None


def _payload(key: str, buffers: list[torch.Tensor], shape, stride, dtype: torch.dtype, fake: bool) -> Payload:
    codec = codec_of(key, fake=fake)
    like = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    names, meta = codec.payload_layout(like)
    if len(names) != len(buffers):
        raise ConfigError(f"{key}: a compiled graph holds {len(buffers)} buffers for a payload of {len(names)}")
    return Payload(codec.name, torch.Size(shape), dtype, buffers[0].device, dict(zip(names, buffers)), meta)


# key of a compiled graph -> {saved node: (rule, bytes before, bytes after)}, filled while the graph is traced
_GRAPH_SAVES: dict[str, dict[str, tuple[str, int, int]]] = {}


def graph_saves(key: str) -> dict[str, tuple[str, int, int]]:
    """The table of what the compiled graph ``key`` saves, by saved node (filled while it is traced)."""
    with _lock:
        return _GRAPH_SAVES.setdefault(key, {})


_registered = False


def register() -> None:
    """Register the custom ops with PyTorch (once; registering loads dynamo, so ``import actzip`` does not)."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    _define()


def _define() -> None:
    @torch.library.custom_op("actzip::encode_saved", mutates_args=())
    def encode_saved(x: torch.Tensor, codec: str, rule: str) -> list[torch.Tensor]:
        """The buffers of ``x`` encoded by the codec ``codec`` names, in the codec's order; accounted under
        ``rule`` in the open cache's step."""
        c = codec_of(codec)
        payload = c.encode(x, name=f"tensor {tuple(x.shape)} {x.dtype} saved by a compiled graph")
        names, _ = c.payload_layout(x)
        record_external(rule, x.numel() * x.element_size(), payload.nbytes, compiled=True)
        return [payload.buffers[n] for n in names]


    @encode_saved.register_fake
    def _encode_saved_fake(x: torch.Tensor, codec: str, rule: str) -> list[torch.Tensor]:
        twin = codec_of(codec, fake=True)
        payload = twin.encode(x)
        names, _ = twin.payload_layout(x)
        return [payload.buffers[n] for n in names]


    @torch.library.custom_op("actzip::decode_saved", mutates_args=())
    def decode_saved(buffers: list[torch.Tensor], codec: str, shape: list[int], stride: list[int],
                     dtype: torch.dtype) -> torch.Tensor:
        """The tensor the buffers of :func:`encode_saved` stand for (shape, strides and dtype of the one encoded)."""
        return codec_of(codec).decode(_payload(codec, buffers, shape, stride, dtype, fake=False))


    @decode_saved.register_fake
    def _decode_saved_fake(buffers, codec, shape, stride, dtype):
        return codec_of(codec, fake=True).decode(_payload(codec, buffers, shape, stride, dtype, fake=True))


    @torch.library.custom_op("actzip::note_kept", mutates_args=())
    def note_kept(x: torch.Tensor, rule: str) -> torch.Tensor:
        """Account ``x``, which a compiled graph keeps as it is, under ``rule``; an empty tensor to save."""
        n = x.numel() * x.element_size()
        record_external(rule, n, n, compiled=True)
        return x.new_empty(0)


    @note_kept.register_fake
    def _note_kept_fake(x: torch.Tensor, rule: str) -> torch.Tensor:
        return x.new_empty(0)


    @torch.library.custom_op("actzip::note_graph", mutates_args=())
    def note_graph(x: torch.Tensor, key: str) -> torch.Tensor:
        """Account everything the compiled graph ``key`` saves (:func:`graph_saves`) in the open cache's step: one
        call per run of the graph, whatever it saves; an empty tensor to save, so that the graph keeps the call."""
        for rule, dense, stored in _GRAPH_SAVES.get(key, {}).values():
            record_external(rule, dense, stored, compiled=True)
        return x.new_empty(0)


    @note_graph.register_fake
    def _note_graph_fake(x: torch.Tensor, key: str) -> torch.Tensor:
        return x.new_empty(0)
