"""Masking (``mask``): keep a fraction of a tensor's elements, drop the rest.

Over the tensor's ``n`` elements in memory order, ``k = max(1, round(keep * n))`` are kept:

- ``mode="random"``: ``k`` positions drawn uniformly without replacement from a seed. The positions are
  never sent: they are rebuilt from the seed on a private CPU generator (the same positions on every device),
  so the mask costs 8 bytes. Every element is kept with probability ``k / n``; with ``rescale`` (the default
  for this mode) the kept values are multiplied by ``n / k`` on decode, which makes the codec unbiased:
  ``E[decode(encode(x))] = x``, with ``Var = x_j**2 * (n / k - 1)`` per element.
- ``mode="topk"``: the ``k`` elements of largest magnitude. Their positions are sent as a bitmask (``n / 8``
  bytes) or as int32 indices (``4 k`` bytes), whichever is smaller. Biased (small values are always lost), so
  ``rescale`` is off by default; the kept values come back exactly.

Format (buffers):

- ``values``: the kept values in ``x``'s dtype, bit-exact (for ``topk`` in increasing position order);
- ``seed`` (random): int64 ``[1]``, the seed of this encode's positions: ``derive_seed(seed, i)`` for the
  ``i``-th encode of the codec, as for ``sketch``;
- ``mask`` (topk, when smaller): uint8 ``[ceil(n / 8)]``, little-endian bits as in :mod:`actzip.codecs.bitpack`;
- ``index`` (topk, otherwise): int32 ``[k]``, increasing;
- ``finite`` (``check=False`` only): uint8 ``[1]``, 0 when ``x`` holds inf or NaN; the whole tensor then
  decodes to NaN, never to finite numbers that hide the fault.

With ``check=True`` (default) a tensor holding inf or NaN is refused with :class:`InvalidValueError` (one host
sync per encode). Decoding a random mask reads its seed on the host (one sync on CUDA); decoding a top-k
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

MASK_MODES = ("random", "topk")


def kept_count(n: int, keep: float) -> int:
    """Elements a mask with fraction ``keep`` keeps out of ``n`` (at least one of a non-empty tensor)."""
    return min(n, max(1, round(keep * n))) if n else 0


def random_positions(n: int, k: int, seed: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``k`` positions (int64, increasing) a random mask with ``seed`` keeps out of ``n``.

    Drawn on a private CPU generator, so the same arguments give the same positions on every device.
    """
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return torch.randperm(n, generator=g)[:k].sort().values.to(device)


@register_codec("mask")
class MaskCodec(Codec):
    """Keep a fraction of the elements (random or largest). See the module docstring for the format.

    Options:
      keep: fraction of the elements kept, in (0, 1].
      mode: ``"random"`` (positions from a seed; 8 bytes of mask) or ``"topk"`` (largest magnitudes;
        positions as a bitmask or int32 indices, whichever is smaller).
      rescale: multiply kept values by ``n / k`` on decode. ``None`` (default): on for ``random`` (then the codec
        is unbiased), off for ``topk`` (where it would only inflate the largest values).
      seed: base seed of the random positions (``None`` means 0); a fresh derived seed per encode.
      check: refuse inf/NaN (one host sync per encode); without it a tensor holding them decodes to all NaN.

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
    ) -> None:
        if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0.0 < keep <= 1.0:
            raise ConfigError(f"mask: option keep must be a fraction in (0, 1], got {keep!r}")
        check_choice("mask", "mode", mode, MASK_MODES)
        if rescale is not None and not isinstance(rescale, bool):
            raise ConfigError(f"mask: option rescale must be None, True or False, got {rescale!r}")
        check_seed("mask", seed)
        self.keep = float(keep)
        self.mode = mode
        self.rescale = (mode == "random") if rescale is None else rescale
        self.seed = seed
        self.check_values = bool(check)
        self.unbiased = (mode == "random" and self.rescale) or self.keep == 1.0
        self._count = 0

    def options(self) -> dict:
        return {"keep": self.keep, "mode": self.mode, "rescale": self.rescale, "seed": self.seed,
                "check": self.check_values}

    def payload_nbytes(self, n: int, itemsize: int) -> int:
        """Bytes of the payload of an ``n``-element tensor of ``itemsize``-byte elements."""
        k = kept_count(n, self.keep)
        where = 8 if self.mode == "random" else min((n + 7) // 8, 4 * k)
        return k * itemsize + where + (0 if self.check_values else 1)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        flat, perm = memory_order(x)
        n = flat.numel()
        k = kept_count(n, self.keep)
        buffers: dict[str, torch.Tensor] = {}
        if self.check_values:
            bad = int((~torch.isfinite(flat)).sum())
            if bad:
                raise InvalidValueError(
                    f"mask: {name} has {bad} of {n} elements non-finite (inf or NaN); mask cannot drop them "
                    f"silently (check=False makes such a tensor decode to NaN)"
                )
        if self.mode == "random":
            seed = derive_seed(0 if self.seed is None else self.seed, self._count)
            self._count += 1
            pos = random_positions(n, k, seed, x.device)
            buffers["seed"] = torch.tensor([seed], dtype=torch.int64, device=x.device)
        else:
            pos = torch.topk(flat.abs(), k, sorted=False).indices.sort().values if k else flat.new_zeros(0).long()
            if (n + 7) // 8 <= 4 * k:
                bits = torch.zeros(n + (-n) % 8, dtype=torch.bool, device=x.device)
                bits[pos] = True
                buffers["mask"] = pack_bool(bits)
            else:
                buffers["index"] = pos.to(torch.int32)
        buffers["values"] = flat[pos].clone()
        if not self.check_values:
            buffers["finite"] = torch.isfinite(flat).all().to(torch.uint8).reshape(1)
        meta = {"perm": perm, "keep": self.keep, "mode": self.mode, "rescale": self.rescale}
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers, meta=meta)

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        n = p.shape.numel()
        k = kept_count(n, p.meta["keep"])
        values = p.buffers["values"]
        if values.numel() != k:
            raise PayloadError(f"mask: payload holds {values.numel()} values where keep={p.meta['keep']} of "
                               f"{n} elements means {k}")
        if p.meta["mode"] == "random":
            pos = random_positions(n, k, int(p.buffers["seed"][0]), p.device)
        elif "mask" in p.buffers:
            bits = unpack_bool(p.buffers["mask"], n)
            pos = torch.nonzero_static(bits, size=k).reshape(-1)
        else:
            pos = p.buffers["index"].long()
        if p.meta["rescale"] and k:
            values = (values.to(work_dtype(p.dtype)) * (n / k)).to(p.dtype)
        out = torch.zeros(n, dtype=p.dtype, device=p.device)
        out[pos] = values
        if "finite" in p.buffers:
            out = torch.where(p.buffers["finite"].bool(), out, torch.nan)
        return restore_order(out, p.shape, p.meta["perm"])
