"""The sparse payload of ``relu(h)`` in a fused MLP: how it is written (into an arena or to its exact size) and
what backward makes of it (``relu(h)``, ``relu(h)²``, the gradient w.r.t. ``h``), bit for bit as PyTorch.

The PyTorch expressions are the oracles; on CUDA (or Triton's interpreter) the kernels of
:mod:`actzip.kernels.relu_mlp` compute the same bits straight from the payload. A payload the arena had no
room for (or whose arena was reset since) is recomputed by its owner: :func:`must_recompute` says when,
:func:`note_recompute` counts it and announces it once.
"""

from __future__ import annotations

import warnings

import torch

from actzip.codecs.base import Codec
from actzip.codecs.sparse import SparseCodec
from actzip.core.dtypes import bit_view_dtype
from actzip.core.payload import Payload
from actzip.memory.modules.arena import Arena, Reservation

__all__ = ["activation_from_payload", "arena_overflows", "encode_into_arena", "kernels_encode", "must_recompute",
           "note_recompute", "relu_grad_dense", "relu_grad_dense_", "relu_grad_from_payload"]

SIGN_PACK_CHUNKS = 8  # sign packing with the activation in place: scratch of an eighth of h, 8 chunks

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


def relu_grad_from_payload(grad: torch.Tensor, payload: Payload, codec: Codec, square: bool,
                           in_place: bool = False) -> torch.Tensor:
    """:func:`relu_grad_dense` with ``r`` read from the payload (no dense ``r`` on the kernel path); with
    ``in_place`` over ``grad`` (contiguous, owned by the caller), the same bits."""
    if _use_kernels(payload, codec) and grad.dtype == payload.dtype:
        from actzip.kernels import relu_mlp as relu_mlp_kernels

        return relu_mlp_kernels.relu_grad(grad, square=square, in_place=in_place,
                                          **_kernel_args(payload)).view(grad.shape)
    r = codec.decode(payload)
    return relu_grad_dense_(grad, r, square) if in_place else relu_grad_dense(grad, r, square)


def relu_grad_dense_(grad: torch.Tensor, r: torch.Tensor, square: bool) -> torch.Tensor:
    """:func:`relu_grad_dense` written over ``grad``: the same products, each rounded once, and the same
    threshold (``r <= 0`` gives 0, NaN passes)."""
    if square:
        grad.mul_(2.0 * r)
    return grad.masked_fill_(r <= 0, 0)


def kernels_encode(h: torch.Tensor, codec: Codec) -> bool:
    """Whether ``relu(h)`` is encoded by the Triton kernels (the ReLU and the activation then come from the
    same pass over ``h``), else by the codec on a dense ``relu(h)``."""
    return (isinstance(codec, SparseCodec) and h.dtype in _KERNEL_DTYPES
            and codec.uses_triton(h.device, h.dtype, codec.tile_size, codec.sign_pack))


def encode_into_arena(
    h: torch.Tensor, codec: "SparseCodec", arena: Arena, square: bool, in_place: bool = False
) -> tuple[Payload, torch.Tensor, torch.Tensor]:
    """Encode ``relu(h)`` with its values in ``arena`` in one pass over ``h``, without a host synchronization.

    Returns the payload, its stored size in bytes (a device tensor) and the activation ``relu(h)`` or
    ``relu(h)²`` the forward pass goes on with (written by the same kernel). The payload's ``reservation`` says
    (from backward on) whether the arena had room; if not, no value was written and the caller recomputes,
    or, if the reservation is ``device_only`` (see :meth:`Arena.device_policy`), backward gives NaN.
    ``in_place``: the activation is written over ``h`` (contiguous, dead once encoded); sign packing then
    goes through a scratch of a ``SIGN_PACK_CHUNKS``-th of ``h``, else takes ``h`` itself as its scratch.
    """
    from actzip.kernels import sparse_encode

    tile, sign_pack = codec.tile_size, codec.sign_pack
    in_place = in_place and h.is_contiguous()
    # Sign packing compacts into scratch before it packs. With the activation in place, h is taken: a small
    # scratch, reused chunk by chunk, keeps the forward at one hidden-size tensor. Otherwise h (made by the up
    # projection inside the MLP's forward, kept by nothing) is dead once encoded and serves as the scratch.
    chunked = sign_pack and in_place
    n_tiles = -(-h.numel() // tile)
    scratch_tiles = -(-n_tiles // SIGN_PACK_CHUNKS) if chunked else None
    e = sparse_encode.encode(h, tile, sign_pack, relu=True, act="relu2" if square else "relu", arena=arena,
                             overwrite_input=sign_pack and not chunked and h.is_contiguous(), act_in_place=in_place,
                             scratch_tiles=scratch_tiles)  # fmt: skip
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


def must_recompute(payload: Payload) -> str | None:
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


def note_recompute(payload: Payload, why: str) -> None:
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
