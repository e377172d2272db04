"""The ``dct`` codec (SL-FAC): a tensor in the frequency domain, its spectral bands given bits by their energy.

Along one axis (``axis``, default the last; ``dims=1``) or over the last two axes (``dims=2``: a feature map's
height and width) every line or plane of the tensor is taken through an orthonormal DCT-II (:func:`dct` /
:func:`idct`, through ``torch.fft``, so on any device). Its ``L`` coefficients, in order of frequency (a plane's
in zig-zag order: by the sum of its two frequencies), are cut into ``bands`` contiguous bands of (nearly) equal
width; each band's energy is the mean square of its coefficients over the whole tensor. Each band is coded by the
``quant`` codec (min-max groups of ``group_size`` values, stochastic rounding) at a width from {0, 1, 2, 4, 8}
bits a coefficient: greedily, the largest drop of the expected squared error per bit spent first, until the
budget of ``bits`` a coefficient on average is spent. A group holds one coefficient's values over consecutive
lines (``group_by="coefficient"``, the default: each frequency gets its own ranges, so the large one-signed
lowest coefficient of a non-negative feature map does not widen the range of the zero-centred ones beside it),
or runs along one line's band, then the next line's (``group_by="line"``). The error of a band is its energy
unsent and, sent at ``k`` bits, its groups' mean squared span times ``1 / (6 (2**k - 1)**2)`` (stochastic
rounding's mean; nearest's is half that): measured on the tensor, so a width whose steps are coarser than the
band's own spread (one bit of a wide range, which can add more error than the band holds) is not spent on it.
A band given 0 bits is not sent and decodes to zero. With ``max_bands`` the decomposition adapts too (SL-FAC's
adaptive frequency decomposition): the codec cuts the spectrum into ``bands``, twice as many, ... up to
``max_bands`` bands, allocates each cut the same way and keeps the one whose expected error is least (finer
bands let a small budget be spent in smaller steps). With ``budget="codes"`` the budget counts the codes only: a group's
minimum and span (two float32) add ``64 / group_size`` bits a sent coefficient. With ``budget="payload"`` a band's
cost is every bit it adds to the payload (its codes with their padding and its groups' ranges), so the payload
holds at most ``bits * numel / 8`` bytes of buffers: what a link with a byte budget needs. ``min_bands`` bands
(the lowest) are sent at 1 bit or more whenever the budget affords them, whether or not the error model would buy
them: a budget that affords the lowest band then never sends nothing (:meth:`DCTCodec.least_bytes` is that band's
cost).

With ``levels="fitted"`` a band may instead be coded on the Lloyd–Max levels of a unit Gaussian at 1, 2 or 4
bits, one least-squares scale a group (:mod:`actzip.codecs.gaussian_levels`): for each band and width the codec
takes whichever of the two leaves less squared error, the uniform grid's by the model above, the levels' measured
on the tensor (each coefficient's lines one group). At a bit or two a coefficient, the uniform grid's steps span
the group's extremes and a zero-centred coefficient rounds far from most of its values; the fitted levels sit
where the values are.

Guarantee: with stochastic rounding and ``levels="uniform"`` the decoded tensor is, in expectation, the tensor's
projection onto the sent bands (unbiased there: the DCT is linear and orthonormal); the bands left out are the
whole error of that expectation, their energy reported in ``meta["dropped_energy"]``. Every sent coefficient is
within one quant step of its group's range (the ``quant`` codec's bound), and the orthonormal inverse keeps the
error's energy. A band on fitted levels is biased (nearest levels) and leaves each group at most its energy, the
error of not sending it.

Besides its buffers, a payload holds what the encoder chose: the decomposition kept and each band's bits and
coder. That is its side information (:meth:`DCTCodec.side_info`: a byte, and a byte a band, at most
:meth:`DCTCodec.side_bytes`); a receiver with the same options that knows the tensor's shape and dtype rebuilds
the payload from the buffers and it (:meth:`DCTCodec.rebuild`), so a link carries these bytes and not the
payload's whole metadata: :meth:`DCTCodec.to_wire` is the payload as one byte tensor (the side information, then
the buffers), :meth:`DCTCodec.from_wire` the payload again.
"""

from __future__ import annotations

import math

import torch

from actzip.codecs.base import Codec
from actzip.codecs.gaussian_levels import LEVEL_BITS, column_errors, decode_levels, encode_levels, levels_cost_bits
from actzip.codecs.lossy import ROUNDINGS
from actzip.codecs.quant import QuantCodec
from actzip.core.checks import check_choice, check_group_size, check_seed
from actzip.core.dtypes import LOSSY_DTYPES
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError

__all__ = ["BAND_BITS", "BUDGETS", "DCTCodec", "GROUPINGS", "LEVELS", "allocate_bits", "dct", "frequency_order", "idct"]

BAND_BITS = (0, 1, 2, 4, 8)  # bits a coefficient a band may get (0: the band is not sent)
BUDGETS = ("codes", "payload")  # what the average bits count: the codes only, or every byte of the payload
GROUPINGS = ("coefficient", "line")  # what a quant group runs over: one coefficient's lines, or one line's band
LEVELS = ("uniform", "fitted")  # a band's codes: the quant codec's min-max grid, or that or Gaussian levels


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


def frequency_order(height: int, width: int) -> torch.Tensor:
    """The zig-zag order of a ``height x width`` plane of 2-D DCT coefficients (row-major indices): by the sum of
    the two frequencies, then by the vertical one."""
    u = torch.arange(height).repeat_interleave(width)
    v = torch.arange(width).repeat(height)
    return torch.argsort((u + v) * (height + 1) + u)


def allocate_bits(energy: list[float], widths: list[int], bits: float,
                  errors: list[list[float]] | None = None, costs: list[list[float]] | None = None,
                  forced: int = 0) -> list[int]:
    """Bits a coefficient per band (from :data:`BAND_BITS`) for an average of ``bits``: greedily, the largest drop
    of the expected squared error per bit spent, while the budget ``bits * sum(widths)`` allows. A band's error
    is ``energy`` unsent and ``errors[band][j]`` a coefficient at ``BAND_BITS[j + 1]`` bits (default the
    high-resolution model ``energy * 4**-bits``); a band may jump several widths at once, so a width that
    costs more than it saves (one bit of a wide range) does not block the next. ``costs[band][j]``: what the
    band costs at ``BAND_BITS[j + 1]`` bits, in the budget's unit (default ``BAND_BITS[j + 1] * width``).
    ``forced``: the lowest bands that get 1 bit first, while the budget affords them."""
    budget = bits * sum(widths) * (1 + 1e-12)
    curve = [[e] + (list(errors[i]) if errors is not None else [e * 4.0 ** -k for k in BAND_BITS[1:]])
             for i, e in enumerate(energy)]
    price = [[0.0] + (list(costs[i]) if costs is not None else [k * w for k in BAND_BITS[1:]])
             for i, w in enumerate(widths)]
    got = [0] * len(widths)
    spent = 0.0
    for i in range(min(forced, len(widths))):
        if spent + price[i][1] > budget:
            break
        spent += price[i][1]
        got[i] = 1
    while True:
        best, best_gain = None, 0.0
        for i, w in enumerate(widths):
            level = BAND_BITS.index(got[i])
            for j in range(level + 1, len(BAND_BITS)):
                cost = price[i][j] - price[i][level]
                if spent + cost > budget:
                    break
                gain = (curve[i][level] - curve[i][j]) * w / cost
                if gain > best_gain:
                    best, best_gain = (i, j), gain
        if best is None:
            return got
        i, j = best
        spent += price[i][j] - price[i][BAND_BITS.index(got[i])]
        got[i] = BAND_BITS[j]


@register_codec("dct")
class DCTCodec(Codec):
    """SL-FAC's frequency codec (see the module docstring).

    Options:
      bits: average bits a coefficient, over the whole spectrum (a positive number up to 8).
      bands: spectral bands a line is cut into (1 to the line's length).
      axis: the axis the DCT runs along (``dims=1``).
      dims: 1 (lines along ``axis``) or 2 (planes of the last two axes, coefficients in zig-zag order).
      group_size: values of a band sharing one minimum and span (a multiple of 8; by coefficient at most the
        lines, rounded up to 8); ``None``: one coefficient's values over all lines (by coefficient) or each
        line's band alone (by line), rounded up to 8.
      group_by: ``"coefficient"`` (a group runs over one coefficient's lines) or ``"line"`` (along a line's band).
      max_bands: ``None`` (``bands`` bands), or the most bands the decomposition may adapt to (``bands``,
        doubled while at most this and the coefficients a line; the least expected error wins).
      rounding: ``"stochastic"`` (unbiased on the sent bands) or ``"nearest"``.
      seed: seed of the stochastic rounding (``None`` means 0).
      budget: ``"codes"`` (``bits`` counts the codes) or ``"payload"`` (every byte of the payload's buffers).
      min_bands: the lowest bands sent at 1 bit or more whenever the budget affords them (0 to the bands).
      levels: ``"uniform"`` (every band on the quant codec's min-max grid) or ``"fitted"`` (each band on that grid
        or on a unit Gaussian's Lloyd–Max levels with one scale a group, whichever leaves less error; needs
        ``group_by="coefficient"``).
    """

    lossless = False
    unbiased = False  # only on the bands it sends
    dtypes = LOSSY_DTYPES

    def __init__(self, *, bits: float = 4.0, bands: int = 8, axis: int = -1, dims: int = 1,
                 group_size: int | None = None, rounding: str = "stochastic", seed: int | None = None,
                 budget: str = "codes", min_bands: int = 0, group_by: str = "coefficient",
                 max_bands: int | None = None, levels: str = "uniform") -> None:  # fmt: skip
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not 0 < bits <= 8:
            raise ConfigError(f"dct: option bits must be a number in (0, 8] (average bits a coefficient), got {bits!r}")
        if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
            raise ConfigError(f"dct: option bands must be a positive int, got {bands!r}")
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ConfigError(f"dct: option axis must be an int, got {axis!r}")
        if dims not in (1, 2) or isinstance(dims, bool):
            raise ConfigError(f"dct: option dims must be 1 (along axis) or 2 (the last two axes), got {dims!r}")
        if dims == 2 and axis != -1:
            raise ConfigError(f"dct: dims=2 runs over the last two axes; option axis must be -1, got {axis!r}")
        if group_size is not None:
            check_group_size("dct", group_size)
        check_choice("dct", "rounding", rounding, ROUNDINGS)
        check_choice("dct", "budget", budget, BUDGETS)
        if isinstance(min_bands, bool) or not isinstance(min_bands, int) or not 0 <= min_bands <= bands:
            raise ConfigError(f"dct: option min_bands must be an int in [0, bands={bands}], got {min_bands!r}")
        check_choice("dct", "group_by", group_by, GROUPINGS)
        check_choice("dct", "levels", levels, LEVELS)
        if levels == "fitted" and group_by != "coefficient":
            raise ConfigError("dct: option levels='fitted' measures each coefficient's lines as one group; it needs "
                              f"group_by='coefficient', got {group_by!r}")
        if max_bands is not None and (isinstance(max_bands, bool) or not isinstance(max_bands, int)
                                      or max_bands < bands):
            raise ConfigError(f"dct: option max_bands must be None or an int >= bands={bands}, got {max_bands!r}")
        check_seed("dct", seed)
        self.group_by, self.max_bands, self.levels = group_by, max_bands, levels
        self.bits, self.bands, self.axis, self.rounding, self.seed = float(bits), bands, axis, rounding, seed
        self.dims, self.group_size, self.budget, self.min_bands = dims, group_size, budget, min_bands
        self._encodes = 0  # each encode draws its own rounding stream

    def options(self) -> dict:
        return {"bits": self.bits, "bands": self.bands, "axis": self.axis, "dims": self.dims,
                "group_size": self.group_size, "rounding": self.rounding, "seed": self.seed, "budget": self.budget,
                "min_bands": self.min_bands, "group_by": self.group_by, "max_bands": self.max_bands,
                "levels": self.levels}

    def _lines(self, x: torch.Tensor, name: str) -> tuple[torch.Tensor, int]:
        if x.dim() == 0:
            raise ConfigError(f"dct: {name} is a scalar; the DCT needs an axis")
        if x.dim() < self.dims:
            raise ConfigError(f"dct: {name} has {x.dim()} dimensions; dims={self.dims} needs at least {self.dims}")
        axis = self.axis % x.dim() if -x.dim() <= self.axis < x.dim() else None
        if axis is None:
            raise ConfigError(f"dct: option axis={self.axis} is out of range for {name} of {x.dim()} dimensions")
        length = math.prod(x.shape[-2:]) if self.dims == 2 else x.shape[axis]
        if length < self.bands:
            raise ConfigError(f"dct: {name} has {length} coefficients a {'plane' if self.dims == 2 else 'line'}, "
                              f"fewer than bands={self.bands}")
        return (x if self.dims == 2 else x.movedim(axis, -1)), axis

    def _forward(self, lines: torch.Tensor) -> torch.Tensor:
        """Coefficients ``[rows, L]`` in order of frequency."""
        if self.dims == 1:
            return dct(lines).reshape(-1, lines.shape[-1])
        h, w = lines.shape[-2:]
        c = dct(dct(lines).transpose(-1, -2)).transpose(-1, -2).reshape(-1, h * w)
        return c[:, frequency_order(h, w).to(c.device)]

    @staticmethod
    def _inverse(c: torch.Tensor, lines_shape: tuple, dims: int) -> torch.Tensor:
        if dims == 1:
            return idct(c).reshape(lines_shape)
        h, w = lines_shape[-2:]
        plane = torch.empty_like(c)
        plane[:, frequency_order(h, w).to(c.device)] = c
        plane = plane.reshape(lines_shape)
        return idct(idct(plane.transpose(-1, -2)).transpose(-1, -2))

    def _laid_out(self, c: torch.Tensor, a: int, b: int) -> torch.Tensor:
        """Band ``[a, b)`` of the coefficients ``[rows, L]`` in the quant codec's order: ``[width, rows]`` by
        coefficient (a group runs over one coefficient's lines), ``[rows, width]`` by line."""
        band = c[:, a:b]
        return band.t() if self.group_by == "coefficient" else band

    def _group(self, rows: int, width: int) -> int:
        """The quant group of a band ``width`` coefficients a line wide over ``rows`` lines."""
        if self.group_by == "coefficient":
            run = -(-rows // 8) * 8
            return run if self.group_size is None else min(self.group_size, run)
        return self.group_size if self.group_size is not None else -(-width // 8) * 8

    def _band_stats(self, band: torch.Tensor, group: int) -> torch.Tensor:
        """A laid-out band's energy (mean square) and its quant groups' mean squared span, as one tensor."""
        flat = band.reshape(-1)
        whole = flat.numel() // group * group
        groups = flat[:whole].reshape(-1, group) if whole else flat.reshape(1, -1)
        span = groups.amax(dim=1) - groups.amin(dim=1)
        return torch.stack([flat.square().mean(), span.square().mean()])

    def _band_bits_cost(self, rows: int, width: int, bits: int, work: torch.dtype) -> int:
        """Payload bits of a band ``width`` coefficients a line over ``rows`` lines at ``bits``: its codes (whole
        groups, padding included) and each group's minimum and span in the working precision."""
        g = self._group(rows, width)
        groups = -(-rows * width // g)
        return groups * (g * bits + 2 * 8 * torch.empty(0, dtype=work).element_size())

    def _cuts(self, n: int) -> list[list[int]]:
        """The band edges of each decomposition tried for ``n`` coefficients a line: ``bands`` bands, then twice
        as many while at most ``max_bands`` and ``n``."""
        counts = [self.bands]
        while self.max_bands is not None and counts[-1] * 2 <= min(self.max_bands, n):
            counts.append(counts[-1] * 2)
        return [[round(i * n / k) for i in range(k + 1)] for k in counts]

    def least_bytes(self, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
        """Bytes of the lowest band of a tensor of ``shape`` at 1 bit (the narrowest such band of the
        decompositions tried), codes and ranges: with ``min_bands >= 1`` and ``budget="payload"``, a budget of
        ``bits * numel / 8`` bytes that holds it sends a lowest band at least, whatever the data."""
        probe = torch.empty(shape, dtype=dtype, device="meta")
        lines, _ = self._lines(probe, "tensor")
        rows = math.prod(lines.shape[:-self.dims])
        work = torch.float64 if dtype == torch.float64 else torch.float32
        cuts = self._cuts(math.prod(lines.shape[-self.dims:]))
        return min(-(-self._band_bits_cost(rows, e[1] - e[0], 1, work) // 8) for e in cuts)

    def _allocate(self, stats: list, widths: list[int], rows: int, work: torch.dtype,
                  fitted: list | None = None) -> tuple[list[int], float, list[list[bool]]]:
        """Bits a coefficient per band for one decomposition, the expected squared error a line they leave, and
        per band and width whether the fitted levels code it. ``fitted``: per band, the mean squared error a
        coefficient the levels leave at each of :data:`LEVEL_BITS`."""
        energy = [e for e, _ in stats]
        # a b-bit group's step is its span / (2**b - 1); stochastic rounding's error is f(1 - f) steps squared
        # (1/6 of a step squared on average), nearest's 1/12
        share = 1 / 6 if self.rounding == "stochastic" else 1 / 12
        errors = [[sq * share / (2**k - 1) ** 2 for k in BAND_BITS[1:]] for _, sq in stats]
        costs = [[float(k * w) for k in BAND_BITS[1:]] for w in widths]
        if self.budget == "payload":  # in bits a line, the unit of the budget bits * n
            costs = [[self._band_bits_cost(rows, w, k, work) / rows for k in BAND_BITS[1:]] for w in widths]
        on_levels = [[False] * (len(BAND_BITS) - 1) for _ in widths]
        for i, w in enumerate(widths if fitted is not None else []):
            for j, k in enumerate(BAND_BITS[1:]):
                if k in LEVEL_BITS and fitted[i][LEVEL_BITS.index(k)] < errors[i][j]:
                    errors[i][j] = fitted[i][LEVEL_BITS.index(k)]
                    on_levels[i][j] = True
                    if self.budget == "payload":
                        costs[i][j] = levels_cost_bits(rows * w, self._group(rows, w), k) / rows
        band_bits = allocate_bits(energy, widths, self.bits, errors, costs, self.min_bands)
        left = math.fsum(w * (e if k == 0 else err[BAND_BITS.index(k) - 1])
                         for w, e, err, k in zip(widths, energy, errors, band_bits))
        return band_bits, left, on_levels

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        lines, axis = self._lines(x, name)
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        c = self._forward(lines.to(work))
        rows, n = c.shape
        cuts = self._cuts(n)
        parts = [self._band_stats(self._laid_out(c, a, b), self._group(rows, b - a))
                 for edges in cuts for a, b in zip(edges, edges[1:])]
        stacked = torch.stack(parts)
        if self.levels == "fitted":  # each coefficient's error on the levels, in the same sync
            stacked = torch.cat([stacked.reshape(-1), column_errors(c).reshape(-1)])
        flat = stacked.reshape(-1).tolist()  # one sync for every decomposition
        flat_stats = [flat[2 * i:2 * i + 2] for i in range(len(parts))]
        columns = [flat[2 * len(parts) + j * n:2 * len(parts) + (j + 1) * n] for j in range(len(LEVEL_BITS))]
        if not all(math.isfinite(e) and math.isfinite(sq) for e, sq in flat_stats):
            raise ConfigError(f"dct: {name} has inf or NaN values")
        best = None
        for edges in cuts:
            stats, flat_stats = flat_stats[:len(edges) - 1], flat_stats[len(edges) - 1:]
            widths = [b - a for a, b in zip(edges, edges[1:])]
            fitted = None if self.levels != "fitted" else [
                [math.fsum(col[a:b]) / (rows * (b - a)) for col in columns] for a, b in zip(edges, edges[1:])]
            band_bits, left, on_levels = self._allocate(stats, widths, rows, work, fitted)
            # a cut that sends nothing loses to one that sends its forced lowest band (least_bytes' promise)
            key = (self.min_bands > 0 and not any(band_bits), left)
            if best is None or key < best[0]:
                best = (key, edges, widths, [e for e, _ in stats], band_bits, on_levels)
        _, edges, widths, energy, band_bits, on_levels = best
        seed = (0 if self.seed is None else self.seed) * 1_000_003 + self._encodes
        self._encodes += 1
        buffers, metas = {}, []
        for i, (a, b, k) in enumerate(zip(edges, edges[1:], band_bits)):
            if k == 0:
                metas.append(None)
                continue
            band = self._laid_out(c, a, b).contiguous()
            if on_levels[i][BAND_BITS.index(k) - 1]:
                group = self._group(rows, b - a)
                codes, scales = encode_levels(band, k, group)
                buffers.update({f"b{i}_codes": codes, f"b{i}_scales": scales})
                metas.append({"levels": k, "group": group})
                continue
            q = QuantCodec(bits=k, group_size=self._group(rows, b - a), rounding=self.rounding, seed=seed + i,
                           kernel="torch")  # fmt: skip
            p = q.encode(band, name=f"{name} band {i}")
            buffers.update({f"b{i}_{key}": t for key, t in p.buffers.items()})
            metas.append((q.options(), p.meta))
        dropped = math.fsum(e * w for e, w, k in zip(energy, widths, band_bits) if k == 0) * rows
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers,
                       meta={"axis": axis, "dims": self.dims, "edges": edges, "band_bits": band_bits, "bands": metas,
                             "lines_shape": tuple(lines.shape), "work": work, "dropped_energy": dropped,
                             "group_by": self.group_by})

    def side_info(self, payload: Payload) -> list[int]:
        """What a receiver that has this codec (the same options) and knows the tensor's shape and dtype needs,
        besides the payload's buffers, to decode it (:meth:`rebuild`): the decomposition kept (its index among
        those tried), then one code a band: 0 (not sent), its bits on the min-max grid, or 16 plus its bits on
        the fitted levels. One byte each, at most :meth:`side_bytes`."""
        m = self._own(payload).meta
        cut = next(i for i, e in enumerate(self._cuts(m["edges"][-1])) if e == list(m["edges"]))
        return [cut, *(0 if band is None else 16 + k if isinstance(band, dict) else k
                       for k, band in zip(m["band_bits"], m["bands"]))]

    def side_bytes(self, shape: tuple[int, ...]) -> int:
        """The most bytes :meth:`side_info` takes for a tensor of ``shape``: one, and one a band of the finest
        decomposition tried."""
        lines, _ = self._lines(torch.empty(shape, device="meta"), "tensor")
        return len(self._cuts(math.prod(lines.shape[-self.dims:]))[-1])

    def rebuild(self, side, buffers: dict, shape: tuple[int, ...], dtype: torch.dtype, device) -> Payload:
        """The payload of ``buffers`` and their :meth:`side_info` (a sequence of ints or a uint8 tensor) for a
        tensor of ``shape`` and ``dtype``: what :meth:`encode` made, to :meth:`decode` (``dropped_energy`` is not
        sent: ``None``); trailing zeros past the bands (a side padded to :meth:`side_bytes`) are ignored. Side
        information that does not fit this codec and shape is an error."""
        lines, axis = self._lines(torch.empty(shape, dtype=dtype, device="meta"), "tensor")
        work = torch.float64 if dtype == torch.float64 else torch.float32
        rows, n = math.prod(lines.shape[:-self.dims]), math.prod(lines.shape[-self.dims:])
        cuts = self._cuts(n)
        side = [int(v) for v in (side.tolist() if isinstance(side, torch.Tensor) else side)]
        used = len(cuts[side[0]]) if side and 0 <= side[0] < len(cuts) else 0
        side, padding = side[:used], side[used:]
        codes = [c - 16 if c >= 16 else c for c in side[1:]]
        if (not used or len(side) < used or any(padding) or any(k not in BAND_BITS for k in codes)
                or any(c >= 16 and (self.levels != "fitted" or c - 16 not in LEVEL_BITS) for c in side[1:])):
            raise ConfigError(f"dct: side information {side} does not fit this codec and a tensor of shape "
                              f"{tuple(shape)} (decompositions of {[len(c) - 1 for c in cuts]} bands)")
        edges, metas = cuts[side[0]], []
        for a, b, code in zip(edges, edges[1:], side[1:]):
            if code == 0:
                metas.append(None)
                continue
            group = self._group(rows, b - a)
            if code >= 16:
                metas.append({"levels": code - 16, "group": group})
                continue
            q = QuantCodec(bits=code, group_size=group, rounding=self.rounding, kernel="torch")
            band = torch.empty((b - a, rows) if self.group_by == "coefficient" else (rows, b - a), dtype=work,
                               device="meta")
            metas.append((q.options(), q.payload_layout(band)[1]))
        return Payload(self.name, torch.Size(shape), dtype, torch.device(device), buffers=dict(buffers),
                       meta={"axis": axis, "dims": self.dims, "edges": edges, "band_bits": codes, "bands": metas,
                             "lines_shape": tuple(lines.shape), "work": work, "dropped_energy": None,
                             "group_by": self.group_by})

    def to_wire(self, payload: Payload) -> torch.Tensor:
        """The payload as one uint8 tensor: its side information padded to :meth:`side_bytes`, then its buffers'
        bytes in order. :meth:`from_wire` reads it back; ``side_bytes + payload.nbytes`` bytes in all."""
        p = self._own(payload)
        side = self.side_info(p)
        side += [0] * (self.side_bytes(tuple(p.shape)) - len(side))
        return torch.cat([torch.tensor(side, dtype=torch.uint8, device=p.device),
                          *(b.reshape(-1).view(torch.uint8) for b in p.buffers.values())])

    def from_wire(self, wire: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device) -> Payload:
        """The payload :meth:`to_wire` made of a tensor of ``shape`` and ``dtype``: the side information read and
        each buffer cut from the bytes after it at the size its band's coder gives it (a wire of another
        length is an error)."""
        k = self.side_bytes(tuple(shape))
        p = self.rebuild(wire[:k], {}, shape, dtype, device)
        m, at = p.meta, k
        rows = math.prod(m["lines_shape"][:-self.dims])
        for i, (a, b, band) in enumerate(zip(m["edges"], m["edges"][1:], m["bands"])):
            n = rows * (b - a)
            if band is None:
                continue
            if isinstance(band, dict):  # fitted levels: packed indices, a float32 scale a group
                sizes = [("codes", torch.uint8, -(-n * band["levels"] // 8)),
                         ("scales", torch.float32, -(-n // band["group"]))]
            else:  # the quant codec's min-max groups: codes with their padding, a minimum and a span a group
                g, bits = band[0]["group_size"], band[0]["bits"]
                groups = -(-n // g)
                sizes = [("codes", torch.uint8, -(-groups * g * bits // 8)), ("lo", m["work"], groups),
                         ("span", m["work"], groups)]
            for name, dt, count in sizes:
                nbytes = count * dt.itemsize
                if at + nbytes > wire.numel():
                    break
                p.buffers[f"b{i}_{name}"] = wire[at:at + nbytes].clone().view(dt).to(device)
                at += nbytes
        if at != wire.numel() or len(p.buffers) != sum(0 if band is None else 2 if isinstance(band, dict) else 3
                                                       for band in m["bands"]):
            raise ConfigError(f"dct: a wire form of {wire.numel()} bytes does not hold the buffers its side "
                              f"information names for a tensor of shape {tuple(shape)}")
        return p

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        m = p.meta
        dims = m.get("dims", 1)
        rows = math.prod(m["lines_shape"][:-dims])
        c = torch.zeros(rows, math.prod(m["lines_shape"][-dims:]), dtype=m["work"], device=p.device)
        for i, (a, b, band) in enumerate(zip(m["edges"], m["edges"][1:], m["bands"])):
            if band is None:
                continue
            by_coefficient = m.get("group_by") == "coefficient"
            shape = torch.Size((b - a, rows) if by_coefficient else (rows, b - a))
            if isinstance(band, dict):  # fitted levels
                band = decode_levels(p.buffers[f"b{i}_codes"], p.buffers[f"b{i}_scales"], shape.numel(),
                                     band["levels"], band["group"], m["work"]).reshape(shape)
            else:
                options, meta = band
                q = QuantCodec(**options)
                bufs = {key.split("_", 1)[1]: t for key, t in p.buffers.items() if key.startswith(f"b{i}_")}
                band = q.decode(Payload(q.name, shape, m["work"], p.device, buffers=bufs, meta=meta))
            c[:, a:b] = band.t() if by_coefficient else band
        lines = self._inverse(c, m["lines_shape"], dims)
        return (lines if dims == 2 else lines.movedim(-1, m["axis"])).to(p.dtype).contiguous()
