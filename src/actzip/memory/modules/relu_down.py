"""The fused MLP's activation and down projection as one autograd node, so that backward holds less at once.

With the down projection left to autograd, its backward (one matmul node) unpacks the rebuilt activation
``a = act(h)`` and makes the gradient of ``a`` beside it, and the ReLU's backward then writes a third
hidden-size tensor. One node that owns all three steps can order them:

forward   ``relu(h)`` is encoded and ``a`` is written over ``h`` (dead once encoded: nothing saves the up
          projection's output), then ``y = down(a)``; ``a`` dies with the node's forward;
backward  ``a`` is rebuilt from the payload, the weight gradient ``gᵀa`` is made and ``a`` freed, then the
          gradient of ``a`` (``g·W``) is made and the ReLU gradient is written over it.

So the forward holds one hidden-size tensor beyond the payload, and the backward one (plus the weight
gradient while it is made). The gated form ``down(act(g) · u)`` (Llama-style) runs as the same node with ``u``
saved: the forward writes ``a·u`` over ``a``; the backward rebuilds ``a``, makes ``a·u`` for the weight
gradient and frees it, makes the gradient of the product, then writes ``u``'s gradient over the rebuilt ``a``
and ``a``'s over the product's gradient (the ops autograd's ``MulBackward`` runs; a product's bits do not
depend on the order of its factors) before the ReLU gradient: three hidden-size tensors at most, ``u``
included. The down projection must be a plain ``nn.Linear`` or transformers ``Conv1D``
with no hooks (:func:`plain_projection`): the node runs the very ops autograd runs for them, in their layout
(``mm_mat1_backward`` / ``mm_mat2_backward``: the weight gradient of an ``nn.Linear`` is ``gᵀ·a``, of a
``Conv1D`` ``aᵀ·g``; the bias gradient the sum of ``g`` over rows), so gradients are bit-identical to the
unfused module's; the tests compare them with ``torch.equal``. Anything else keeps the general path of
:mod:`.relu_mlp` (also exact, with the matmul node's larger backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.codecs.base import Codec
from actzip.core.payload import Payload
from actzip.errors import InvalidValueError
from actzip.memory.cache.active import record_external
from actzip.memory.modules import relu_payload

__all__ = ["PlainProjection", "SparseReLUDown", "plain_projection", "projection_fits", "sparse_relu_down"]


@dataclass(frozen=True)
class PlainProjection:
    """A down projection the fused node can run itself: ``x·Wᵀ + b`` (``nn.Linear``) or ``x·W + b`` (``Conv1D``)."""

    weight: nn.Parameter
    bias: nn.Parameter | None
    weight_in_out: bool  # transformers Conv1D: weight stored (in, out), applied with addmm(bias, x, weight)


def _has_hooks(module: nn.Module) -> bool:
    return any(getattr(module, n, None) for n in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                 "_backward_pre_hooks"))


def plain_projection(module: nn.Module) -> PlainProjection | None:
    """The weight and bias of ``module`` if it is exactly an ``nn.Linear`` or transformers' ``Conv1D`` with no
    module hooks (a subclass, a parametrized or adapted layer may compute something else), else None."""
    if _has_hooks(module):
        return None
    if type(module) is nn.Linear:
        return PlainProjection(module.weight, module.bias, False)
    cls = type(module)
    if cls.__name__ == "Conv1D" and cls.__module__.startswith("transformers.") and module.bias is not None:
        return PlainProjection(module.weight, module.bias, True)
    return None


def _project(a: torch.Tensor, proj: PlainProjection) -> torch.Tensor:
    """``proj``'s module forward on ``a``, as the module computes it."""
    if proj.weight_in_out:  # transformers' Conv1D.forward
        out = torch.addmm(proj.bias, a.view(-1, a.size(-1)), proj.weight)
        return out.view(a.shape[:-1] + (proj.weight.size(1),))
    return F.linear(a, proj.weight, proj.bias)


def projection_fits(a_dims: int, proj: PlainProjection) -> bool:
    """Whether autograd runs ``proj`` on an ``a_dims``-dimensional input as the one 2-D matmul the node
    reproduces: ``Conv1D`` always does; ``F.linear`` folds any input into one matmul without a bias, and
    with one for 2-D and 3-D inputs only (more dimensions add the bias in a separate op)."""
    return a_dims >= 2 and (proj.weight_in_out or proj.bias is None or a_dims <= 3)


def _encode(h: torch.Tensor, codec: Codec, square: bool, arena, name: str):
    """The payload of ``relu(h)``, its stored bytes, ``act(h)`` (written over ``h`` on the kernel path), and
    whether ``act(h)`` is a buffer of its own (free to be overwritten)."""
    act = "relu2" if square else "relu"
    if arena is not None:
        payload, stored, out = relu_payload.encode_into_arena(h, codec, arena, square, in_place=True)
        return payload, stored, out, True
    if relu_payload.kernels_encode(h, codec):
        from actzip.kernels import sparse_encode

        e = sparse_encode.encode(h, codec.tile_size, codec.sign_pack, relu=True, act=act, act_in_place=True)
        if codec.sign_pack and codec.check_values and e.host.sign_set:
            raise InvalidValueError(f"sparse(sign_pack=True): {name} has {e.host.sign_set} elements with the sign "
                                    "bit set after the ReLU (negative NaN); use sign_pack=False")
        meta = {"nnz": e.host.nnz, "perm": None, "tile_size": codec.tile_size, "sign_pack": codec.sign_pack}
        buffers = {"mask": e.mask, "tile_offsets": e.tile_offsets, "values": e.values}
        payload = Payload(codec.name, h.shape, h.dtype, h.device, buffers, meta)
        return payload, payload.nbytes, e.act, True
    r = torch.relu(h)
    payload = codec.encode(r, name=name)
    return payload, payload.nbytes, (r.square() if square else r), square


class SparseReLUDown(torch.autograd.Function):
    """``down(act(h))`` (or ``down(act(h) · u)``) for ``act`` relu or relu², saving the payload of ``relu(h)``,
    the projection's weight, and ``u`` if given.

    ``recompute()`` rebuilds ``h`` bit for bit when the arena had no room (see :class:`.relu_mlp.SparseReLU`).
    """

    @staticmethod
    def forward(ctx, h, u, weight, bias, proj: PlainProjection, codec: Codec, square: bool, arena, recompute, name):
        ctx.ticket = arena.open_payload() if arena is not None else None
        payload, stored, a, own = _encode(h, codec, square, arena, name)
        if u is not None:
            a = a.mul_(u) if own else a * u
        y = _project(a, proj)
        ctx.keys = tuple(payload.buffers)
        ctx.skeleton = Payload(payload.codec, payload.shape, payload.dtype, payload.device, {}, payload.meta)
        ctx.gated = u is not None
        ctx.save_for_backward(weight, *((u,) if ctx.gated else ()), *payload.buffers.values())
        ctx.codec, ctx.square, ctx.recompute, ctx.proj = codec, square, recompute, proj
        ctx.has_bias = bias is not None
        nbytes = h.numel() * h.element_size()
        record_external("relu_mlp", nbytes, stored)
        record_external("rebuilt", nbytes, 0)  # the projection's input act(h) (· u), made again from the payload
        return y

    @staticmethod
    def backward(ctx, grad_y):
        weight, *buffers = ctx.saved_tensors
        u = buffers.pop(0) if ctx.gated else None
        sk = ctx.skeleton
        payload = Payload(sk.codec, sk.shape, sk.dtype, sk.device, dict(zip(ctx.keys, buffers)), sk.meta)
        proj, square = ctx.proj, ctx.square
        g = grad_y.reshape(-1, grad_y.size(-1))
        r = None  # dense relu(h), only when the payload cannot be read
        if (why := relu_payload.must_recompute(payload)) is not None:
            relu_payload.note_recompute(payload, why)
            r = torch.relu(ctx.recompute())
        need_h, need_u, need_w, need_b = ctx.needs_input_grad[:4]
        need_u = need_u and u is not None
        grad_w = grad_b = grad_h = grad_u = None
        a = None
        if need_w or need_u:
            a = relu_payload.activation_from_payload(payload, ctx.codec, square) if r is None else (
                r.square() if square else r)
        if need_w:
            p = a if u is None else a * u
            p = p.reshape(-1, p.size(-1))
            grad_w = p.t().mm(g) if proj.weight_in_out else g.t().mm(p)
            del p  # before the gradient of the product exists: one hidden-size tensor fewer at once
        if u is None:
            a = None
        if ctx.has_bias and need_b:
            grad_b = g.sum(0)
        if need_h or need_u:
            grad_a = (g.mm(weight.t()) if proj.weight_in_out else g.mm(weight)).view(sk.shape)
            if need_u:  # MulBackward's grad · a, over a (unless a is the dense relu(h) the ReLU gradient reads)
                grad_u = a.mul_(grad_a) if (r is None or square) else grad_a * a
            del a
            if u is not None:
                grad_a = grad_a.mul_(u) if need_h else None  # MulBackward's grad · u, over the product's gradient
        if need_h:
            if r is None:
                grad_h = relu_payload.relu_grad_from_payload(grad_a, payload, ctx.codec, square, in_place=True)
            else:
                grad_h = relu_payload.relu_grad_dense_(grad_a, r, square)
        if ctx.ticket is not None:
            ctx.ticket.close()
        return grad_h, grad_u, grad_w, grad_b, None, None, None, None, None, None


def sparse_relu_down(h: torch.Tensor, proj: PlainProjection, codec: Codec, square: bool, arena, recompute,
                     name: str = "relu output", u: torch.Tensor | None = None) -> torch.Tensor:
    """``proj(act(h))``, or ``proj(act(h) · u)`` with ``u`` (same shape and dtype), through
    :class:`SparseReLUDown`."""
    return SparseReLUDown.apply(h, u, proj.weight, proj.bias, proj, codec, square, arena, recompute, name)
