"""Per-group integer quantization (``quant``), lossy. What it shares with ``fp8`` (memory order, padding,
non-finite input, the two implementations) is in :mod:`actzip.codecs.lossy`.

Format (``L = 2**bits - 1``):

- ``codes``: one ``bits``-wide code per element (padding included), packed densely into uint8, little-endian
  as in :mod:`actzip.codecs.bitpack`: code ``i`` is bits ``[k, k + bits)`` of byte ``bits*i // 8``,
  ``k = bits*i % 8``;
- ``scale="minmax"``: ``lo`` (group minimum) and ``span`` (maximum - minimum) per group; element
  ``lo + span * (q * (1/L))``, step ``s = span / L``;
- ``scale="absmax"``: ``absmax`` per group, codes offset by ``Q = 2**(bits-1) - 1``; element
  ``absmax * ((q - Q) * (1/Q))``, step ``s = absmax / Q``, codes in ``[0, 2Q]``.

``1/L`` and ``1/Q`` are the working precision's rounded reciprocals (one multiplication per element, no
division); ``L * (1/L)`` rounds to exactly 1 for every ``L`` here, so storing the span / absmax rather than the
step makes a group's minimum (minmax) or its largest-magnitude elements (absmax) decode exactly (their code
fraction is exactly 0 or +-1), a constant group decode exactly to its constant, and the top code decode to
``lo + span``. Encoding divides once per group: ``v = (x - lo) * (L / span)`` (or ``x * (Q / absmax)``), in
steps, then rounds ``v`` to a code. A span (absmax) below ``2**-64`` first scales ``x - lo`` (``x``) and itself
by ``2**64``, exactly, so that the factor stays finite.

Stochastic rounding (random integers ``r`` of :mod:`actzip.codecs.counter_rng`) rounds ``v`` (plus ``Q`` for
absmax) to 15 fractional bits (``v + 256`` in float32, half to even; float64: half up), then up iff ``r`` plus
that fraction reaches ``2**15``: ``P(round up)`` is the fraction to within ``2**-16``, so the rounding is
unbiased up to ``2**-16`` of a step per element. The Triton kernels are :mod:`actzip.kernels.quant`.
"""

from __future__ import annotations

import torch

from actzip import compat
from actzip.codecs import counter_rng, fp8, lossy
from actzip.core import dtypes
from actzip.codecs.bitpack import pack_bits, unpack_bits
from actzip.codecs.counter_rng import round_bits_like
from actzip.codecs.step_noise import current_offset
from actzip.codecs.lossy import DEFAULT_GROUP_SIZE, KERNEL_MAX_GROUP, LossyCodec, group_rows
from actzip.core.checks import check_choice, check_group_size
from actzip.core.dtypes import work_dtype
from actzip.core.layout import memory_order, memory_rows, restore_order
from actzip.core.payload import Payload
from actzip.core.registry import register_codec
from actzip.errors import ConfigError

__all__ = ["QUANT_BITS", "QUANT_SCALES", "QuantCodec"]

QUANT_BITS = (1, 2, 4, 8)
QUANT_SCALES = ("minmax", "absmax")

# Names this module held before the fp8 codec, the shared lossy base and the random stream got their own
# modules: still importable from here for one release, with a warning.
_MOVED = {
    **{name: fp8 for name in ("FP8Codec", "FP8_FORMATS", "GRANULARITIES")},
    **{name: lossy for name in ("ROUNDINGS", "KERNEL_DTYPES")},
    "LOSSY_DTYPES": dtypes,
    **{name: counter_rng for name in ("HASH_M1", "HASH_M2", "stream_keys", "mix32", "hash_uniform", "pair_hash",
                                      "round_bits")},
}


def __getattr__(name: str):
    if name in _MOVED:
        home = _MOVED[name]
        compat.warn_once(f"{__name__}.{name}", f"{home.__name__}.{name}")
        return getattr(home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _reciprocal(k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``1 / k`` correctly rounded in ``dtype``, as a 0-dim tensor (a tensor division: PyTorch on CUDA turns a
    division by a Python number into a multiplication by its reciprocal)."""
    return torch.ones((), dtype=dtype, device=device).div_(torch.full((), k, dtype=dtype, device=device))



@register_codec("quant")
class QuantCodec(LossyCodec):
    """Per-group ``bits``-bit quantization. See the module docstring for the format.

    Options:
      bits: 1, 2, 4 or 8 bits per element.
      group_size: elements per group (a positive multiple of 8); each group costs 8 bytes of ``lo`` and
        ``span`` (minmax) or 4 of ``absmax`` (float64 tensors: twice that).
      scale: ``"minmax"`` (asymmetric: the group's range is split into ``2**bits - 1`` steps) or ``"absmax"``
        (symmetric around 0, ``2**(bits-1) - 1`` steps per sign; zero is exact; needs ``bits >= 2``).
      rounding: ``"stochastic"`` (unbiased: ``E[decode(encode(x))] == x``) or ``"nearest"`` (half to even).
      seed: seed of the stochastic rounding's random streams (``None`` means 0).
      check: raise :class:`InvalidValueError` on inf/NaN (one host sync); without it such groups decode to NaN.
      kernel: ``"auto"`` (default: the Triton kernels on CUDA tensors, the PyTorch code otherwise, a fallback on
        CUDA announced once and counted in ``actzip.kernels.runtime.fallback_counts()``), ``"torch"`` or
        ``"triton"`` (raises :class:`~actzip.errors.KernelUnavailableError` where the kernels cannot
        run). Both make identical payloads. The kernels take float32, float16 and bfloat16 tensors and groups
        of at most :data:`KERNEL_MAX_GROUP` elements; with ``check=False`` they encode and decode without any
        host synchronization.

    Guarantee, elementwise, with ``s`` the group's step (``span / L`` or ``absmax / Q``):
    ``|decode(encode(x)) - x| < s`` with stochastic rounding and ``<= s / 2`` with nearest rounding, in exact
    arithmetic. The working precision adds a few of its ulps of the group's absmax (the rounded factor
    ``L / span`` and products on encode, the rounded ``1/L`` and products on decode: a few ``2**-24`` relative,
    so ``v`` may land a hair beyond ``L`` or ``+-Q`` before rounding; codes are clamped to their range), and
    float16/bfloat16 results are rounded to their dtype (half an ulp of the decoded value more). Stochastic
    rounding is unbiased up to the same roundings and up to ``2**-16`` of a step (its random numbers have 15
    bits: ``|P(round up) - frac| <= 2**-16``). A group's minimum (minmax), its largest-magnitude elements
    (absmax) and every element of a constant group decode exactly.
    """

    follows_step_noise = True  # encode reads actzip.codecs.step_noise.current_offset

    def __init__(
        self,
        *,
        bits: int = 4,
        group_size: int = DEFAULT_GROUP_SIZE,
        scale: str = "minmax",
        rounding: str = "stochastic",
        seed: int | None = None,
        check: bool = True,
        kernel: str = "auto",
    ) -> None:
        check_choice("quant", "bits", bits, QUANT_BITS)
        check_group_size("quant", group_size)
        check_choice("quant", "scale", scale, QUANT_SCALES)
        if scale == "absmax" and bits == 1:
            raise ConfigError(
                "quant: scale='absmax' needs bits >= 2: one bit leaves no code for zero and only one step per "
                "sign; use scale='minmax' with bits=1"
            )
        self._init_common(rounding, seed, check, kernel)
        if kernel == "triton" and group_size > KERNEL_MAX_GROUP:
            raise ConfigError(f"quant(kernel='triton'): option group_size must be at most {KERNEL_MAX_GROUP}")
        self.bits = bits
        self.group_size = group_size
        self.scale = scale

    def options(self) -> dict:
        return {
            "bits": self.bits,
            "group_size": self.group_size,
            "scale": self.scale,
            "rounding": self.rounding,
            "seed": self.seed,
            "check": self.check_values,
            "kernel": self.kernel,
        }

    def _round(self, v: torch.Tensor, off: int, keys: tuple[int, int]) -> torch.Tensor:
        """``v + off`` (``v`` a fresh tensor in ``[-off, TOP]`` up to roundings, modified in place) rounded to
        int64, to nearest (half to even) or stochastically."""
        if self.rounding == "nearest":
            return v.round_().to(torch.int64).add_(off)
        # v + off + 256 lies in [256, 512), where float32 counts steps of 2**-15 (float64: 2**-44, rounded to
        # 2**-15 here): its bits minus 256's are (v + off) * 2**15 rounded. Adding 15 random bits carries into
        # the integer part with probability the fraction: P(round up) = frac to within 2**-16.
        t = v.add_(256 + off)
        if t.dtype == torch.float32:
            fixed = t.view(torch.int32).to(torch.int64).sub_(0x43800000)
        else:
            fixed = t.view(torch.int64).sub_(0x4070000000000000 - (1 << 28)).bitwise_right_shift_(29)
        return fixed.add_(round_bits_like(v, keys)).bitwise_right_shift_(15)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        keys = self._next_keys()
        # a captured CUDA graph's step offset (actzip.codecs.step_noise), where one is active
        noise = current_offset(x.device) if self.rounding == "stochastic" else None
        what = f"quant(scale={self.scale!r})"
        if self.uses_triton(x.device, x.dtype, self.group_size):
            from actzip.kernels import quant as quant_kernels

            # A view with gaps made of whole groups' rows (attention's q, k, v) is read in place, not copied.
            flat, perm = memory_rows(x, self.group_size) or memory_order(x)
            buffers = quant_kernels.quant_encode(
                flat, self.bits, self.group_size, self.scale == "absmax", self.rounding == "stochastic", keys,
                noise=noise,
            )
            if self.check_values:  # the kernels mark a non-finite group's parameters NaN
                self._refuse_non_finite(~torch.isfinite(buffers["span" if "span" in buffers else "absmax"]),
                                        flat, name, what)  # fmt: skip
        else:
            flat, perm = memory_order(x)
            if noise is not None:  # the first key moved by the offset on the device, modulo 2**32
                keys = ((noise[0].to(torch.int64) + keys[0]) & 0xFFFFFFFF, keys[1])
            buffers = self._encode_torch(flat, keys, name, what)
        return self._payload(x, perm, buffers)

    def _meta(self, x: torch.Tensor) -> dict:
        return {"bits": self.bits, "group_size": self.group_size, "scale": self.scale}

    def buffer_names(self) -> tuple[str, ...]:
        return ("codes", "lo", "span") if self.scale == "minmax" else ("codes", "absmax")

    def _encode_torch(self, flat: torch.Tensor, keys: tuple[int, int], name: str, what: str) -> dict:
        groups = group_rows(flat, self.group_size, work_dtype(flat.dtype))
        lo, hi = torch.aminmax(groups, dim=1)
        lo.add_(0.0)  # -0.0 becomes +0.0: stored parameters do not depend on how the minimum was found
        if self.scale == "minmax":
            param = (hi - lo).add_(0.0)  # the span; NaN or inf when the group holds inf/NaN or its range overflows
            top = (1 << self.bits) - 1
        else:
            param = torch.maximum(hi, -lo).add_(0.0)  # the absmax; NaN propagates through maximum
            top = (1 << (self.bits - 1)) - 1
        ok = torch.isfinite(param)
        if self.check_values:
            self._refuse_non_finite(~ok, flat, name, what)
        safe = torch.where(param > 0, param, 1)  # constant groups: every v is 0 (minmax) or +-Q
        # One division per group, then multiplications: v = (x - lo) * (top / span) or x * (top / absmax).
        # A span below 2**-64 scales everything by 2**64 first (exactly), so that top / span stays finite.
        pre = torch.where(safe < 2.0**-64, 2.0**64, 1.0).to(safe.dtype)
        factor = torch.full_like(safe, top).div_(safe * pre).unsqueeze(1)
        v = groups * pre.unsqueeze(1)
        if self.scale == "minmax":
            v.sub_((lo * pre).unsqueeze(1))  # exactly (x - lo) * pre rounded, as the kernels' fma
            off = 0
        else:
            off = top  # round, then offset: half-to-even stays symmetric
        q = self._round(v.mul_(factor), off, keys).clamp_(0, top + off)
        if not self.check_values:  # a non-finite group: zero codes (deterministic), NaN parameters
            q = torch.where(ok.unsqueeze(1), q, 0)
            param = torch.where(ok, param, torch.nan)
            lo = torch.where(ok, lo, torch.nan)
        buffers = {"codes": pack_bits(q.to(torch.uint8), self.bits)}
        if self.scale == "minmax":
            buffers["lo"] = lo
            buffers["span"] = param
        else:
            buffers["absmax"] = param
        return buffers

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        bits, group_size, scale = p.meta["bits"], p.meta["group_size"], p.meta["scale"]
        n = p.shape.numel()
        if self.uses_triton(p.device, p.dtype, group_size):
            from actzip.kernels import quant as quant_kernels

            b = p.buffers
            params = (b["absmax"], None) if scale == "absmax" else (b["lo"], b["span"])
            flat = quant_kernels.quant_decode(b["codes"], *params, n, p.dtype, bits, group_size, scale == "absmax")
        else:
            flat = self._decode_torch(p, bits, group_size, scale)[:n].to(p.dtype)
        return restore_order(flat, p.shape, p.meta["perm"])

    @staticmethod
    def _decode_torch(p: Payload, bits: int, group_size: int, scale: str) -> torch.Tensor:
        work = work_dtype(p.dtype)
        codes = p.buffers["codes"]
        q = unpack_bits(codes, codes.numel() * 8 // bits, bits, torch.uint8).view(-1, group_size).to(work)
        # q * fl(1 / top), no division per element: fl(top * fl(1 / top)) == 1 for every top here, so the top
        # code gives lo + span and +-Q gives +-absmax exactly. No fused multiply-add.
        if scale == "minmax":
            recip = _reciprocal((1 << bits) - 1, work, q.device)
            y = q.mul_(recip).mul_(p.buffers["span"].unsqueeze(1)).add_(p.buffers["lo"].unsqueeze(1))
        else:
            top = (1 << (bits - 1)) - 1
            y = q.sub_(top).mul_(_reciprocal(top, work, q.device)).mul_(p.buffers["absmax"].unsqueeze(1))
        return y.reshape(-1)
