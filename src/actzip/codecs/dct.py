"""The ``dct`` codec (SL-FAC): a tensor in the frequency domain, its spectral bands given bits by their energy.

Along one axis (``axis``, default the last) every line of the tensor is taken through an orthonormal DCT-II
(:func:`dct` / :func:`idct`, through ``torch.fft``, so on any device). The ``L`` coefficients of a line are cut
into ``bands`` contiguous bands of (nearly) equal width; each band's energy is the mean square of its
coefficients over the whole tensor. Bits go to bands greedily, the largest drop in the distortion model
``energy * width * 4**-bits`` per bit spent first, from {0, 1, 2, 4, 8} bits a coefficient, until the budget of
``bits`` a coefficient on average is spent; each band is then coded by the ``quant`` codec at its width (groups
of a line's band, min-max scale, stochastic rounding). A band given 0 bits is not sent and decodes to zero.

Guarantee: with stochastic rounding the decoded tensor is, in expectation, the tensor's projection onto the sent
bands (unbiased there: the DCT is linear and orthonormal); the bands left out are the whole error of that
expectation, their energy reported in ``meta["dropped_energy"]``. Every sent coefficient is within one quant step
of its band's line range (the ``quant`` codec's bound), and the orthonormal inverse keeps the error's energy.
"""

from __future__ import annotations

import math

import torch

from actzip.codecs.base import Codec
from actzip.codecs.lossy import ROUNDINGS
from actzip.codecs.quant import QuantCodec
from actzip.core.checks import check_choice, check_seed
from actzip.core.dtypes import LOSSY_DTYPES
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError

__all__ = ["BAND_BITS", "DCTCodec", "allocate_bits", "dct", "idct"]

BAND_BITS = (0, 1, 2, 4, 8)  # bits a coefficient a band may get (0: the band is not sent)


def dct(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal DCT-II along the last dimension (Makhoul's reordering and one complex FFT)."""
    n = x.shape[-1]
    v = torch.cat([x[..., ::2], x[..., 1::2].flip(-1)], dim=-1)
    k = torch.arange(n, device=x.device, dtype=x.dtype)
    w = torch.exp(torch.complex(torch.zeros_like(k), -math.pi * k / (2 * n)))
    out = (torch.fft.fft(v, dim=-1) * w).real * 2
    scale = torch.full((n,), math.sqrt(1 / (2 * n)), device=x.device, dtype=x.dtype)
    scale[0] = math.sqrt(1 / (4 * n))
    return out * scale


def idct(c: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`dct` (an orthonormal DCT-III) along the last dimension."""
    n = c.shape[-1]
    scale = torch.full((n,), math.sqrt(2 * n), device=c.device, dtype=c.dtype)
    scale[0] = math.sqrt(4 * n)
    x = c * scale / 2  # the unnormalized transform's half
    k = torch.arange(n, device=c.device, dtype=c.dtype)
    rev = torch.cat([torch.zeros_like(x[..., :1]), x[..., 1:].flip(-1)], dim=-1)  # X[n - k], X[n] = 0
    w = torch.exp(torch.complex(torch.zeros_like(k), math.pi * k / (2 * n)))
    v = torch.fft.ifft(torch.complex(x, -rev) * w, dim=-1).real
    half = (n + 1) // 2
    out = torch.empty_like(v)
    out[..., ::2] = v[..., :half]
    out[..., 1::2] = v[..., half:].flip(-1)
    return out


def allocate_bits(energy: list[float], widths: list[int], bits: float) -> list[int]:
    """Bits a coefficient per band (from :data:`BAND_BITS`) for an average of ``bits``: greedily, the largest
    drop of ``energy * width * 4**-b`` per bit spent, while the budget ``bits * sum(widths)`` allows."""
    budget = bits * sum(widths)
    got = [0] * len(widths)
    spent = 0.0
    while True:
        best, best_gain = None, 0.0
        for i, (e, w) in enumerate(zip(energy, widths)):
            level = BAND_BITS.index(got[i])
            if level + 1 == len(BAND_BITS):
                continue
            nxt = BAND_BITS[level + 1]
            cost = (nxt - got[i]) * w
            if spent + cost > budget + 1e-9:
                continue
            gain = e * w * (4.0 ** -got[i] - 4.0 ** -nxt) / cost
            if gain > best_gain:
                best, best_gain = i, gain
        if best is None:
            return got
        nxt = BAND_BITS[BAND_BITS.index(got[best]) + 1]
        spent += (nxt - got[best]) * widths[best]
        got[best] = nxt


@register_codec("dct")
class DCTCodec(Codec):
    """SL-FAC's frequency codec (see the module docstring).

    Options:
      bits: average bits a coefficient, over the whole spectrum (a positive number up to 8).
      bands: spectral bands a line is cut into (1 to the line's length).
      axis: the axis the DCT runs along.
      rounding: ``"stochastic"`` (unbiased on the sent bands) or ``"nearest"``.
      seed: seed of the stochastic rounding (``None`` means 0).
    """

    lossless = False
    unbiased = False  # only on the bands it sends
    dtypes = LOSSY_DTYPES

    def __init__(self, *, bits: float = 4.0, bands: int = 8, axis: int = -1, rounding: str = "stochastic",
                 seed: int | None = None) -> None:  # fmt: skip
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 < bits <= 8:
            raise ConfigError(f"dct: option bits must be a number in (0, 8] (average bits a coefficient), got {bits!r}")
        if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
            raise ConfigError(f"dct: option bands must be a positive int, got {bands!r}")
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ConfigError(f"dct: option axis must be an int, got {axis!r}")
        check_choice("dct", "rounding", rounding, ROUNDINGS)
        check_seed("dct", seed)
        self.bits, self.bands, self.axis, self.rounding, self.seed = float(bits), bands, axis, rounding, seed
        self._encodes = 0  # each encode draws its own rounding stream

    def options(self) -> dict:
        return {"bits": self.bits, "bands": self.bands, "axis": self.axis, "rounding": self.rounding,
                "seed": self.seed}

    def _lines(self, x: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
        if x.dim() == 0:
            raise ConfigError(f"dct: {name} is a scalar; the DCT needs an axis")
        axis = self.axis % x.dim() if -x.dim() <= self.axis < x.dim() else None
        if axis is None:
            raise ConfigError(f"dct: option axis={self.axis} is out of range for {name} of {x.dim()} dimensions")
        if x.shape[axis] < self.bands:
            raise ConfigError(f"dct: {name} has {x.shape[axis]} elements along axis {axis}, fewer than "
                              f"bands={self.bands}")
        return x.movedim(axis, -1), axis

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        lines, axis = self._lines(x, name)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        c = dct(lines.to(work)).reshape(-1, lines.shape[-1])
        n = c.shape[-1]
        edges = [round(i * n / self.bands) for i in range(self.bands + 1)]
        widths = [edges[i + 1] - edges[i] for i in range(self.bands)]
        energy = [float(c[:, a:b].square().mean()) for a, b in zip(edges, edges[1:])]  # one sync a band
        if not all(math.isfinite(e) for e in energy):
            raise ConfigError(f"dct: {name} has inf or NaN values")
        band_bits = allocate_bits(energy, widths, self.bits)
        seed = (0 if self.seed is None else self.seed) * 1_000_003 + self._encodes
        self._encodes += 1
        buffers, metas = {}, []
        for i, (a, b, k) in enumerate(zip(edges, edges[1:], band_bits)):
            if k == 0:
                metas.append(None)
                continue
            band = c[:, a:b].contiguous()
            q = QuantCodec(bits=k, group_size=-(-(b - a) // 8) * 8, rounding=self.rounding, seed=seed + i,
                           kernel="torch")  # fmt: skip
            p = q.encode(band, name=f"{name} band {i}")
            buffers.update({f"b{i}_{key}": t for key, t in p.buffers.items()})
            metas.append((q.options(), p.meta))
        dropped = math.fsum(e * w for e, w, k in zip(energy, widths, band_bits) if k == 0) * c.shape[0]
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers,
                       meta={"axis": axis, "edges": edges, "band_bits": band_bits, "bands": metas,
                             "lines_shape": tuple(lines.shape), "work": work, "dropped_energy": dropped})

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        m = p.meta
        rows = math.prod(m["lines_shape"][:-1])
        c = torch.zeros(rows, m["lines_shape"][-1], dtype=m["work"], device=p.device)
        for i, (a, b, band) in enumerate(zip(m["edges"], m["edges"][1:], m["bands"])):
            if band is None:
                continue
            options, meta = band
            q = QuantCodec(**options)
            bufs = {key.split("_", 1)[1]: t for key, t in p.buffers.items() if key.startswith(f"b{i}_")}
            c[:, a:b] = q.decode(Payload(q.name, torch.Size((rows, b - a)), m["work"], p.device, buffers=bufs, meta=meta))
        lines = idct(c).reshape(m["lines_shape"])
        return lines.movedim(-1, m["axis"]).to(p.dtype).contiguous()
