"""Fused ReLU / ReLU² MLPs that keep only the compressed ReLU output for backward.

For ``down(act(up(x)))`` with ``act = relu`` or ``relu²``, PyTorch keeps ``x``, ``relu(h)`` and (for
relu²) ``relu(h)²`` for backward. Here only ``x`` and the lossless sparse payload of ``r = relu(h)`` are
kept: ``d relu(h)²/dh = 2·relu(h)`` needs ``r`` alone, and every other tensor backward needs (``r²`` for the
down projection's weight gradient; ``r²·u`` in the gated form) is rebuilt from the payload with the very same
op that made it, so gradients are bit-identical to the unfused module for the same matmul path.

How it stays exact: the linear layers are the caller's own modules, run by autograd as usual; only the
activation is a custom autograd function (:class:`SparseReLU`), and the tensors the later ops would save
(``a``, ``a·u``) are replaced, through :func:`torch.autograd.graph.saved_tensors_hooks` scoped to those ops,
by small handles that recompute them from the payload in backward. Modern matmul backward therefore sees the
same tensors, strides included, as without actzip.

Never stores both pre- and post-activation (as some fused ReLU² MLPs do): that would double the cache.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from actzip.codecs.base import Codec
from actzip.codecs.sparse import SparseCodec
from actzip.core.dtypes import bit_view_dtype
from actzip.core import registry
from actzip.errors import ConfigError
from actzip.kernels import runtime
from actzip.core.payload import Payload
from actzip.memory.modules.arena import Arena, Reservation
from actzip.memory.cache.rebuild import autocast_as_now, rebuild_saved
from actzip.memory.cache.active import record_external


def _sparse_codec(codec: Codec | None) -> Codec:
    codec = codec if codec is not None else registry.get("sparse")
    if not codec.lossless:
        raise ConfigError(f"relu MLP: codec {codec.name!r} is lossy; the fused MLP promises exact gradients")
    return codec


# -- what backward rebuilds from the payload ----------------------------------------------------------------
# The PyTorch expressions below are the oracles; on CUDA (or Triton's interpreter) the kernels of
# actzip.kernels.relu_mlp compute the same bits straight from the payload.

_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _use_kernels(payload: Payload, codec: Codec) -> bool:
    if payload.meta.get("values_buffer") is not None:
        return True  # arena payloads exist only on the kernel path
    return (
        isinstance(codec, SparseCodec)
        and payload.dtype in _KERNEL_DTYPES
        and payload.meta.get("perm") is None
        and codec.uses_triton(payload.device, payload.dtype, payload.meta["tile_size"], payload.meta["sign_pack"])
    )


def _kernel_args(payload: Payload) -> dict:
    b, m = payload.buffers, payload.meta
    values = m["values_buffer"] if m.get("values_buffer") is not None else b["values"]
    dtype = torch.int32 if m["sign_pack"] else bit_view_dtype(payload.dtype)
    res = m.get("reservation")
    ok = res.ok if res is not None and res.device_only else None  # the kernels turn a refusal into NaN
    return dict(mask=b["mask"], tile_offsets=b["tile_offsets"], values=values.view(dtype), dtype=payload.dtype,
                tile_size=m["tile_size"], sign_pack=m["sign_pack"], values_offset=m.get("values_offset"), ok=ok)


def activation_from_payload(payload: Payload, codec: Codec, square: bool) -> torch.Tensor:
    """``relu(h)`` (or ``relu(h)²``) rebuilt from the payload of ``relu(h)``, bit for bit."""
    if _use_kernels(payload, codec):
        from actzip.kernels import relu_mlp as relu_mlp_kernels

        return relu_mlp_kernels.activation(shape=payload.shape, square=square, **_kernel_args(payload))
    r = codec.decode(payload)
    return r.square() if square else r


def relu_grad_dense(grad: torch.Tensor, r: torch.Tensor, square: bool) -> torch.Tensor:
    """Gradient w.r.t. the pre-activation, exactly as autograd computes it for ``relu`` / ``relu(h).square()``."""
    if square:
        grad = grad * (2.0 * r)  # pow_backward for exponent 2: grad * (2 * r**1)
    return torch.ops.aten.threshold_backward(grad, r, 0)


def relu_grad_from_payload(grad: torch.Tensor, payload: Payload, codec: Codec, square: bool) -> torch.Tensor:
    """:func:`relu_grad_dense` with ``r`` read from the payload (no dense ``r`` on the kernel path)."""
    if _use_kernels(payload, codec) and grad.dtype == payload.dtype:
        from actzip.kernels import relu_mlp as relu_mlp_kernels

        return relu_mlp_kernels.relu_grad(grad, square=square, **_kernel_args(payload)).view(grad.shape)
    return relu_grad_dense(grad, codec.decode(payload), square)


def encode_into_arena(
    h: torch.Tensor, codec: "SparseCodec", arena: Arena, square: bool
) -> tuple[Payload, torch.Tensor, torch.Tensor]:
    """Encode ``relu(h)`` with its values in ``arena`` in one pass over ``h``, without a host synchronization.

    Returns the payload, its stored size in bytes (a device tensor) and the activation ``relu(h)`` or
    ``relu(h)²`` the forward pass goes on with (written by the same kernel). The payload's ``reservation`` says
    (from backward on) whether the arena had room; if not, no value was written and the caller recomputes,
    or, if the reservation is ``device_only`` (see :meth:`Arena.device_policy`), backward gives NaN.
    """
    from actzip.kernels import sparse_encode

    tile, sign_pack = codec.tile_size, codec.sign_pack
    # Sign packing needs scratch as large as h, and h (made by the up projection inside the MLP's forward, kept
    # by nothing) is dead once encoded: it serves, so the forward pass allocates nothing more for packing.
    e = sparse_encode.encode(h, tile, sign_pack, relu=True, act="relu2" if square else "relu", arena=arena,
                             overwrite_input=sign_pack and h.is_contiguous())
    elem = 4 if sign_pack else h.element_size()
    meta = {"nnz": None, "perm": None, "tile_size": tile, "sign_pack": sign_pack, "values_buffer": arena.buffer,
            "values_offset": e.start,
            "reservation": Reservation(e.start, e.ok, device_only=arena.device_policy(), arena=arena)}
    payload = Payload(codec.name, h.shape, h.dtype, h.device, {"mask": e.mask, "tile_offsets": e.tile_offsets}, meta)
    stored = e.total * elem + e.mask.numel() + 4 * e.tile_offsets.numel()
    return payload, stored, e.act


_overflows = 0  # arena refusals met in backward (each one recomputed relu(up(x)))
_warned = set()  # the notices already given, by kind


def arena_overflows() -> int:
    """How many times backward found a payload the arena had no room for (or had reset since), and recomputed
    it (refusals of ``device_only`` reservations are not seen by the host: ``arena.overflows()`` counts them)."""
    return _overflows


def _must_recompute(payload: Payload) -> str | None:
    """Why backward must recompute the payload's values (None: read them). "stale": the arena was reset since
    they were written; "refused": the host was told the arena had no room. A ``device_only`` reservation is
    never asked (that would synchronize, and cannot happen in a captured graph): the kernels read its ``ok``
    flag and write NaN for a refused payload."""
    res = payload.meta.get("reservation")
    if res is None:
        return None
    if res.stale():
        return "stale"
    return "refused" if not res.device_only and not res.fits() else None


def _note_recompute(payload: Payload, why: str) -> None:
    global _overflows
    _overflows += 1
    arena = payload.meta["reservation"].arena
    if why == "refused" and arena is not None and arena.auto_reset:
        arena.note_refusal()  # it grows at its next step: nothing for the user to do
        return
    if why in _warned:
        return
    _warned.add(why)
    if why == "stale":
        message = ("actzip: a relu payload was read after its arena was reset (a backward over a retained graph "
                   "after a later step?); it is recomputed from the MLP input (exact, but a matmul more)")
    else:
        message = ("actzip: the arena had no room for a relu payload; it is recomputed from the MLP input in "
                   "backward (exact, but a matmul more). Call arena.fit() between steps, give the arena more "
                   "capacity, or let it size itself (Arena(auto_reset=True))")
    warnings.warn(f"{message}. Announced once; see actzip.memory.modules.relu_mlp.arena_overflows().", stacklevel=3)


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
        if (why := _must_recompute(payload)) is not None:
            _note_recompute(payload, why)
            gh = relu_grad_dense(grad, torch.relu(ctx.recompute()), ctx.square)
        else:
            gh = relu_grad_from_payload(grad, payload, ctx.codec, ctx.square)
        if ctx.ticket is not None:
            ctx.ticket.close()  # the last use of the payload (its rebuilt activation was used before)
        return gh, None, None, None, None, None


def _rebuild_activation(node, codec: Codec, square: bool) -> torch.Tensor:
    payload = payload_of(node)
    if (why := _must_recompute(payload)) is not None:
        _note_recompute(payload, why)
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
        h = up(x)
        if not (torch.is_grad_enabled() and h.requires_grad):
            r = torch.relu(h)
            y = down(r.square() if self.square else r)
        else:
            a, rebuild_a = _sparse_activation(self, up, x, h)
            with rebuild_saved([(a, rebuild_a)]):
                y = down(a)
        return self.dropout(y) if self.dropout is not None else y

    def extra_repr(self) -> str:
        return f"activation={'relu2' if self.square else 'relu'}, codec={self.codec!r}"


class SparseGatedReLUMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` (Llama-style) with ``act`` relu or relu².

    Keeps ``x``, ``up(x)`` and the payload of ``relu(gate(x))``; ``act(gate(x))`` and the product are rebuilt
    from them in backward.
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
        gate, up, down = (getattr(self, n) for n in self._names)
        g = gate(x)
        if not (torch.is_grad_enabled() and g.requires_grad):
            r = torch.relu(g)
            return down((r.square() if self.square else r) * up(x))
        a, rebuild_a = _sparse_activation(self, gate, x, g)

        u = up(x)
        with rebuild_saved([(a, rebuild_a)]):
            p = a * u

        def rebuild_p() -> torch.Tensor:
            return rebuild_a() * u

        with rebuild_saved([(p, rebuild_p)]):
            return down(p)

    def extra_repr(self) -> str:
        return f"activation={'relu2' if self.square else 'relu'}, gated, codec={self.codec!r}"
