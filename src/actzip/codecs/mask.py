"""Masking (``mask``): keep a fraction of a tensor's elements, drop the rest.

Over the tensor's ``n`` elements in memory order, ``k = max(1, round(keep * n))`` are kept:

- ``mode="random"``: ``k`` positions drawn uniformly without replacement from a seed. The positions are
  never sent: they are rebuilt from the seed where the tensor lives, as the ``k`` smallest of a keyed bijective
  hash of the positions (:func:`random_positions`: the same positions on every device), so the mask costs 8
  bytes. Every element is kept with probability ``k / n``; with ``rescale`` (the default
  for this mode) the kept values are multiplied by ``n / k`` on decode, which makes the codec unbiased:
  ``E[decode(encode(x))] = x``, with ``Var = x_j**2 * (n / k - 1)`` per element.
- ``mode="topk"``: the ``k`` elements of largest magnitude. Their positions are sent as a bitmask (``n / 8``
  bytes) or as int32 indices (``4 k`` bytes), whichever is smaller. Biased (small values are always lost), so
  ``rescale`` is off by default; the kept values come back exactly.
- ``mode="topk-random"``: the ``k // 2`` largest exactly (their positions as a bitmask), and ``k - k // 2`` of
  the other ``r = n - k // 2`` drawn as ``random`` draws them (from a seed, among the others in increasing
  position order), multiplied by ``r / (k - k // 2)`` on decode (``rescale``, on by default). Unbiased, and the
  variance is only the small elements': ``x_j**2 * (r / (k - k // 2) - 1)`` for each element not among the
  largest, 0 for those. Per element only (no ``structure``).

``structure`` chooses what is kept or dropped whole: ``"element"`` (the default: single elements, as above),
``"channel"`` (columns of the tensor seen as ``[rows, channels]``, its last dimension: ``k`` of the channels,
every row of each) or ``"token"`` (rows: ``k`` of the rows, every channel of each). A structured top-k ranks
channels or rows by their L2 norm; a structured random mask keeps each with probability ``k / count`` and with
``rescale`` multiplies by ``count / k``: unbiased again, with ``Var = x_j**2 * (count / k - 1)`` per element.
A structured payload's positions index channels or rows; its values are the kept columns (``[rows, k]``) or
rows (``[k, channels]``) in the tensor's logical order.

Format (buffers):

- ``values``: the kept values in ``x``'s dtype, bit-exact (for ``topk`` in increasing position order);
- ``seed`` (random): int64 ``[1]``, the seed of this encode's positions: ``derive_seed(seed, i)`` for the
  ``i``-th encode of the codec, as for ``sketch``;
- ``mask`` (topk when smaller, topk-random always): uint8 ``[ceil(n / 8)]``, little-endian bits as in
  :mod:`actzip.codecs.bitpack` (topk-random: the largest' positions; its ``seed`` draws the others);
- ``index`` (topk, otherwise): int32 ``[k]``, increasing;
- ``finite`` (``check=False`` only): uint8 ``[1]``, 0 when ``x`` holds inf or NaN; the whole tensor then
  decodes to NaN, never to finite numbers that hide the fault.

With ``check=True`` (default) a tensor holding inf or NaN is refused with :class:`InvalidValueError` (one host
sync per encode). Decoding a random mask keeps its seed on the device (no sync); decoding a top-k
bitmask finds its ``k`` positions with a size given in advance, so it needs none.
"""

from __future__ import annotations

import torch

from actzip.codecs.base import Codec
from actzip.codecs.bitpack import pack_bool, unpack_bool
from actzip.codecs.sketch import derive_seed
from actzip.core.checks import check_choice, check_seed
from actzip.core.dtypes import LOSSY_DTYPES, work_dtype
from actzip.core.layout import memory_order, restore_order
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError, InvalidValueError, PayloadError

MASK_MODES = ("random", "topk", "topk-random")
MASK_STRUCTURES = ("element", "channel", "token")


def kept_count(n: int, keep: float) -> int:
    """Elements a mask with fraction ``keep`` keeps out of ``n`` (at least one of a non-empty tensor)."""
    return min(n, max(1, round(keep * n))) if n else 0


_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as an int64: splitmix64's increment
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def random_positions(n: int, k: int, seed, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``k`` positions (int64, increasing) a random mask with ``seed`` (an int, or an int64 tensor of one
    element) keeps out of ``n``: the ``k`` smallest of a keyed hash of the positions.

    The hash is splitmix64's finalizer of ``position + seed * golden`` in int64 arithmetic: a bijection, so no
    two positions tie and every device picks the same ``k``; it runs where the tensor lives, and a seed given as
    a tensor is never read on the host.
    """
    if isinstance(seed, torch.Tensor):
        dev = torch.device(device) if device is not None else seed.device
        s = seed.reshape(()).to(device=dev, dtype=torch.int64)
    else:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        s = torch.tensor(int(seed), dtype=torch.int64, device=dev)
    x = torch.arange(n, dtype=torch.int64, device=dev) + s * _GOLDEN  # int64 arithmetic wraps
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    x = x ^ _shift_right(x, 31)
    return torch.topk(x, k, largest=False, sorted=False).indices.sort().values


def _drawn_others(top_bits: torch.Tensor, others: int, k: int, seed) -> torch.Tensor:
    """topk-random's drawn positions: ``k`` of the ``others`` positions not set in ``top_bits`` (in increasing
    order), as a random mask with ``seed`` draws them (sizes known in advance: no host sync)."""
    rest = torch.nonzero_static(~top_bits, size=others).reshape(-1)
    return rest[random_positions(others, k, seed, top_bits.device)]


@register_codec("mask")
class MaskCodec(Codec):
    """Keep a fraction of the elements (random or largest). See the module docstring for the format.

    Options:
      keep: fraction of the elements kept, in (0, 1].
      mode: ``"random"`` (positions from a seed; 8 bytes of mask), ``"topk"`` (largest magnitudes; positions
        as a bitmask or int32 indices, whichever is smaller) or ``"topk-random"`` (half the largest exactly,
        half drawn from the rest; a bitmask and a seed).
      rescale: multiply kept values by ``n / k`` on decode (topk-random: the drawn ones by ``r / (k - k // 2)``).
        ``None`` (default): on for ``random`` and ``topk-random`` (then the codec is unbiased), off for ``topk``
        (where it would only inflate the largest values).
      seed: base seed of the random positions (``None`` means 0); a fresh derived seed per encode.
      check: refuse inf/NaN (one host sync per encode); without it a tensor holding them decodes to all NaN.
      structure: ``"element"``, ``"channel"`` (whole columns of the last dimension) or ``"token"`` (whole rows).

    Guarantee: kept elements come back bit-exact (times ``n / k`` with ``rescale``, in the working precision);
    dropped ones come back as 0. ``random`` with ``rescale`` is unbiased, each element's variance
    ``x_j**2 * (n / k - 1)``.
    """

    lossless = False
    unbiased = False  # set per instance: random positions with rescale are unbiased
    dtypes = LOSSY_DTYPES

    def __init__(
        self,
        *,
        keep: float = 0.1,
        mode: str = "random",
        rescale: bool | None = None,
        seed: int | None = None,
        check: bool = True,
        structure: str = "element",
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
            raise ConfigError(f"mask: option keep must be a fraction in (0, 1], got {keep!r}")
        check_choice("mask", "mode", mode, MASK_MODES)
        if rescale is not None and not isinstance(rescale, bool):
            raise ConfigError(f"mask: option rescale must be None, True or False, got {rescale!r}")
        check_seed("mask", seed)
        check_choice("mask", "structure", structure, MASK_STRUCTURES)
        self.structure = structure
        self.keep = float(keep)
        self.mode = mode
        if mode == "topk-random" and structure != "element":
            raise ConfigError(f"mask: mode='topk-random' keeps single elements; it has no structure={structure!r}")
        self.rescale = (mode != "topk") if rescale is None else rescale
        self.seed = seed
        self.check_values = bool(check)
        self.unbiased = (mode != "topk" and self.rescale) or self.keep == 1.0
        self._count = 0

    def options(self) -> dict:
        return {"keep": self.keep, "mode": self.mode, "rescale": self.rescale, "seed": self.seed,
                "check": self.check_values, "structure": self.structure}

    def payload_nbytes(self, n: int, itemsize: int, channels: int | None = None) -> int:
        """Bytes of the payload of an ``n``-element tensor of ``itemsize``-byte elements (structured masks: with
        ``channels`` elements in its last dimension)."""
        units, width = n, 1
        if self.structure != "element":
            if not channels or n % channels:
                raise ConfigError(f"mask: structure={self.structure!r} needs the tensor's last dimension "
                                  f"(channels=...) dividing its {n} elements, got {channels!r}")
            rows = n // channels
            units, width = (channels, rows) if self.structure == "channel" else (rows, channels)
        k = kept_count(units, self.keep)
        where = {"random": 8, "topk": min((units + 7) // 8, 4 * k), "topk-random": (units + 7) // 8 + 8}[self.mode]
        return k * width * itemsize + where + (0 if self.check_values else 1)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        if self.structure != "element":
            return self._encode_structured(x, name)
        flat, perm = memory_order(x)
        n = flat.numel()
        k = kept_count(n, self.keep)
        buffers: dict[str, torch.Tensor] = {}
        self._check_finite(flat, name)
        if self.mode == "topk-random":
            pos = self._split_positions(flat, n, k, buffers)
        else:
            pos = self._positions(n, k, flat.abs, x.device, buffers)
        buffers["values"] = flat[pos].clone()
        if not self.check_values:
            buffers["finite"] = torch.isfinite(flat).all().to(torch.uint8).reshape(1)
        meta = {"perm": perm, "keep": self.keep, "mode": self.mode, "rescale": self.rescale}
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers, meta=meta)

    def _check_finite(self, flat: torch.Tensor, name: str) -> None:
        if self.check_values:
            bad = int((~torch.isfinite(flat)).sum())
            if bad:
                raise InvalidValueError(
                    f"mask: {name} has {bad} of {flat.numel()} elements non-finite (inf or NaN); mask cannot drop "
                    f"them silently (check=False makes such a tensor decode to NaN)"
                )

    def _positions(self, units: int, k: int, scores, device, buffers: dict) -> torch.Tensor:
        """The kept units' positions (random from a fresh seed, or the ``k`` largest ``scores()``), recorded."""
        if self.mode == "random":
            return random_positions(units, k, self._next_seed(device, buffers), device)
        pos = torch.topk(scores(), k, sorted=False).indices.sort().values
        if (units + 7) // 8 <= 4 * k:
            bits = torch.zeros(units + (-units) % 8, dtype=torch.bool, device=device)
            bits[pos] = True
            buffers["mask"] = pack_bool(bits)
        else:
            buffers["index"] = pos.to(torch.int32)
        return pos

    def _next_seed(self, device, buffers: dict) -> torch.Tensor:
        seed = derive_seed(0 if self.seed is None else self.seed, self._count)
        self._count += 1
        buffers["seed"] = torch.tensor([seed], dtype=torch.int64, device=device)
        return buffers["seed"]

    def _split_positions(self, flat: torch.Tensor, n: int, k: int, buffers: dict) -> torch.Tensor:
        """topk-random: the ``k // 2`` largest (recorded as a bitmask), then the drawn others (from a fresh seed)."""
        top_k = k // 2
        top = torch.topk(flat.abs(), top_k, sorted=False).indices.sort().values
        bits = torch.zeros(n + (-n) % 8, dtype=torch.bool, device=flat.device)
        bits[top] = True
        buffers["mask"] = pack_bool(bits)
        seed = self._next_seed(flat.device, buffers)
        return torch.cat([top, _drawn_others(bits[:n], n - top_k, k - top_k, seed)])

    def _encode_structured(self, x: torch.Tensor, name: str) -> Payload:
        if x.dim() == 0:
            raise ConfigError(f"mask: structure={self.structure!r} needs a tensor with a channel dimension; "
                              f"{name} is a scalar")
        rows2d = x.reshape(-1, x.shape[-1])
        self._check_finite(rows2d.reshape(-1), name)
        axis = 1 if self.structure == "channel" else 0
        units = rows2d.shape[axis]
        k = kept_count(units, self.keep)
        buffers: dict[str, torch.Tensor] = {}
        scores = lambda: rows2d.to(work_dtype(x.dtype)).square().sum(1 - axis)  # noqa: E731
        pos = self._positions(units, k, scores, x.device, buffers)
        buffers["values"] = rows2d.index_select(axis, pos).contiguous()
        if not self.check_values:
            buffers["finite"] = torch.isfinite(rows2d).all().to(torch.uint8).reshape(1)
        meta = {"keep": self.keep, "mode": self.mode, "rescale": self.rescale, "structure": self.structure}
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers, meta=meta)

    def _decode_structured(self, p: Payload) -> torch.Tensor:
        shape = p.shape
        channels = shape[-1] if len(shape) else 1
        rows = shape.numel() // channels if channels else 0
        axis = 1 if p.meta["structure"] == "channel" else 0
        units = (rows, channels)[axis]
        k = kept_count(units, p.meta["keep"])
        values = p.buffers["values"]
        want = (rows, k) if axis == 1 else (k, channels)
        if tuple(values.shape) != want:
            raise PayloadError(f"mask: payload holds values of shape {tuple(values.shape)} where keep="
                               f"{p.meta['keep']} of {units} {p.meta['structure']}s of a {tuple(shape)} tensor "
                               f"means {want}")
        pos = self._decoded_positions(p, units, k)
        if p.meta["rescale"] and k:
            values = (values.to(work_dtype(p.dtype)) * (units / k)).to(p.dtype)
        out = torch.zeros(rows, channels, dtype=p.dtype, device=p.device)
        out.index_copy_(axis, pos, values)
        if "finite" in p.buffers:
            out = torch.where(p.buffers["finite"].bool(), out, torch.nan)
        return out.reshape(shape)

    def _decoded_positions(self, p: Payload, units: int, k: int) -> torch.Tensor:
        if p.meta["mode"] == "topk-random":
            bits = unpack_bool(p.buffers["mask"], units)
            top = torch.nonzero_static(bits, size=k // 2).reshape(-1)
            return torch.cat([top, _drawn_others(bits, units - k // 2, k - k // 2, p.buffers["seed"])])
        if p.meta["mode"] == "random":
            return random_positions(units, k, p.buffers["seed"], p.device)
        if "mask" in p.buffers:
            return torch.nonzero_static(unpack_bool(p.buffers["mask"], units), size=k).reshape(-1)
        return p.buffers["index"].long()

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        if p.meta.get("structure", "element") != "element":
            return self._decode_structured(p)
        n = p.shape.numel()
        k = kept_count(n, p.meta["keep"])
        values = p.buffers["values"]
        if values.numel() != k:
            raise PayloadError(f"mask: payload holds {values.numel()} values where keep={p.meta['keep']} of "
                               f"{n} elements means {k}")
        pos = self._decoded_positions(p, n, k)
        if p.meta["rescale"] and p.meta["mode"] == "topk-random" and k:  # only the drawn part was sampled
            top_k = k // 2
            drawn = (values[top_k:].to(work_dtype(p.dtype)) * ((n - top_k) / (k - top_k))).to(p.dtype)
            values = torch.cat([values[:top_k], drawn])
        elif p.meta["rescale"] and k:
            values = (values.to(work_dtype(p.dtype)) * (n / k)).to(p.dtype)
        out = torch.zeros(n, dtype=p.dtype, device=p.device)
        out[pos] = values
        if "finite" in p.buffers:
            out = torch.where(p.buffers["finite"].bool(), out, torch.nan)
        return restore_order(out, p.shape, p.meta["perm"])
