"""Unbiased random sketching along the last dimension (``sketch``).

A tensor ``x`` of shape ``[..., d]`` is kept as ``x S``, shape ``[..., k]``, for a random ``d x k`` matrix ``S``
with ``E[S S^T] = I``; it decodes to ``x S S^T``, so ``E[decode(encode(x))] = x``. ``S`` is never stored: it is
rebuilt from ``(seed, d, k, kind)`` by :func:`sketch_matrix`, so the same seed gives the same ``S`` on every
device, and the global RNG is never touched.

Kinds of ``S``:

- ``"gaussian"``: iid ``N(0, 1/k)`` entries, drawn on a private CPU generator and moved;
- ``"sign"``: iid ``+-1/sqrt(k)`` entries (Rademacher) from an integer hash evaluated on the tensor's own
  device: no host work, and of lower variance.

Format: one buffer ``xs`` (``x S`` in ``x``'s dtype, computed in float32, float64 for float64 tensors); the
meta holds the seed, kind, ``rank = k`` and ``d``. ``nbytes`` is that of ``xs`` alone.

The typical use is a linear layer's saved input: the weight gradient ``G^T x`` only needs ``x`` in expectation,
and ``G^T (x S) S^T`` is exactly rank ``k`` (see
:class:`actzip.memory.modules.sketched_linear.SketchedLinear`).
"""

from __future__ import annotations

import math

import torch

from actzip.codecs.base import Codec
from actzip.codecs.counter_rng import hash_uniform, stream_keys
from actzip.core.checks import check_choice, check_seed
from actzip.core.dtypes import LOSSY_DTYPES, work_dtype
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError, UnsupportedLayoutError

SKETCH_KINDS = ("gaussian", "sign")
_MASK64 = (1 << 64) - 1


def check_rank(owner: str, rank) -> None:
    """Raise :class:`ConfigError` unless ``rank`` is an int >= 1."""
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ConfigError(f"{owner}: option rank must be an int >= 1, got {rank!r}")


def check_kind(owner: str, kind) -> None:
    """Raise :class:`ConfigError` unless ``kind`` is one of :data:`SKETCH_KINDS`."""
    check_choice(owner, "kind", kind, SKETCH_KINDS)


def derive_seed(base: int, index: int) -> int:
    """The seed of the ``index``-th sketch drawn from ``base``: a splitmix64 mix, in ``[0, 2**63)``.

    Nearby ``(base, index)`` pairs give unrelated seeds, so consecutive sketches are independent in practice.
    """
    z = (base * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def sketch_matrix(
    d: int,
    k: int,
    seed: int,
    kind: str = "gaussian",
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``d x k`` sketch matrix for ``seed``, with ``E[S S^T] = I``.

    The same arguments give the same matrix on every device, and the global RNG is untouched.
    ``"gaussian"``: entries ``N(0, 1/k)``, drawn in float64 on a private CPU generator, then cast and moved
    (host work and a transfer per call). ``"sign"``: entries ``+-1/sqrt(k)`` from a counter-based integer hash
    evaluated on ``device`` itself (cheap; what
    :class:`~actzip.memory.modules.sketched_linear.SketchedLinear` uses by default).
    """
    check_kind("sketch_matrix", kind)
    check_rank("sketch_matrix", k)
    if not isinstance(d, int) or isinstance(d, bool) or d < 0:
        raise ConfigError(f"sketch_matrix: d must be a non-negative int, got {d!r}")
    if kind == "sign":
        signs = sign_matrix(d, k, seed, device, torch.float64)  # float64, then cast, as the gaussian kind
        return signs.mul_(1.0 / math.sqrt(k)).to(dtype)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    s = torch.randn(d, k, generator=g, dtype=torch.float64)
    s.mul_(1.0 / math.sqrt(k))
    return s.to(device=device, dtype=dtype)


def sign_matrix(
    d: int, k: int, seed: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The ``d x k`` matrix of +-1 whose scaled copy (by ``1/sqrt(k)``) is the ``"sign"`` :func:`sketch_matrix`.

    +-1 is exact in every float dtype, so a 16-bit ``x`` can be multiplied by it in its own dtype (float32
    accumulation) with no cast of ``x``; the scale goes on a small product instead.
    """
    # Integer hash of (seed, index) computed where S is needed: no host work, no transfer, and the same bits
    # on every device (the hash is integer arithmetic and the threshold test is exact).
    index = torch.arange(d * k, dtype=torch.int64, device=device)
    u = hash_uniform(index, stream_keys(seed, 0))
    return (u < 0.5).to(dtype).mul_(2).sub_(1).view(d, k)


def sketch_apply(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``x S`` over the last dimension of ``x`` (any leading shape, any strides), in ``S``'s dtype."""
    return torch.matmul(x.to(s.dtype), s)


@register_codec("sketch")
class SketchCodec(Codec):
    """Unbiased random sketch of the last dimension. See the module docstring for the format.

    Options:
      rank: ``k``, the sketch width (an int >= 1). The payload is ``k / d`` of the dense tensor; ``k >= d``
        is allowed (still unbiased, but no smaller).
      seed: base seed (a non-negative int; ``None`` means 0). Every encode draws a fresh ``S``: the ``i``-th
        encode of this codec (from 0) uses seed ``derive_seed(seed, i)``, stored in the payload. Payloads are
        reproducible for the same seed and call order.
      kind: ``"gaussian"`` or ``"sign"``.

    Guarantee (in exact arithmetic, over the draw of ``S``; each row of ``x`` along the last dimension
    separately): ``E[decode(encode(x))] = x``, and for an element ``j`` of a row ``x``,
    ``Var = (||x||^2 + x_j^2) / k`` for ``"gaussian"`` and ``(||x||^2 - x_j^2) / k`` for ``"sign"``. The
    working precision (float32; float64 for float64 tensors) and the cast of ``x S`` and of the result to
    ``x``'s dtype add their roundings.
    """

    lossless = False
    unbiased = True
    dtypes = LOSSY_DTYPES

    def __init__(self, *, rank: int, seed: int | None = 0, kind: str = "gaussian") -> None:
        check_rank("sketch", rank)
        check_seed("sketch", seed)
        check_kind("sketch", kind)
        self.rank = rank
        self.seed = seed
        self.kind = kind
        self._count = 0

    def options(self) -> dict:
        return {"rank": self.rank, "seed": self.seed, "kind": self.kind}

    def check(self, x: torch.Tensor, name: str = "tensor") -> torch.Tensor:
        super().check(x, name)
        if x.dim() == 0:
            raise UnsupportedLayoutError(f"sketch: {name} is 0-dimensional; it needs a last (feature) dimension")
        return x

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        seed = derive_seed(0 if self.seed is None else self.seed, self._count)
        self._count += 1
        d = x.shape[-1]
        s = sketch_matrix(d, self.rank, seed, self.kind, x.device, work_dtype(x.dtype))
        xs = sketch_apply(x, s).to(x.dtype)
        meta = {"seed": seed, "kind": self.kind, "rank": self.rank, "d": d}
        return Payload(self.name, x.shape, x.dtype, x.device, buffers={"xs": xs}, meta=meta)

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        m = p.meta
        work = work_dtype(p.dtype)
        s = sketch_matrix(m["d"], m["rank"], m["seed"], m["kind"], p.device, work)
        y = torch.matmul(p.buffers["xs"].to(work), s.t())
        return y.to(p.dtype).reshape(p.shape)
