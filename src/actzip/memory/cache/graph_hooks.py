"""The cache's saved-tensor hooks, in a form ``torch.compile`` puts inside its graphs.

``torch.autograd.graph.saved_tensors_hooks`` run, in eager code, on every tensor autograd saves. A
``torch.compile``'d region is one autograd function whose saves the compiler chose; PyTorch inlines hooks that
are ``torch.fx.GraphModule`` objects into that function's graphs (the pack hook at the end of the forward
graph, the unpack hook at the start of the backward graph), and dynamo recompiles when the hooks change. So
the cache's hooks are such graph modules (:func:`hook_pair`):

- called eagerly (what eager code saves, and code between graph breaks), they go straight to the open cache's
  own pack and unpack (:class:`~actzip.memory.cache.context.CacheContext`), with no graph in between;
- traced into a compiled graph, the pack hook decides each saved node once, at compile time: its role comes
  from the backward graph (:mod:`actzip.memory.cache.compiled_roles`), the cache's rules pick the treatment
  (:meth:`CacheContext.compiled_rule`), and the graph encodes it: a ``quant`` codec in the graph's own tensor
  operations, which the compiler fuses with the kernels around them (:mod:`actzip.memory.cache.compiled_quant`),
  other codecs through their custom op (:mod:`actzip.memory.cache.compiled_ops`); the unpack hook decodes it in
  the backward graph. The codec's custom op is the default; ``CacheConfig(fuse_compiled=True)`` asks for the
  fused form. With static shapes the graph accounts the saves it keeps (and the fused ones) with one call per
  run (``note_graph``).

What cannot be done inside a graph is kept and announced once (:func:`announce`, counted in
:func:`announcements`): codecs whose payload size depends on the data (the lossless sparse codec), offloading
to the CPU, a rule whose test reads the tensor's values. Inputs and parameters of a compiled graph never reach
the hooks (PyTorch applies them to the graph's own intermediates only).

Where PyTorch cannot inline hooks (compiled autograd, or a PyTorch without the hook context that says which node
is being saved) the hooks run eagerly on a compiled region's saves and the cache keeps those
(:mod:`actzip.memory.cache.compiled`).
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import warnings
from collections import Counter

import torch
import torch.fx

from actzip.memory.cache.active import current_cache
from actzip.memory.cache import compiled_quant
from actzip.memory.cache.compiled_ops import codec_key, graph_saves
from actzip.memory.cache.compiled_ops import register as register_ops
from actzip.memory.cache.compiled_roles import saved_role
from actzip.memory.cache.roles import OTHER
from actzip.memory.cache.stored import StoredActivation

__all__ = ["ENCODED", "KEPT", "QUANT", "announce", "announcements", "graph_pack", "graph_unpack", "hook_context",
           "hook_pair", "inlining_available", "not_traced"]

ENCODED = "actzip:encoded"  # first element of what the pack hook returns inside a graph for a payload
KEPT = "actzip:kept"  # ... for a tensor the graph keeps as it is
QUANT = "actzip:quant"  # ... for a quant payload made by the graph's own operations (compiled_quant)

# Where PyTorch keeps its record of the saved node whose pack hook is being traced (a private, versioned API).
# Looked up in sys.modules only: nothing is traced before AOTAutograd is loaded, and importing it loads dynamo.
_AOT_MODULE = "torch._functorch._aot_autograd.graph_compile"
_CONTEXT_NAME = "_get_saved_tensor_hook_context"

_lock = threading.Lock()
_announced: Counter[str] = Counter()
_graph_numbers = itertools.count()


def inlining_available() -> bool:
    """Whether this PyTorch inlines graph-module hooks into compiled graphs and says which node is saved."""
    import importlib

    try:
        return hasattr(importlib.import_module(_AOT_MODULE), _CONTEXT_NAME)
    except ImportError:  # pragma: no cover - depends on the PyTorch version
        return False


def hook_context() -> dict | None:
    """While a pack hook is traced into a compiled graph: ``{"_node", "_fw_graph", "_bw_graph"}``; else ``None``."""
    context = getattr(sys.modules.get(_AOT_MODULE), _CONTEXT_NAME, None)
    return None if context is None else context()


def announce(what: str, why: str) -> None:
    """Count one thing a compiled graph keeps as it is; warn the first time for each ``what``."""
    with _lock:
        first = what not in _announced
        _announced[what] += 1
    if first:
        warnings.warn(f"actzip.cache under torch.compile: {what}: {why} (warned once; "
                      "actzip.memory.cache.graph_hooks.announcements() counts every time)", RuntimeWarning,
                      stacklevel=3)


def announcements() -> dict[str, int]:
    """How many saved nodes each announced reason kept, in this process (one per compile, not per step)."""
    with _lock:
        return dict(_announced)


def graph_pack(x):
    """The pack hook as traced into a compiled graph: decide the saved node once and return what the graph keeps."""
    cache = current_cache()
    if cache is None or not isinstance(x, torch.Tensor):
        return x
    register_ops()
    ctx = hook_context()
    role = saved_role(ctx["_node"], ctx["_bw_graph"]) if ctx else OTHER
    name, codec = cache.compiled_rule(x, role)
    static = ctx is not None and all(isinstance(n, int) for n in (*x.shape, *x.stride()))
    dense = x.numel() * x.element_size() if static else None
    if codec is not None and static and cache.config.fuse_compiled and compiled_quant.supports(codec):
        codes, lo, span = compiled_quant.encode(x, codec.bits, codec.group_size, codec.rounding == "stochastic")
        note = _note(ctx, name, dense, sum(t.numel() * t.element_size() for t in (codes, lo, span)), x)
        return (QUANT, note, codes, lo, span, tuple(x.shape), tuple(x.stride()), x.dtype, codec.bits,
                codec.group_size)
    if codec is None:
        note = _note(ctx, name, dense, dense, x) if static else torch.ops.actzip.note_kept(x, name)
        return (KEPT, x, note)
    key = codec_key(codec)
    buffers = torch.ops.actzip.encode_saved(x, key, name)
    return (ENCODED, key, tuple(buffers), tuple(x.shape), tuple(x.stride()), x.dtype)


def _note(ctx: dict, rule: str, dense: int, stored: int, x: torch.Tensor):
    """Enter a save of the graph being traced in its table; the graph's first save also carries the one
    ``note_graph`` call that accounts the whole table on every run (``None`` for the others)."""
    graph = ctx["_fw_graph"]
    key = getattr(graph, "_actzip_saves_key", None)
    if key is None:
        with _lock:
            key = f"graph#{next(_graph_numbers)}"
        graph._actzip_saves_key = key
    table = graph_saves(key)
    node = ctx["_node"].name
    first = not table or next(iter(table)) == node
    table[node] = (rule, dense, stored)
    return torch.ops.actzip.note_graph(x, key) if first else None


def graph_unpack(packed):
    """The unpack hook as traced into a compiled graph's backward: the tensor :func:`graph_pack` stands for."""
    if not isinstance(packed, tuple) or not packed or packed[0] not in (ENCODED, KEPT, QUANT):
        return packed
    if packed[0] == KEPT:
        return packed[1]
    if packed[0] == QUANT:
        _, _, codes, lo, span, shape, stride, dtype, bits, group_size = packed
        return compiled_quant.decode(codes, lo, span, list(shape), list(stride), dtype, bits, group_size)
    _, key, buffers, shape, stride, dtype = packed
    return torch.ops.actzip.decode_saved(list(buffers), key, list(shape), list(stride), dtype)


_callback_of_thread = None  # get_eval_frame_callback, looked up once (not an import per save)


def _dynamo_watching() -> bool:
    """Whether dynamo would intercept a Python frame entered now on this thread (a compiled region is running)."""
    global _callback_of_thread
    if _callback_of_thread is None:
        try:
            from torch._C._dynamo.eval_frame import get_eval_frame_callback as _callback_of_thread
        except ImportError:  # pragma: no cover - depends on the PyTorch version: assume it would
            _callback_of_thread = lambda: True  # noqa: E731
    callback = _callback_of_thread()
    return callback is not None and callback is not False


def not_traced(fn):
    """``fn``, which dynamo must not trace: saved-tensor hooks run from autograd's C++ code, also between a
    compiled region's graph breaks, where dynamo would try to compile them. ``torch.compiler.disable`` is applied
    on the first call made while dynamo watches frames (loading dynamo at import would load Triton with it); in
    plain eager code, where nothing watches, ``fn`` is called as it is (the wrapper's frame switching would be
    host time on every save)."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if "torch._dynamo" not in sys.modules or not _dynamo_watching():
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


@not_traced
def _eager_pack(self, t):
    if hook_context() is not None:  # being traced into a graph: run the graph (graph_pack)
        return torch.nn.Module.__call__(self, t)
    return current_cache().pack_eager(t)


@not_traced
def _eager_unpack(self, packed):
    if isinstance(packed, StoredActivation):
        return packed.get()  # decoding: the codec's own kernels
    return torch.nn.Module.__call__(self, packed)


def _hook_module(fn, eager) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    graph.output(graph.call_function(fn, (graph.placeholder("saved"),)))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    # Each GraphModule has a class of its own: calling it eagerly skips the module and graph machinery.
    type(module).__call__ = eager
    return module


_PAIRS: dict[str, tuple[torch.fx.GraphModule, torch.fx.GraphModule]] = {}


def hook_pair(decisions: str) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The (pack, unpack) hooks of caches whose rules decide alike, named by ``decisions`` (a cache's
    :attr:`~actzip.memory.cache.context.CacheContext.decisions`). Dynamo guards on the hooks' identity: a region
    compiled under one cache is compiled once for every cache of the same rules (built afresh each step, too),
    and again for other rules, whose decisions it holds."""
    with _lock:
        pair = _PAIRS.get(decisions)
        if pair is None:
            pair = _PAIRS[decisions] = (_hook_module(graph_pack, _eager_pack), _hook_module(graph_unpack, _eager_unpack))
        return pair
