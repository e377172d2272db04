"""What a split-learning server receives of one modality's activations under a keep-ratio, and what its gradient
costs on the way back.

A keep-ratio ``r`` is a share of the modality's dense payload (``width`` values a sample at ``value_bits``
each, bf16's 16 by default): ``r * width * value_bits`` bits a sample, whatever the compressor. Each compressor
spends them its own way (:data:`COMPRESSORS`):

- ``random``: each value kept with probability ``r`` and rescaled by ``1 / r`` (unbiased); the positions come from
  a seed both ends share, so only values travel. The gradient returns through the same positions (and scale).
- ``topk``: the ``k`` largest magnitudes of each sample, exact, with their positions (as a bitmask or as indices,
  whichever is smaller): ``k`` is what fits in the bits. The gradient returns through the same positions.
- ``dct``: SL-FAC, the :mod:`actzip.codecs.dct` codec along the features at the largest average bits a value
  (from :data:`DCT_BITS`) whose payload, its band and group parameters included, fits; the gradient goes back
  through the same codec at the same bits (both directions, as SL-FAC);
- ``quant``: uniform min-max quantization (:mod:`actzip.codecs.quant`, one group a sample) at the largest of 1,
  2, 4, 8 bits whose payload fits, the gradient likewise: the baseline SL-FAC is measured against.

A codec's payload size depends on the data (the dct codec drops bands by energy), so the bits that fit are looked
for from the last ones that fitted at that ratio and shape, down, at each call.

:func:`send` returns the server's view as a tensor that autograd links to the client's activation (the
downlink rule of the compressor above) and the bytes each way. Bytes are those of the payloads the codecs make
(``Payload.nbytes``) or, for the masks, of the values and positions a wire would carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from actzip import codecs
from actzip.errors import ConfigError

__all__ = ["COMPRESSORS", "DCT_BITS", "Sent", "send"]

COMPRESSORS = ("random", "topk", "dct", "quant")
DCT_BITS = (8.0, 6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.75, 0.5, 0.375, 0.25, 0.125)  # tried from the top down
_QUANT_BITS = (8, 4, 2, 1)
_FITTED: dict[tuple, int] = {}  # (method, ratio, shape, value bits) -> index of the bits that last fitted


@dataclass
class Sent:
    """The server's view of one modality's activations, and the bytes that crossed the link each way."""

    view: torch.Tensor | None = None  # [batch, width]: what the server computes on; backward reaches the client
    uplink_bytes: float = 0.0
    downlink_bytes: float = 0.0  # the gradient's way back (for the codecs, known once backward has run)


def _check(a: torch.Tensor, ratio: float, method: str) -> None:
    if method not in COMPRESSORS:
        raise ConfigError(f"split uplink: compressor must be one of {COMPRESSORS}, got {method!r}")
    if a.dim() != 2:
        raise ConfigError(f"split uplink: activations must be [batch, width], got shape {tuple(a.shape)}")
    if not 0 <= ratio <= 1 or not math.isfinite(ratio):
        raise ConfigError(f"split uplink: keep-ratio must be in [0, 1], got {ratio}")


class _Masked(torch.autograd.Function):
    """``a * scale`` where kept, 0 elsewhere; the gradient through the same positions and scale."""

    @staticmethod
    def forward(ctx, a, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, a * scale, torch.zeros_like(a))

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, g * ctx.scale, torch.zeros_like(g)), None, None


class _Coded(torch.autograd.Function):
    """The decoded payload of ``a``; the gradient coded by the same codec on its way back (its bytes added to
    ``sent.downlink_bytes``)."""

    @staticmethod
    def forward(ctx, a, decoded, codec, sent):
        ctx.codec, ctx.sent = codec, sent
        return decoded

    @staticmethod
    def backward(ctx, g):
        p = ctx.codec.encode(g.contiguous(), name="downlink gradient")
        ctx.sent.downlink_bytes += p.nbytes
        return ctx.codec.decode(p), None, None, None


def _position_bits(width: int, k: int) -> int:
    """Bits of ``k`` positions among ``width``: a bitmask or ``k`` indices, the smaller."""
    return min(width, k * max(1, math.ceil(math.log2(width))))


def send(a: torch.Tensor, ratio: float, method: str, *, generator: torch.Generator | None = None,
         value_bits: int = 16, seed: int = 0) -> Sent:
    """Compress ``a`` (``[batch, width]``, one modality's activations) to ``ratio`` of its dense payload with
    ``method``; see the module docstring. ``generator``: the random mask's positions; ``seed``: the codecs'
    stochastic rounding. A ratio too small for the compressor to send anything leaves the modality out (zeros)."""
    _check(a, ratio, method)
    batch, width = a.shape
    budget_bits = ratio * width * value_bits  # a sample
    dense = batch * width * value_bits / 8
    if ratio == 0 or (method == "topk" and budget_bits < value_bits + _position_bits(width, 1)):
        return Sent(torch.zeros_like(a))
    if ratio == 1 and method in ("random", "topk"):
        return Sent(a, dense, dense)
    if method == "random":
        keep = torch.rand(a.shape, generator=generator, device=a.device) < ratio
        values = float(keep.sum()) * value_bits / 8  # the positions come from the shared seed
        return Sent(_Masked.apply(a, keep, 1 / ratio), values, values)
    if method == "topk":
        k = min(width, int(budget_bits // value_bits))
        while k > 1 and k * value_bits + _position_bits(width, k) > budget_bits:
            k -= 1
        idx = a.detach().abs().topk(k, dim=1).indices
        keep = torch.zeros_like(a, dtype=torch.bool).scatter_(1, idx, True)
        up = batch * (k * value_bits + _position_bits(width, k)) / 8
        return Sent(_Masked.apply(a, keep, 1.0), up, batch * k * value_bits / 8)  # the client knows its positions
    return _coded(a, ratio, method, budget_bits * batch / 8, value_bits, seed)


def _codec(method: str, bits: float, width: int, seed: int):
    if method == "dct":
        return codecs.get("dct", bits=bits, bands=min(8, width), seed=seed)
    return codecs.get("quant", bits=int(bits), group_size=-(-width // 8) * 8, seed=seed)


def _coded(a: torch.Tensor, ratio: float, method: str, budget: float, value_bits: int, seed: int) -> Sent:
    """``a`` through the dct or quant codec at the largest bits whose payload fits ``budget`` bytes."""
    grid = DCT_BITS if method == "dct" else _QUANT_BITS
    key = (method, ratio, tuple(a.shape), value_bits)
    top = [i for i, b in enumerate(grid) if b <= ratio * value_bits]
    for i in range(max(_FITTED.get(key, top[0] if top else len(grid)), top[0] if top else len(grid)), len(grid)):
        codec = _codec(method, grid[i], a.shape[1], seed)
        payload = codec.encode(a.detach().contiguous(), name="uplink activations")
        if payload.nbytes <= budget:
            _FITTED[key] = i
            sent = Sent(uplink_bytes=float(payload.nbytes))
            sent.view = _Coded.apply(a, codec.decode(payload), codec, sent)
            return sent
    return Sent(torch.zeros_like(a))  # not even the fewest bits fit: the modality is absent
