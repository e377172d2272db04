"""Lossy codecs: per-group integer quantization (``quant``) and scaled 8-bit floats (``fp8``).

Both work over the tensor's elements in memory order (so a transposed or channels-last tensor is grouped the
way it lies in memory, and comes back with its strides; a view with gaps is taken in its order of strides and
comes back dense in that order: copied, or read in place by the Triton kernels when it is rows of whole groups,
like attention's q, k and v cut from one projection), split into groups of ``group_size`` elements; the last
group is padded by repeating the last element, which leaves its range unchanged. Arithmetic runs in float32
(float64 for float64 tensors) and per-group parameters are stored in that precision.

``quant`` format (``L = 2**bits - 1``):

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

``fp8`` format: ``codes``, the raw bytes of ``x / scale`` in ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``,
and ``scale`` per group (or one for the tensor). The scale is the smallest power of two that brings the
absmax within the format's largest finite value, so dividing and multiplying by it are exact: the only
rounding is the cast to 8 bits, an fp8-representable tensor times any power of two round-trips bit-exactly,
and stochastic rounding is unbiased without a scaling error. The absmax lands in ``(max/2, max]``.

Non-finite input: with ``check=True`` (default) encoding a tensor with inf or NaN raises
:class:`InvalidValueError` (one host sync per encode, to read the count). With ``check=False`` nothing is
synchronized and every group holding a non-finite value decodes to NaN in all its elements: never to finite
numbers. ``quant(scale="minmax")`` also needs ``max - min`` of each group to be finite in the working
precision (values below half the largest float32, or float64, in magnitude always are); a group that
overflows is refused, or becomes NaN, the same way.

Stochastic rounding draws its random numbers from a counter-based generator, the same in the PyTorch code and
in the Triton kernels (:mod:`actzip.kernels.quant_triton`, :mod:`actzip.kernels.fp8_triton`), so both make
identical payloads. Elements ``2p`` and ``2p + 1`` (indices in the padded group layout: group ``g``, position
``j``, ``i = g * group_size + j``) share one 32-bit hash ``h = pair_hash(lo32(p + k0), k1 ^ mix32(hi32(p)))``
(:func:`pair_hash`, :func:`mix32`) and take its bits 17-31 and 0-14 as 15-bit integers ``r`` (:func:`round_bits`), where
``(k0, k1)`` are two 32-bit keys that :func:`stream_keys` derives on the host from ``(seed, n)`` for the
codec's ``n``-th stochastic encode (``seed=None`` means 0). ``quant`` rounds ``v`` (plus ``Q`` for absmax) to
15 fractional bits (``v + 256`` in float32, half to even; float64: half up), then up iff ``r`` plus that
fraction reaches ``2**15``; ``fp8`` rounds up iff ``(r + 1/2) / 2**15`` is below the exact fraction of the gap
to the next fp8 value. Either way ``P(round up)`` is the fraction to within ``2**-16``: stochastic rounding is
unbiased up to ``2**-16`` of a step (gap) per element. No device RNG is used, no host synchronization is
needed, and the global RNG is never touched, so compressing activations does not change a training run's
randomness. A payload is reproducible for the same seed and call order, on any device.

Implementations (option ``kernel``, as for the sparse codec): the PyTorch code in this module, which is the
reference, and the Triton kernels, which make identical buffers for float32, float16 and bfloat16 tensors
with groups of at most :data:`KERNEL_MAX_GROUP` elements. Both compute every step in the same IEEE float32
operations (a division by a tensor, never by a Python number, which PyTorch on CUDA replaces by a
multiplication with the reciprocal; no fused multiply-add), mirror each integer step, store a +0.0 for a -0.0
group parameter, and write zero codes and NaN parameters for the groups of a non-finite input.
"""

from __future__ import annotations

import math

import torch

from actzip.codecs.base import Codec
from actzip.codecs.bitpack import pack_bits, unpack_bits
from actzip.codecs.sparse import KERNELS, memory_order, memory_rows, restore_order
from actzip.errors import ConfigError, InvalidValueError
from actzip.core.payload import Payload
from actzip.core.registry import register_codec

LOSSY_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
QUANT_BITS = (1, 2, 4, 8)
QUANT_SCALES = ("minmax", "absmax")
ROUNDINGS = ("stochastic", "nearest")
FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
GRANULARITIES = ("tensor", "group")
DEFAULT_GROUP_SIZE = 128
KERNEL_MAX_GROUP = 4096  # largest group the Triton kernels take (one group must fit one program's registers)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # dtypes the Triton kernels take

# -- the counter-based generator of stochastic rounding (the Triton kernels compute the same numbers) --------

HASH_M1, HASH_M2 = 0x21F0AAAD, 0x735A2D97  # multipliers of mix32 (both below 2**31: no int64 overflow here)
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1


def stream_keys(seed: int, count: int) -> tuple[int, int]:
    """The two 32-bit keys of the ``count``-th stochastic encode of a codec seeded with ``seed`` (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + count + 1) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return z & _M32, z >> 32


def mix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply, two rounds), in place on an int64 tensor of values < 2**32."""
    h ^= h >> 16
    h.mul_(HASH_M1).bitwise_and_(_M32)
    h ^= h >> 15
    h.mul_(HASH_M2).bitwise_and_(_M32)
    h ^= h >> 15
    return h


def hash_uniform(index: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """float32 uniforms in ``[0, 1)`` on the grid of ``2**-24``, one per int64 element ``index``:
    ``(mix32(mix32(lo32(i) ^ k0) ^ hi32(i) ^ k1) >> 8) / 2**24`` (used by the sketch codec's sign matrices)."""
    h = mix32((index & _M32) ^ keys[0])
    h ^= (index >> 32) ^ keys[1]
    return (mix32(h) >> 8).to(torch.float32).mul_(2.0**-24)


def pair_hash(counter: torch.Tensor, k1: int | torch.Tensor) -> torch.Tensor:
    """A 32-bit hash of int64 ``counter`` values < 2**32, in place: :func:`mix32` without its first
    xorshift, ``k1`` xored in after the first multiplication (the Triton kernels' ``pair_bits``).

    Six GPU instructions per pair of elements rather than sixteen per element for two mix32 rounds; the
    rounding decisions it drives stay uncorrelated (below 0.2%) between elements up to 2**21 apart.
    """
    h = counter.mul_(HASH_M1).bitwise_and_(_M32)
    h ^= (h >> 15) ^ k1
    h.mul_(HASH_M2).bitwise_and_(_M32)
    h ^= h >> 15
    return h


def round_bits(pairs: torch.Tensor, keys: tuple[int, int], wide: bool = True) -> torch.Tensor:
    """The 15-bit random integers of stochastic rounding (int64, shape ``pairs.shape + (2,)``) of elements
    ``2p`` and ``2p + 1``, for int64 pair indices ``p``: bits 17-31 and 0-14 of
    ``h = pair_hash(lo32(p + k0), k1 ^ mix32(hi32(p)))``. ``wide=False`` when every ``p < 2**32`` (mix32(0) is 0).
    """
    k1 = mix32(pairs >> 32).bitwise_xor_(keys[1]) if wide else keys[1]
    h = pair_hash((pairs + keys[0]).bitwise_and_(_M32), k1)
    return torch.stack([h >> 17, h & 0x7FFF], dim=-1)


def _round_bits_like(t: torch.Tensor, keys: tuple[int, int]) -> torch.Tensor:
    """One 15-bit random integer per element of ``t`` (the padded group layout, in memory order)."""
    n = t.numel()
    pairs = torch.arange((n + 1) // 2, dtype=torch.int64, device=t.device)
    return round_bits(pairs, keys, wide=n > 1 << 33).view(-1)[:n].view(t.shape)


def _reciprocal(k: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``1 / k`` correctly rounded in ``dtype``, as a 0-dim tensor (a tensor division: PyTorch on CUDA turns a
    division by a Python number into a multiplication by its reciprocal)."""
    return torch.ones((), dtype=dtype, device=device).div_(torch.full((), k, dtype=dtype, device=device))


def _choices(codec: str, option: str, value, valid) -> None:
    # Type first: 4.0 == 4 and True == 1 would pass a bare membership test.
    if type(value) is not type(valid[0]) or value not in valid:
        raise ConfigError(f"{codec}: option {option} must be one of {', '.join(map(repr, valid))}, got {value!r}")


def _check_group_size(codec: str, group_size) -> None:
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 or group_size % 8:
        raise ConfigError(f"{codec}: option group_size must be a positive multiple of 8, got {group_size!r}")


def _check_seed(codec: str, seed) -> None:
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ConfigError(f"{codec}: option seed must be None or a non-negative int, got {seed!r}")


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _groups(flat: torch.Tensor, group_size: int, work: torch.dtype) -> torch.Tensor:
    """``flat`` as a (groups, group_size) tensor of ``work`` dtype, the tail padded with its last element.

    May be a view of ``flat``: never modify it in place.
    """
    n = flat.numel()
    v = flat.to(work)
    pad = -n % group_size
    if pad:
        v = torch.cat([v, v[-1:].expand(pad)])
    return v.view(-1, group_size)


class _StochasticCodec(Codec):
    """Shared parts of the lossy codecs: options checked alike, a private generator per device, the value check."""

    lossless = False
    unbiased = False  # set per instance from ``rounding``
    dtypes = LOSSY_DTYPES

    def _init_common(self, rounding: str, seed, check: bool, kernel: str) -> None:
        _choices(self.name, "rounding", rounding, ROUNDINGS)
        _check_seed(self.name, seed)
        _choices(self.name, "kernel", kernel, KERNELS)
        self.rounding = rounding
        self.seed = seed
        self.check_values = bool(check)
        self.kernel = kernel
        self.unbiased = rounding == "stochastic"
        self._draws = 0  # stochastic encodes so far: the stream of the next one

    def _next_keys(self) -> tuple[int, int]:
        """The keys of this encode's random stream (host-side counter: no device work, no synchronization)."""
        if self.rounding != "stochastic":
            return (0, 0)
        keys = stream_keys(0 if self.seed is None else self.seed, self._draws)
        self._draws += 1
        return keys

    def _kernel_problem(self, dtype: torch.dtype, group_size: int | None) -> str | None:
        """Why the Triton kernels cannot encode/decode such a tensor, or ``None``."""
        if dtype not in KERNEL_DTYPES:
            return f"{dtype} has no Triton kernel (they take float32, float16 and bfloat16)"
        if group_size is not None and group_size > KERNEL_MAX_GROUP:
            return f"group_size={group_size} is above the kernels' largest group ({KERNEL_MAX_GROUP})"
        return None

    def uses_triton(self, device: torch.device, dtype: torch.dtype, group_size: int | None) -> bool:
        """Whether this codec runs its Triton kernels for such a tensor (announces a fallback once).

        ``group_size``: elements per group, or ``None`` for one scale per tensor.
        """
        if self.kernel == "torch" or (self.kernel == "auto" and device.type != "cuda"):
            return False
        from actzip.kernels import runtime

        reason = runtime.unavailable_reason(device) or self._kernel_problem(dtype, group_size)
        if reason is None:
            return True
        if self.kernel == "triton":
            raise runtime.KernelUnavailableError(f"{self.name}(kernel='triton') cannot run: {reason}")
        runtime.record_fallback(f"{self.name} codec (kernel='auto')", reason, stacklevel=4)
        return False

    def _refuse_non_finite(self, bad_groups: torch.Tensor, flat: torch.Tensor, name: str, what: str) -> None:
        """Raise if any group is flagged (the one host sync of a checked encode)."""
        if not int(bad_groups.sum()):
            return
        n_bad = int((~torch.isfinite(flat)).sum())  # only on the error path: a second sync is fine
        if n_bad:
            raise InvalidValueError(
                f"{self.name}: {name} has {n_bad} of {flat.numel()} elements non-finite (inf or NaN); {what} "
                f"cannot encode them (check=False encodes their groups as NaN)"
            )
        raise InvalidValueError(
            f"{self.name}: {name} has a group whose max - min overflows {_work_dtype(flat.dtype)}; "
            f"use scale='absmax' or rescale the tensor"
        )

    def _payload(self, x: torch.Tensor, perm, buffers: dict, **meta) -> Payload:
        meta["perm"] = perm
        return Payload(self.name, x.shape, x.dtype, x.device, buffers=buffers, meta=meta)


@register_codec("quant")
class QuantCodec(_StochasticCodec):
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
        ``"triton"`` (raises :class:`~actzip.kernels.runtime.KernelUnavailableError` where the kernels cannot
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
        _choices("quant", "bits", bits, QUANT_BITS)
        _check_group_size("quant", group_size)
        _choices("quant", "scale", scale, QUANT_SCALES)
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
        return fixed.add_(_round_bits_like(v, keys)).bitwise_right_shift_(15)

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        x = x.detach()
        keys = self._next_keys()
        what = f"quant(scale={self.scale!r})"
        if self.uses_triton(x.device, x.dtype, self.group_size):
            from actzip.kernels import quant_triton

            # A view with gaps made of whole groups' rows (attention's q, k, v) is read in place, not copied.
            flat, perm = memory_rows(x, self.group_size) or memory_order(x)
            buffers = quant_triton.quant_encode(
                flat, self.bits, self.group_size, self.scale == "absmax", self.rounding == "stochastic", keys
            )
            if self.check_values:  # the kernels mark a non-finite group's parameters NaN
                self._refuse_non_finite(~torch.isfinite(buffers["span" if "span" in buffers else "absmax"]),
                                        flat, name, what)  # fmt: skip
        else:
            flat, perm = memory_order(x)
            buffers = self._encode_torch(flat, keys, name, what)
        return self._payload(x, perm, buffers, bits=self.bits, group_size=self.group_size, scale=self.scale)

    def _encode_torch(self, flat: torch.Tensor, keys: tuple[int, int], name: str, what: str) -> dict:
        groups = _groups(flat, self.group_size, _work_dtype(flat.dtype))
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
            from actzip.kernels import quant_triton

            b = p.buffers
            params = (b["absmax"], None) if scale == "absmax" else (b["lo"], b["span"])
            flat = quant_triton.quant_decode(b["codes"], *params, n, p.dtype, bits, group_size, scale == "absmax")
        else:
            flat = self._decode_torch(p, bits, group_size, scale)[:n].to(p.dtype)
        return restore_order(flat, p.shape, p.meta["perm"])

    @staticmethod
    def _decode_torch(p: Payload, bits: int, group_size: int, scale: str) -> torch.Tensor:
        work = _work_dtype(p.dtype)
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


@register_codec("fp8")
class FP8Codec(_StochasticCodec):
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
        _choices("fp8", "format", format, tuple(FP8_FORMATS))
        _choices("fp8", "granularity", granularity, GRANULARITIES)
        _check_group_size("fp8", group_size)
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
        group_size = self.group_size if per_group else max(flat.numel(), 1)
        what = f"fp8(format={self.format!r})"
        if self.uses_triton(x.device, x.dtype, self.group_size if per_group else None):
            from actzip.kernels import fp8_triton

            codes, scale = fp8_triton.fp8_encode(
                flat, self.format, self.group_size if per_group else None, self.rounding == "stochastic", keys
            )
            if self.check_values:  # the kernels mark a non-finite group's scale NaN
                self._refuse_non_finite(~torch.isfinite(scale), flat, name, what)
        else:
            codes, scale = self._encode_torch(flat, group_size, keys, name, what)
        buffers = {"codes": codes, "scale": scale}
        return self._payload(x, perm, buffers, format=self.format, group_size=group_size)

    def _encode_torch(self, flat, group_size: int, keys, name: str, what: str):
        fp8 = FP8_FORMATS[self.format]
        groups = _groups(flat, group_size, _work_dtype(flat.dtype))
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
            codes = self._stochastic(t, fp8, _round_bits_like(t, keys))
        if not self.check_values:  # a non-finite group: zero codes (deterministic), a NaN scale
            codes = torch.where(ok.unsqueeze(1), codes, 0)
            scale = torch.where(ok, scale, torch.nan)
        return codes.reshape(-1), scale

    def decode(self, payload: Payload) -> torch.Tensor:
        p = self._own(payload)
        n, group_size = p.shape.numel(), p.meta["group_size"]
        per_group = p.buffers["scale"].numel() > 1  # one group decodes like one scale per tensor
        if self.uses_triton(p.device, p.dtype, group_size if per_group else None):
            from actzip.kernels import fp8_triton

            b = p.buffers
            flat = fp8_triton.fp8_decode(b["codes"], b["scale"], n, p.dtype, p.meta["format"],
                                           group_size if per_group else None)  # fmt: skip
            return restore_order(flat, p.shape, p.meta["perm"])
        fp8 = FP8_FORMATS[p.meta["format"]]
        work = _work_dtype(p.dtype)
        q = p.buffers["codes"].view(fp8).to(work).view(-1, group_size)
        y = q.mul_(p.buffers["scale"].unsqueeze(1)).reshape(-1)[:n]
        big = torch.finfo(p.dtype).max  # a rounded-up absmax near the dtype's limit must not become inf
        return restore_order(y.clamp_(-big, big).to(p.dtype), p.shape, p.meta["perm"])
