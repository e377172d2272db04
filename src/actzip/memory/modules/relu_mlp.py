"""Fused ReLU / ReLU² MLPs that keep only the compressed ReLU output for backward.

For ``down(act(up(x)))`` with ``act = relu`` or ``relu²``, PyTorch keeps ``x``, ``relu(h)`` and (for
relu²) ``relu(h)²`` for backward. Here only ``x`` and the lossless sparse payload of ``r = relu(h)`` are
kept: ``d relu(h)²/dh = 2·relu(h)`` needs ``r`` alone, and every other tensor backward needs (``r²`` for the
down projection's weight gradient; ``r²·u`` in the gated form) is rebuilt from the payload with the very same
op that made it, so gradients are bit-identical to the unfused module for the same matmul path.

A plain down projection (``nn.Linear`` or transformers' ``Conv1D`` without hooks) runs with the activation
as one node (:mod:`.relu_down`), whose backward never holds two hidden-size tensors at once; an input that
is a marked norm output (:mod:`.norm_rebuild`) is rebuilt in backward instead of kept. Otherwise (the gated
form, any other down projection) the general path below runs.

How the general path stays exact: the linear layers are the caller's own modules, run by autograd as usual;
only the activation is a custom autograd function (:class:`SparseReLU`), and the tensors the later ops would save
(``a``, ``a·u``) are replaced, through :func:`torch.autograd.graph.saved_tensors_hooks` scoped to those ops,
by small handles that recompute them from the payload in backward. Modern matmul backward therefore sees the
same tensors, strides included, as without actzip.

Never stores both pre- and post-activation (as some fused ReLU² MLPs do): that would double the cache.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from actzip.codecs.base import Codec
from actzip.codecs.sparse import SparseCodec
from actzip.core import registry
from actzip.errors import ConfigError
from actzip.kernels import runtime
from actzip.core.payload import Payload
from actzip.memory.modules.arena import Arena
from actzip.memory.modules.relu_payload import (  # noqa: F401  (arena_overflows, relu_grad_dense: public here too)
    activation_from_payload,
    arena_overflows,
    encode_into_arena,
    must_recompute,
    note_recompute,
    relu_grad_dense,
    relu_grad_from_payload,
)
from actzip.memory.cache.rebuild import autocast_as_now, rebuild_saved, rebuildable
from actzip.memory.modules.relu_down import plain_projection, projection_fits, sparse_relu_down
from actzip.memory.cache.active import record_external


def _sparse_codec(codec: Codec | None) -> Codec:
    codec = codec if codec is not None else registry.get("sparse")
    if not codec.lossless:
        raise ConfigError(f"relu MLP: codec {codec.name!r} is lossy; the fused MLP promises exact gradients")
    return codec


class SparseReLU(torch.autograd.Function):
    """``relu(h)`` or ``relu(h)²`` that saves only the sparse payload of ``relu(h)``.

    The payload's buffers go through ``save_for_backward``, so autograd frees them as soon as this node's
    backward has run, as it would free a saved tensor. With an ``arena`` the values go into it without a host
    synchronization; ``recompute()`` must then rebuild ``h`` bit for bit in case the arena had no room (unless
    the arena decides on the device: then the gradient is NaN, see :mod:`actzip.memory.modules.arena`).
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, codec: Codec, square: bool, name: str, arena, recompute):
        ctx.ticket = None
        if arena is not None:
            ctx.ticket = arena.open_payload()  # closed at the end of backward (or when the graph is freed)
            payload, stored, out = encode_into_arena(h, codec, arena, square)
        else:
            r = torch.relu(h)
            payload = codec.encode(r, name=name)
            stored = payload.nbytes
            out = r.square() if square else r
        ctx.keys = tuple(payload.buffers)
        ctx.skeleton = Payload(payload.codec, payload.shape, payload.dtype, payload.device, {}, payload.meta)
        ctx.save_for_backward(*payload.buffers.values())
        ctx.codec, ctx.square, ctx.recompute = codec, square, recompute
        record_external("relu_mlp", h.numel() * h.element_size(), stored)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        payload = payload_of(ctx)
        if (why := must_recompute(payload)) is not None:
            note_recompute(payload, why)
            gh = relu_grad_dense(grad, torch.relu(ctx.recompute()), ctx.square)
        else:
            gh = relu_grad_from_payload(grad, payload, ctx.codec, ctx.square)
        if ctx.ticket is not None:
            ctx.ticket.close()  # the last use of the payload (its rebuilt activation was used before)
        return gh, None, None, None, None, None


def _rebuild_activation(node, codec: Codec, square: bool) -> torch.Tensor:
    payload = payload_of(node)
    if (why := must_recompute(payload)) is not None:
        note_recompute(payload, why)
        r = torch.relu(node.recompute())
        return r.square() if square else r
    return activation_from_payload(payload, codec, square)


def _check_arena(arena: Arena | None, codec: Codec) -> Arena | None:
    if arena is None:
        return None
    if not isinstance(codec, SparseCodec) or codec.kernel == "torch":
        raise ConfigError("relu MLP: an arena needs the sparse codec's Triton kernels (kernel='auto' or 'triton')")
    if codec.sign_pack and codec.check_values:
        raise ConfigError(
            "relu MLP: sign packing into an arena runs unchecked (checking would synchronize): pass "
            "check=False; ReLU outputs have no negative values (a -0.0 is then stored as +0.0)"
        )
    if (why := runtime.unavailable_reason(arena.device)) is not None:
        raise ConfigError(f"relu MLP: an arena on {arena.device} needs the Triton kernels, which cannot run: {why}")
    return arena


def payload_of(node) -> Payload:
    """The payload a :class:`SparseReLU` node saved (``node`` is its ctx, i.e. the output's ``grad_fn``)."""
    sk = node.skeleton
    return Payload(sk.codec, sk.shape, sk.dtype, sk.device, dict(zip(node.keys, node.saved_tensors)), sk.meta)


class _KeepInput(torch.autograd.Function):
    """``h`` unchanged, with ``x`` saved through autograd for a recompute of ``h`` that may never run.

    A closure over ``x`` would keep it alive whatever the saved-tensor hooks do; saved here, ``x`` is what the
    hooks make of it (a handle of :class:`~actzip.memory.rebuild.rebuild_saved` when ``x`` is a rebuilt norm
    output, else the tensor ``proj`` saved anyway), and it is unpacked only if the recompute runs."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def _recompute_from_saved(proj: nn.Module, x: torch.Tensor, h: torch.Tensor):
    """``h`` passed through :class:`_KeepInput`, and a function that makes ``proj(x)`` again in backward."""
    h = _KeepInput.apply(h, x)
    keeper, again = h.grad_fn, autocast_as_now(x.device.type)

    def make() -> torch.Tensor:
        (saved,) = keeper.saved_tensors
        with torch.no_grad(), again():
            return proj(saved)

    return h, make


def _sparse_activation(module: nn.Module, proj: nn.Module, x: torch.Tensor, h: torch.Tensor):
    """``act(h)`` through :class:`SparseReLU` (``h = proj(x)``), and the function that rebuilds it in backward."""
    remake_h = None
    if module.arena is not None:
        h, remake_h = _recompute_from_saved(proj, x, h)
    a = SparseReLU.apply(h, module.codec, module.square, "relu output", module.arena, remake_h)
    node, codec, square = a.grad_fn, module.codec, module.square

    def rebuild_a() -> torch.Tensor:
        return _rebuild_activation(node, codec, square)

    return a, rebuild_a


def _input_rebuilt(x: torch.Tensor):
    """A block inside which saves of ``x`` become rebuild handles, if ``x`` is a marked norm output (see
    :mod:`.norm_rebuild`): the MLP then keeps no copy of its input."""
    targets = rebuildable(x) if torch.is_grad_enabled() else []
    return rebuild_saved(targets) if targets else contextlib.nullcontext()


class SparseReLUMLP(nn.Module):
    """``down(act(up(x)))`` with ``act`` relu or relu², keeping ``x`` and the payload of ``relu(up(x))``.

    ``up`` and ``down`` are any modules (``nn.Linear``, HF ``Conv1D``, ...); they are registered under the
    given names so the state dict keys stay those of the module replaced. ``dropout``, if given, is applied
    after ``down`` as in GPT-2. With an arena and a sign-packing codec, the buffer of ``up``'s output serves as
    the packing's scratch once relu(up(x)) is encoded (its version counter is bumped): a forward hook on ``up``
    that keeps its output would see it overwritten.
    """

    def __init__(
        self,
        up: nn.Module,
        down: nn.Module,
        *,
        square: bool,
        codec: Codec | None = None,
        names: tuple[str, str] = ("up", "down"),
        dropout: nn.Module | None = None,
        arena: Arena | None = None,
    ) -> None:
        super().__init__()
        self.square = square
        self.codec = _sparse_codec(codec)
        self.arena = _check_arena(arena, self.codec)
        self._up_name, self._down_name = names
        self.add_module(names[0], up)
        self.add_module(names[1], down)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, down = getattr(self, self._up_name), getattr(self, self._down_name)
        if not torch.is_grad_enabled():
            r = torch.relu(up(x))
            y = down(r.square() if self.square else r)
        else:
            with _input_rebuilt(x):
                y = self._forward_saving_payload(up, down, x)
        return self.dropout(y) if self.dropout is not None else y

    def _forward_saving_payload(self, up: nn.Module, down: nn.Module, x: torch.Tensor) -> torch.Tensor:
        h = up(x)
        if not h.requires_grad:
            r = torch.relu(h)
            return down(r.square() if self.square else r)
        proj = plain_projection(down)
        if proj is not None and projection_fits(h.dim(), proj) and not torch.is_autocast_enabled(h.device.type):
            remake_h = None
            if self.arena is not None:
                h, remake_h = _recompute_from_saved(up, x, h)
            return sparse_relu_down(h, proj, self.codec, self.square, self.arena, remake_h)
        a, rebuild_a = _sparse_activation(self, up, x, h)
        with rebuild_saved([(a, rebuild_a)]):
            return down(a)

    def extra_repr(self) -> str:
        return f"activation={'relu2' if self.square else 'relu'}, codec={self.codec!r}"


class SparseGatedReLUMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` (Llama-style) with ``act`` relu or relu².

    Keeps ``x``, ``up(x)`` and the payload of ``relu(gate(x))``; ``act(gate(x))`` and the product are rebuilt
    from them in backward. With a plain down projection the activation, the product and the projection run
    as one node (:mod:`.relu_down`): the product is written over the gate's output in forward, and backward
    writes the gradients over the tensors it rebuilt. With an arena and a plain down projection, the gate's
    output buffer is overwritten (a forward hook on the gate that keeps its output would see it change).
    """

    def __init__(
        self,
        gate: nn.Module,
        up: nn.Module,
        down: nn.Module,
        *,
        square: bool,
        codec: Codec | None = None,
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
        arena: Arena | None = None,
    ) -> None:
        super().__init__()
        self.square = square
        self.codec = _sparse_codec(codec)
        self.arena = _check_arena(arena, self.codec)
        self._names = names
        for name, mod in zip(names, (gate, up, down)):
            self.add_module(name, mod)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with _input_rebuilt(x):
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self._names)
        g = gate(x)
        if not (torch.is_grad_enabled() and g.requires_grad):
            r = torch.relu(g)
            return down((r.square() if self.square else r) * up(x))
        proj = plain_projection(down)
        if proj is not None and projection_fits(g.dim(), proj) and not torch.is_autocast_enabled(g.device.type):
            u = up(x)
            if u.shape == g.shape and u.dtype == g.dtype:
                remake_g = None
                if self.arena is not None:
                    g, remake_g = _recompute_from_saved(gate, x, g)
                return sparse_relu_down(g, proj, self.codec, self.square, self.arena, remake_g, u=u)
            return self._general(down, x, g, u, _sparse_activation(self, gate, x, g))
        a, rebuild_a = _sparse_activation(self, gate, x, g)

        return self._general(down, x, g, up(x), (a, rebuild_a))

    @staticmethod
    def _general(down: nn.Module, x: torch.Tensor, g: torch.Tensor, u: torch.Tensor, activation) -> torch.Tensor:
        """``down(a · u)`` by autograd, ``a`` and the product rebuilt from the payload in backward."""
        a, rebuild_a = activation
        with rebuild_saved([(a, rebuild_a)]):
            p = a * u

        def rebuild_p() -> torch.Tensor:
            return rebuild_a() * u

        with rebuild_saved([(p, rebuild_p)]):
            return down(p)

    def extra_repr(self) -> str:
        return f"activation={'relu2' if self.square else 'relu'}, gated, codec={self.codec!r}"
