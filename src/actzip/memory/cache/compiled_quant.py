"""The ``quant`` codec written in plain tensor operations, for compiled graphs to fuse.

Through a custom op (:mod:`actzip.memory.cache.compiled_ops`) a compiled graph pays Python and a kernel launch
for every tensor it saves, which is the step time of a small model. Written as ordinary tensor operations, the
compiler fuses the quantization into the kernel that makes the tensor (and the decoding into the kernel that
reads it), with no host work at all. :func:`encode` and :func:`decode` make and read the ``quant`` codec's own
payload format (minmax scale: the codes packed little-endian into uint8, ``lo`` and ``span`` per group in
float32; see :mod:`actzip.codecs.quant`), so a payload of either decodes with the other, and keep its
guarantees: elementwise error below one step ``span / (2**bits - 1)`` with stochastic rounding (unbiased) and at
most half a step to nearest, up to float32 roundings. Stochastic rounding draws its noise from PyTorch's
generator (a compiled graph draws anew on every call), not from the codec's counter streams, so payloads are not
bit-identical to the codec's; to nearest they match it but for rare codes where float32 arithmetic in another
order lands on the other side of a half step (a single byte in the tests). A payload of either decodes bit for bit
the same with either.

Used for caches with ``CacheConfig(fuse_compiled=True)``. Groups follow memory order, as the codec's do (dimensions by decreasing stride).
"""

from __future__ import annotations

import torch

from actzip.core.layout import restore_order


__all__ = ["decode", "encode", "supports"]


def supports(codec) -> bool:
    """Whether ``codec`` is a ``quant`` codec this form writes (minmax scale, whole bytes of codes per group)."""
    return (getattr(codec, "name", None) == "quant" and codec.scale == "minmax"
            and (codec.group_size * codec.bits) % 8 == 0)


def _perm(shape, stride) -> list[int] | None:
    """Dimensions by decreasing stride (ties in order), or ``None`` for row-major order."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    return None if order == list(range(len(shape))) else order


def _flat(x: torch.Tensor) -> torch.Tensor:
    perm = _perm(x.shape, x.stride())
    return (x if perm is None else x.permute(perm)).reshape(-1)


def _uniform(v: torch.Tensor) -> torch.Tensor:
    """Uniform noise in [0, 1) like ``v``, new on every run of the graph. Inductor turns ``rand`` into its own
    seeded random ops in a pass that runs before the cache's hooks are inlined, so they are written as those ops
    here (they also run eagerly, under ``aot_eager``)."""
    import torch._inductor.inductor_prims  # noqa: F401  registers the prims

    seeds = torch.ops.prims.inductor_seeds.default(1, v.device)
    seed = torch.ops.prims.inductor_lookup_seed.default(seeds, 0)
    return torch.ops.prims.inductor_random.default(list(v.shape), seed, "rand")


def encode(x: torch.Tensor, bits: int, group_size: int, stochastic: bool) -> tuple[torch.Tensor, ...]:
    """``(codes, lo, span)`` of ``x`` (see the module docstring)."""
    flat = _flat(x)
    n = flat.numel()
    pad = -n % group_size
    if pad:  # the last group padded with its last element: its range is unchanged
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    g = flat.view(-1, group_size).float()
    lo, hi = g.amin(dim=1), g.amax(dim=1)
    span = hi - lo
    top = (1 << bits) - 1
    factor = torch.where(span > 0, top / torch.where(span > 0, span, 1.0), 0.0)
    v = (g - lo.unsqueeze(1)) * factor.unsqueeze(1)
    v = torch.floor(v + _uniform(v)) if stochastic else torch.round(v)
    q = v.clamp_(0, top).to(torch.int32)
    per = 8 // bits
    if per > 1:  # little-endian: element i of a byte at bits [bits*i, bits*(i+1))
        shifts = torch.arange(per, device=q.device, dtype=torch.int32) * bits
        q = (q.view(-1, per) << shifts).sum(dim=1)
    return q.to(torch.uint8).reshape(-1), lo, span


def decode(codes: torch.Tensor, lo: torch.Tensor, span: torch.Tensor, shape, stride, dtype: torch.dtype,
           bits: int, group_size: int) -> torch.Tensor:
    """The tensor of shape ``shape`` and ``dtype``, laid out in the memory order of ``stride``, that
    :func:`encode` made ``(codes, lo, span)`` of."""
    per = 8 // bits
    q = codes.to(torch.int32)
    if per > 1:
        shifts = torch.arange(per, device=q.device, dtype=torch.int32) * bits
        q = (q.unsqueeze(1) >> shifts) & ((1 << bits) - 1)
    # q * fl(1 / top) * span + lo, in the codec's order of operations
    y = q.reshape(-1, group_size).float() * (1.0 / ((1 << bits) - 1)) * span.unsqueeze(1) + lo.unsqueeze(1)
    perm = _perm(shape, stride)
    n = 1
    for d in shape:
        n *= d
    return restore_order(y.reshape(-1)[:n].to(dtype), torch.Size(shape), None if perm is None else tuple(perm))
