"""What a split-learning client sends of one modality's activations under a keep-ratio, what the server makes of
it, and the gradient's way back.

A keep-ratio ``r`` is a share of the modality's dense payload (``width`` values a sample at ``value_bits``
each, bf16's 16 by default): ``r * width * value_bits`` bits a sample, whatever the compressor. Each compressor
spends them its own way (:data:`COMPRESSORS`):

- ``random``: each value kept with probability ``r`` and rescaled by ``1 / r`` (unbiased); the positions come from
  a seed both ends know, so only the values travel (bf16). The gradient returns through the same positions.
- ``topk``: the ``k`` largest magnitudes of each sample, exact (bf16), with their indices: ``k`` is what fits.
  The gradient returns at the same positions, values only (the client knows its indices).
- ``dct``: SL-FAC, the :mod:`actzip.codecs.dct` codec (over each feature map's plane, or along the last axis,
  cut into :data:`DCT_BANDS` bands or, where the expected error is less, finer up to :data:`DCT_MAX_BANDS`;
  each coefficient's ranges its own) with the whole budget as its payload budget (``budget="payload"``: codes,
  padding and ranges), less the 8 bytes that name its bits and the room for its side information (which
  decomposition and which bits each band got: a byte, and a byte a band of the finest decomposition, at most
  65); its lowest band is always sent when the budget
  affords it at 1 bit (``min_bands=1``), so a modality at its least ratio carries its spectrum's lowest band
  and not an empty payload. The gradient goes back through the same codec at the same bits (both directions,
  as SL-FAC);
- ``quant``: uniform min-max quantization (:mod:`actzip.codecs.quant`, one group a sample) at the largest of 1,
  2, 4, 8 bits whose payload fits, the gradient likewise: the baseline SL-FAC is measured against.

``dct`` and ``quant`` round their codes stochastically by default (unbiased on what they send);
``Link(rounding="nearest")`` rounds to nearest both ways: biased, with half the error variance, which at a fraction
of a bit a value can train better than the unbiased noise. ``Link(levels="fitted")`` lets ``dct`` code each band
on a unit Gaussian's Lloyd–Max levels with one scale a group where that leaves less error than the min-max grid
(the codec's ``levels`` option), both ways.

Activations are ``[batch, ...]``: ``dct`` takes them as they are (a convolutional client's feature maps: the
2-D DCT of each ``[height, width]`` plane of a ``[batch, channels, height, width]`` tensor, the 1-D DCT along
the last axis of a ``[batch, channels, time]`` one, whose spectra SL-FAC exploits), the others see them as
``[batch, features]``.

A ratio too small for anything of a modality to fit leaves it out: nothing is sent and the server sees zeros
(announced once per compressor and width, counted in ``actzip.kernels.runtime.fallback_counts()``).

Four steps, each a function, make the wire form (:class:`~actzip.split.runtime` sends their items through the
wire transport): :func:`pack` (client: items to send, and what it keeps to read the gradient), :func:`unpack`
(server: the dense view), :func:`pack_grad` (server: the gradient's items), :func:`unpack_grad` (client: the
gradient of its activations). :func:`send` chains them in one process for a simulation, with autograd carrying
the gradient. Items are plain tensors: a codec's payload goes as its buffers (``dct``'s as one byte tensor, its
side information first), which the other end rebuilds into the payload from the link and the shape, so the
transport describes a few named tensors and not a codec's whole metadata. Bytes are the items' own.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from actzip import codecs
from actzip.codecs.dct import LEVELS
from actzip.codecs.lossy import ROUNDINGS
from actzip.core.payload import Payload
from actzip.errors import ConfigError
from actzip.kernels.runtime import record_fallback

__all__ = ["COMPRESSORS", "DCT_BANDS", "DCT_GROUP", "DCT_HEADER", "DCT_MAX_BANDS", "Link", "Packed", "Sent", "WIRE",
           "check_levels", "item_bytes", "least_ratio", "pack", "pack_grad", "send", "unpack", "unpack_grad"]

COMPRESSORS = ("random", "topk", "dct", "quant")
DCT_BANDS = 8  # dct: bands a line or plane is cut into (fewer where it has fewer coefficients)
DCT_MAX_BANDS = 64  # dct: the finest cut it may adapt to (bands doubled while the expected error falls)
DCT_GROUP = 256  # dct: coefficients of a band sharing one range (two float32: a quarter bit a coefficient)
DCT_HEADER = 8  # dct: bytes naming the codec's bits (float64), so the server's gradient codec is the client's
WIRE = "wire"  # dct: the item of its payload as one byte tensor (DCTCodec.to_wire)
_QUANT_BITS = (8, 4, 2, 1)
_FITTED: dict[tuple, int] = {}  # (ratio, shape, value bits) -> index of the quant bits that last fitted


@dataclass(frozen=True)
class Link:
    """How one modality travels one step; both ends build the same one."""

    method: str  # one of COMPRESSORS
    ratio: float  # share of the dense payload
    seed: int = 0  # the random mask's positions and the codecs' rounding, this step
    value_bits: int = 16  # bits of a dense value (the budget's unit)
    # how dct and quant round their codes (ROUNDINGS): "stochastic" (unbiased on what they send) or "nearest"
    # (biased, half the error variance: at a fraction of a bit a value the noise can cost more than the bias)
    rounding: str = "stochastic"
    # how dct codes its bands (actzip.codecs.dct.LEVELS): "uniform" (the min-max grid) or "fitted" (that or a
    # unit Gaussian's Lloyd-Max levels, whichever leaves less error); dct's alone
    levels: str = "uniform"

    def __post_init__(self) -> None:
        if self.method not in COMPRESSORS:
            raise ConfigError(f"split uplink: compressor must be one of {COMPRESSORS}, got {self.method!r}")
        if self.rounding not in ROUNDINGS:
            raise ConfigError(f"split uplink: rounding must be one of {ROUNDINGS}, got {self.rounding!r}")
        check_levels("split uplink: levels", self.levels, self.method)
        if not (0 <= self.ratio <= 1) or not math.isfinite(self.ratio):
            raise ConfigError(f"split uplink: keep-ratio must be in [0, 1], got {self.ratio}")


def check_levels(where: str, levels: str, compressor: str) -> None:
    """Refuse, naming ``where``, a ``levels`` that is not one of :data:`~actzip.codecs.dct.LEVELS` or is
    ``"fitted"`` for a compressor other than ``dct`` (whose option it is)."""
    if levels not in LEVELS or (levels != "uniform" and compressor != "dct"):
        raise ConfigError(f"{where} must be one of {LEVELS} ('fitted' only with the dct compressor), got "
                          f"{levels!r} with {compressor!r}")


@dataclass
class Packed:
    """The client's side of one step: the items sent, and what it keeps to read the gradient."""

    items: dict = field(default_factory=dict)  # name -> tensor; empty: the modality is left out
    keep: object = None  # the random mask, the top-k indices or the codec


def item_bytes(items: dict) -> int:
    """Bytes of a message's items (tensors' and payloads' own)."""
    return sum(v.nbytes if isinstance(v, Payload) else v.numel() * v.element_size() for v in items.values())


def _mask(shape, ratio: float, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(shape, generator=g) < ratio).to(device)


def _index_dtype(width: int) -> torch.dtype:
    return torch.uint8 if width <= 256 else torch.int16 if width <= 32768 else torch.int32


def _topk_k(width: int, link: Link) -> int:
    per = link.value_bits // 8 + torch.empty(0, dtype=_index_dtype(width)).element_size()
    return min(width, int(link.ratio * width * link.value_bits / 8 // per))


def _left_out(link: Link, width: int) -> "Packed":
    record_fallback("split uplink", f"{link.method} cannot fit one value of a {width}-feature modality in a keep-ratio "
                    "this small", instead="sending nothing of it (the server sees zeros)", stacklevel=4)
    return Packed()


def _codec(method: str, bits: float, shape: tuple[int, ...], seed: int, rounding: str = "stochastic",
           levels: str = "uniform"):
    """The codec of ``method`` at ``bits`` for wire tensors of ``shape``: ``dct`` over each feature map's plane
    (``[batch, channels, height, width]``) or along the last axis, its bands' ranges shared by
    :data:`DCT_GROUP` coefficients, ``bits`` counting its whole payload; ``quant`` one group a sample."""
    if method == "dct":
        dims = 2 if len(shape) >= 4 else 1
        n = math.prod(shape[-dims:])
        return codecs.get("dct", bits=bits, bands=min(DCT_BANDS, n), max_bands=min(DCT_MAX_BANDS, n), dims=dims,
                          group_size=DCT_GROUP, budget="payload", min_bands=1, seed=seed, rounding=rounding,
                          levels=levels)
    return codecs.get("quant", bits=int(bits), group_size=-(-shape[-1] // 8) * 8, seed=seed, rounding=rounding)


@functools.lru_cache(maxsize=256)
def least_ratio(method: str, shape: tuple[int, ...], value_bits: int = 16) -> float:
    """The smallest keep-ratio at which ``method`` sends anything of a modality of ``shape`` (0 for
    ``random``, whose expected payload is any share): one value and its index a sample for ``topk``, the
    lowest band at 1 bit with its ranges and the bytes naming the bits for ``dct``, the coarsest bits' payload
    with its parameters and the byte naming them for ``quant``.
    Allocators give every modality at least this (:func:`actzip.split.keep_ratios`'s ``floor``), else a
    modality scored out is never sent again and never scored again."""
    if method not in COMPRESSORS:
        raise ConfigError(f"split uplink: compressor must be one of {COMPRESSORS}, got {method!r}")
    shape = tuple(int(n) for n in shape)
    batch, width = shape[0], math.prod(shape[1:])
    dense_bits = batch * width * value_bits
    if method == "random":
        return 0.0
    if method == "topk":
        per = value_bits // 8 + torch.empty(0, dtype=_index_dtype(width)).element_size()
        need = batch * per * 8 / dense_bits
    elif method == "dct":
        probe = _codec(method, 1.0, shape, 0)
        need = (probe.least_bytes(shape) + DCT_HEADER + probe.side_bytes(shape)) * 8 / dense_bits
    else:
        sample = torch.randn(_wire_shape(shape, method), generator=torch.Generator().manual_seed(0))
        probe = _codec(method, _QUANT_BITS[-1], tuple(sample.shape), 0)
        payload = probe.encode(sample, name="least ratio probe")  # its size is the shape's
        need = max((payload.nbytes + 1) * 8 / dense_bits, _QUANT_BITS[-1] / value_bits)
    return min(1.0, need * (1 + 1e-9))  # a hair over: pack's fit tests must pass at exactly this ratio


def _wire_shape(shape: tuple[int, ...], method: str) -> tuple[int, ...]:
    """The shape a compressor works on: ``dct`` takes the activations as they are (a convolutional client's
    feature maps: the spectrum SL-FAC exploits), the others see ``[batch, features]``."""
    return tuple(shape) if method == "dct" else (shape[0], math.prod(shape[1:]))


def pack(a: torch.Tensor, link: Link) -> Packed:
    """The items the client sends of ``a`` (``[batch, ...]``, detached is fine) under ``link``."""
    if a.dim() < 2:
        raise ConfigError(f"split uplink: activations must be [batch, ...features], got shape {tuple(a.shape)}")
    wire = torch.bfloat16 if link.value_bits == 16 else a.dtype
    a = a.detach().reshape(_wire_shape(tuple(a.shape), link.method))
    width = a.shape[-1]
    if link.ratio == 0:
        return Packed()
    if link.method == "random":
        keep = _mask(a.shape, link.ratio, link.seed, a.device) if link.ratio < 1 else None
        values = a[keep] if keep is not None else a.reshape(-1)
        return Packed({"values": values.to(wire)}, keep)
    if link.method == "topk":
        k = _topk_k(width, link)
        if k == 0:
            return _left_out(link, width)
        idx = a.abs().topk(k, dim=1).indices
        return Packed({"values": a.gather(1, idx).to(wire), "index": idx.to(_index_dtype(width))}, idx)
    budget = link.ratio * a.numel() * link.value_bits / 8
    if link.method == "dct":
        side = _codec("dct", 1.0, tuple(a.shape), 0).side_bytes(tuple(a.shape))
        bits = min(8.0, (budget - DCT_HEADER - side) * 8 / a.numel())
        codec = _codec("dct", bits, tuple(a.shape), link.seed, link.rounding, link.levels) if bits > 0 else None
        if codec is None or codec.least_bytes(tuple(a.shape)) + DCT_HEADER + side > budget:
            return _left_out(link, width)
        payload = codec.encode(a.contiguous(), name="uplink activations")  # at most bits * numel / 8 bytes
        return Packed({**_wire_items(codec, payload), "bits": torch.tensor([bits], dtype=torch.float64)}, codec)
    key = (link.ratio, tuple(a.shape), link.value_bits)
    top = next((i for i, b in enumerate(_QUANT_BITS) if b <= link.ratio * link.value_bits), len(_QUANT_BITS))
    for i in range(max(_FITTED.get(key, top), top), len(_QUANT_BITS)):
        codec = _codec(link.method, _QUANT_BITS[i], tuple(a.shape), link.seed, link.rounding)
        payload = codec.encode(a.contiguous(), name="uplink activations")
        if payload.nbytes + 1 <= budget:  # and one byte: which bits of the grid
            _FITTED[key] = i
            return Packed({**_wire_items(codec, payload), "bits": torch.tensor([i], dtype=torch.uint8)}, codec)
    return _left_out(link, width)


def unpack(items: dict, link: Link, shape: tuple[int, ...], dtype: torch.dtype, device) -> tuple[torch.Tensor, object]:
    """The server's dense view (of ``shape``) of what :func:`pack` sent (zeros for a modality left out), and
    what it keeps to send the gradient back."""
    shape = tuple(shape)
    wshape = _wire_shape(shape, link.method)
    if not items:
        return torch.zeros(shape, dtype=dtype, device=device), None
    if link.method == "random":
        values = items["values"].to(device=device, dtype=dtype)
        if link.ratio == 1:
            return values.reshape(shape), None
        keep = _mask(wshape, link.ratio, link.seed, device)
        view = torch.zeros(wshape, dtype=dtype, device=device).masked_scatter(keep, values / link.ratio)
        return view.reshape(shape), keep
    if link.method == "topk":
        idx = items["index"].to(device=device, dtype=torch.int64)
        view = torch.zeros(wshape, dtype=dtype, device=device)
        return view.scatter(1, idx, items["values"].to(device=device, dtype=dtype)).reshape(shape), idx
    bits = float(items["bits"][0]) if link.method == "dct" else _QUANT_BITS[int(items["bits"][0])]
    codec = _codec(link.method, bits, wshape, link.seed, link.rounding, link.levels)
    payload = _payload_of(codec, items, wshape, dtype, device)
    return codec.decode(payload).to(device=device, dtype=dtype).reshape(shape), codec


def pack_grad(g: torch.Tensor, link: Link, kept) -> dict:
    """The items the server sends back of the gradient ``g`` on its view (``kept``: what :func:`unpack` gave)."""
    wire = torch.bfloat16 if link.value_bits == 16 else g.dtype
    if link.ratio == 0 or (kept is None and link.method != "random"):
        return {}
    g = g.reshape(_wire_shape(tuple(g.shape), link.method))
    if link.method == "random":
        values = g.reshape(-1) if kept is None else g[kept] / link.ratio
        return {"values": values.to(wire)}
    if link.method == "topk":
        return {"values": g.gather(1, kept).to(wire)}
    return _wire_items(kept, kept.encode(g.contiguous(), name="downlink gradient"))


def unpack_grad(items: dict, link: Link, packed: Packed, shape, dtype, device) -> torch.Tensor | None:
    """The gradient of the client's activations from the server's items (None for a modality left out)."""
    if not items:
        return None
    shape = tuple(shape)
    wshape = _wire_shape(shape, link.method)
    if link.method == "random":
        values = items["values"].to(device=device, dtype=dtype)
        if packed.keep is None:
            return values.reshape(shape)
        return torch.zeros(wshape, dtype=dtype, device=device).masked_scatter(packed.keep, values).reshape(shape)
    if link.method == "topk":
        g = torch.zeros(wshape, dtype=dtype, device=device).scatter(1, packed.keep, items["values"].to(dtype))
        return g.reshape(shape)
    payload = _payload_of(packed.keep, items, wshape, dtype, device)
    return packed.keep.decode(payload).to(device=device, dtype=dtype).reshape(shape)


def _wire_items(codec, payload: Payload) -> dict:
    """A codec's payload as the tensors that travel: ``quant``'s buffers; ``dct``'s as one byte tensor, its side
    information padded to its most bytes (what the budget keeps for it, whichever decomposition won) and its
    buffers (``DCTCodec.to_wire``), since the transport would describe each of its many buffers by name."""
    if codec.name == "dct":
        return {WIRE: codec.to_wire(payload)}
    return dict(payload.buffers)


def _payload_of(codec, items: dict, shape: tuple[int, ...], dtype: torch.dtype, device) -> Payload:
    """The payload :func:`_wire_items` sent of a tensor of ``shape`` and ``dtype`` (both ends' activations and
    gradients share a dtype): ``dct``'s rebuilt from its side information, ``quant``'s from its layout, which the
    shape alone sets."""
    if codec.name == "dct":
        return codec.from_wire(items[WIRE], shape, dtype, device)
    buffers = {k: v.to(device) for k, v in items.items() if k != "bits"}
    _, meta = codec.payload_layout(torch.empty(shape, dtype=dtype, device="meta"))
    return Payload(codec.name, torch.Size(shape), dtype, torch.device(device), buffers=buffers, meta=meta)


@dataclass
class Sent:
    """One modality through :func:`send`: the server's view, and the bytes that crossed the link each way."""

    view: torch.Tensor | None = None  # the activations' shape: what the server computes on; backward reaches the client
    uplink_bytes: float = 0.0
    downlink_bytes: float = 0.0  # the gradient's way back, once backward has run


class _Link(torch.autograd.Function):
    """The server's view of ``a``; the gradient back through :func:`pack_grad` and :func:`unpack_grad`."""

    @staticmethod
    def forward(ctx, a, view, link, packed, kept, sent):
        ctx.link, ctx.packed, ctx.kept, ctx.sent, ctx.meta = link, packed, kept, sent, (a.shape, a.dtype, a.device)
        return view

    @staticmethod
    def backward(ctx, g):
        items = pack_grad(g, ctx.link, ctx.kept)
        ctx.sent.downlink_bytes += item_bytes(items)
        grad = unpack_grad(items, ctx.link, ctx.packed, *ctx.meta)
        return (torch.zeros_like(g) if grad is None else grad), None, None, None, None, None


def send(a: torch.Tensor, ratio: float, method: str, *, seed: int = 0, value_bits: int = 16,
         rounding: str = "stochastic", levels: str = "uniform") -> Sent:
    """``a`` (``[batch, ...]``) through :func:`pack` and :func:`unpack` in one process: the server's view, which
    autograd links back to ``a`` by the compressor's downlink rule, and the bytes each way."""
    link = Link(method, ratio, seed, value_bits, rounding, levels)
    packed = pack(a, link)
    view, kept = unpack(packed.items, link, tuple(a.shape), a.dtype, a.device)
    sent = Sent(uplink_bytes=float(item_bytes(packed.items)))
    sent.view = _Link.apply(a, view, link, packed, kept, sent) if packed.items else view
    return sent
