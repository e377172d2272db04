"""Scaled 8-bit floats (``fp8``), lossy. What it shares with ``quant`` (memory order, padding, non-finite
input, the two implementations) is in :mod:`actzip.codecs.lossy`.

Format: ``codes``, the raw bytes of ``x / scale`` in ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``, and
``scale`` per group (or one for the tensor). The scale is the smallest power of two that brings the absmax
within the format's largest finite value, so dividing and multiplying by it are exact: the only rounding is
the cast to 8 bits, an fp8-representable tensor times any power of two round-trips bit-exactly, and stochastic
rounding is unbiased without a scaling error. The absmax lands in ``(max/2, max]``.

Stochastic rounding (random integers ``r`` of :mod:`actzip.codecs.counter_rng`) rounds up iff
``(r + 1/2) / 2**15`` is below the exact fraction of the gap to the next fp8 value: ``P(round up)`` is the
fraction to within ``2**-16``. The Triton kernels are :mod:`actzip.kernels.fp8`.
"""

from __future__ import annotations

import math

import torch

from actzip.codecs.counter_rng import round_bits_like
from actzip.codecs.lossy import DEFAULT_GROUP_SIZE, KERNEL_MAX_GROUP, LossyCodec, group_rows
from actzip.core.checks import check_choice, check_group_size
from actzip.core.dtypes import work_dtype
from actzip.core.layout import memory_order, restore_order
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError

__all__ = ["FP8_FORMATS", "FP8Codec", "GRANULARITIES"]

FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
GRANULARITIES = ("tensor", "group")


@register_codec("fp8")
class FP8Codec(LossyCodec):
    """Scaled 8-bit floats. See the module docstring for the format.

    Options:
      format: ``"e4m3"`` (``torch.float8_e4m3fn``: 3 mantissa bits, max 448) or ``"e5m2"``
        (``torch.float8_e5m2``: 2 mantissa bits, max 57344, wider range).
      granularity: ``"tensor"`` (one scale) or ``"group"`` (one per ``group_size`` elements).
      group_size: elements per group with ``granularity="group"`` (a positive multiple of 8).
      rounding: ``"nearest"`` (the cast's round half to even) or ``"stochastic"`` (one of the two neighbouring
        fp8 values, chosen so that ``E[decode(encode(x))] == x`` to within ``2**-16`` of their gap).
      seed, check, kernel: as for ``quant`` (the kernels take groups of at most :data:`KERNEL_MAX_GROUP`
        elements, and one scale per tensor of any size).

    Payload: 1 byte per element (padding to whole groups included) plus a float32 scale (float64 for float64
    tensors) per group. Guarantee: each element's error is at most half (nearest) or one (stochastic) fp8 ulp
    at its scaled magnitude, so at most ``absmax * 2**-(m+1)`` (``2**-m`` stochastic), ``m`` the mantissa bits
    and ``absmax`` that of its group; plus the rounding of the result to ``x``'s dtype, which only happens in
    that dtype's subnormal range. Results beyond the dtype's largest value (an absmax there may round up) are
    clamped to it.
    """

    def __init__(
        self,
        *,
        format: str = "e4m3",
        granularity: str = "tensor",
        group_size: int = DEFAULT_GROUP_SIZE,
        rounding: str = "nearest",
        seed: int | None = None,
        check: bool = True,
        kernel: str = "auto",
    ) -> None:
        check_choice("fp8", "format", format, tuple(FP8_FORMATS))
        check_choice("fp8", "granularity", granularity, GRANULARITIES)
        check_group_size("fp8", group_size)
        self._init_common(rounding, seed, check, kernel)
        if kernel == "triton" and granularity == "group" and group_size > KERNEL_MAX_GROUP:
            raise ConfigError(f"fp8(kernel='triton'): option group_size must be at most {KERNEL_MAX_GROUP}")
        self.format = format
        self.granularity = granularity
        self.group_size = group_size

    def options(self) -> dict:
        return {
            "format": self.format,
            "granularity": self.granularity,
            "group_size": self.group_size,
            "rounding": self.rounding,
            "seed": self.seed,
            "check": self.check_values,
            "kernel": self.kernel,
        }

    @staticmethod
    def _scales(absmax: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
        """The smallest power of two ``p`` with ``absmax / p <= fp8 max`` (1 for 0), exactly, via frexp."""
        top_m, top_e = math.frexp(torch.finfo(fp8).max)  # 448 = 0.875 * 2**9
        m, _ = torch.frexp(absmax)
        # absmax = m * 2**e, so this is 2**(e - top_e) (or twice that) exactly: a correctly rounded division
        # (no pow, whose accuracy varies by device), and no intermediate 2**e that could overflow.
        scale = absmax / m.mul_(torch.where(m > top_m, 2.0 ** (top_e - 1), 2.0**top_e).to(absmax.dtype))
        # An underflowed scale becomes the smallest subnormal: a bigger scale only shrinks absmax / p.
        scale.clamp_(min=torch.finfo(absmax.dtype).smallest_normal * torch.finfo(absmax.dtype).eps)
        return torch.where(absmax > 0, scale, 1.0)

    @staticmethod
    def _stochastic(t: torch.Tensor, fp8: torch.dtype, r: torch.Tensor) -> torch.Tensor:
        """Bytes of ``t`` rounded to a neighbouring fp8 value: up iff ``(r + 1/2) / 2**15 < frac``, ``r`` the
        15-bit random integers (one per element), ``frac = (|t| - lower) / gap`` exactly, so
        P(round up) = frac to within 2**-16."""
        mag = t.abs()
        near = mag.to(fp8).view(torch.uint8)  # a neighbour of |t| (rounded to nearest)
        lower = near - (near.view(fp8).to(t.dtype) > mag).to(torch.uint8)  # step 1 ulp down if it was above
        lower_v = lower.view(fp8).to(t.dtype)
        upper = lower + (lower_v < mag).to(torch.uint8)  # positive patterns are ordered like their values
        gap = upper.view(fp8).to(t.dtype) - lower_v
        frac = (mag - lower_v).div_(torch.where(gap > 0, gap, 1))
        u = r.to(t.dtype).add_(0.5).mul_(2.0**-15)
        bits = lower + (u < frac).to(torch.uint8)
        return bits | (torch.signbit(t).to(torch.uint8) << 7)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        flat, perm = memory_order(x)
        keys = self._next_keys()
        per_group = self.granularity == "group"
        group_size = self._meta(x)["group_size"]
        what = f"fp8(format={self.format!r})"
        if self.uses_triton(x.device, x.dtype, self.group_size if per_group else None):
            from actzip.kernels import fp8 as fp8_kernels

            codes, scale = fp8_kernels.fp8_encode(
                flat, self.format, self.group_size if per_group else None, self.rounding == "stochastic", keys
            )
            if self.check_values:  # the kernels mark a non-finite group's scale NaN
                self._refuse_non_finite(~torch.isfinite(scale), flat, name, what)
        else:
            codes, scale = self._encode_torch(flat, group_size, keys, name, what)
        buffers = {"codes": codes, "scale": scale}
        return self._payload(x, perm, buffers)

    def _meta(self, x: torch.Tensor) -> dict:
        per_group = self.granularity == "group"
        return {"format": self.format, "group_size": self.group_size if per_group else max(x.numel(), 1)}

    def buffer_names(self) -> tuple[str, ...]:
        return ("codes", "scale")

    def _encode_torch(self, flat, group_size: int, keys, name: str, what: str):
        fp8 = FP8_FORMATS[self.format]
        groups = group_rows(flat, group_size, work_dtype(flat.dtype))
        lo, hi = torch.aminmax(groups, dim=1)  # no |x| temporary; NaN propagates through both
        absmax = torch.maximum(hi, -lo)
        ok = torch.isfinite(absmax)
        if self.check_values:
            self._refuse_non_finite(~ok, flat, name, what)
        scale = self._scales(torch.where(ok, absmax, 0), fp8)
        t = groups / scale.unsqueeze(1)  # exact: a power of two, and |t| <= fp8 max
        if self.rounding == "nearest":
            codes = t.to(fp8).view(torch.uint8)
        else:
            codes = self._stochastic(t, fp8, round_bits_like(t, keys))
        if not self.check_values:  # a non-finite group: zero codes (deterministic), a NaN scale
            codes = torch.where(ok.unsqueeze(1), codes, 0)
            scale = torch.where(ok, scale, torch.nan)
        return codes.reshape(-1), scale

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        n, group_size = p.shape.numel(), p.meta["group_size"]
        per_group = p.buffers["scale"].numel() > 1  # one group decodes like one scale per tensor
        if self.uses_triton(p.device, p.dtype, group_size if per_group else None):
            from actzip.kernels import fp8 as fp8_kernels

            b = p.buffers
            flat = fp8_kernels.fp8_decode(b["codes"], b["scale"], n, p.dtype, p.meta["format"],
                                          group_size if per_group else None)  # fmt: skip
            return restore_order(flat, p.shape, p.meta["perm"])
        fp8 = FP8_FORMATS[p.meta["format"]]
        work = work_dtype(p.dtype)
        q = p.buffers["codes"].view(fp8).to(work).view(-1, group_size)
        y = q.mul_(p.buffers["scale"].unsqueeze(1)).reshape(-1)[:n]
        big = torch.finfo(p.dtype).max  # a rounded-up absmax near the dtype's limit must not become inf
        return restore_order(y.clamp_(-big, big).to(p.dtype), p.shape, p.meta["perm"])
