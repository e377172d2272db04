"""FP8 linear layers: tensorwise-scaled float8 matmuls in forward and backward, torchao ``Float8Linear`` style.

:class:`Fp8Linear` is an ``nn.Linear`` (same parameters, same state-dict keys) whose three matmuls run through
``torch._scaled_mm``: ``y = x Wᵀ`` with ``x`` and ``W`` in float8 e4m3, ``grad_x = G W`` and
``grad_W = Gᵀ x`` with the output gradient ``G`` in float8 e5m2 (wider range, fewer mantissa bits: gradients
span more magnitudes than activations). Each tensor gets one scale (dynamic, per tensor, from its absolute
maximum), computed on the device: nothing waits for the GPU.

For backward it keeps the float8 input (1 byte an element instead of 2 for bf16), its scale and the float8
weight. The float8 input goes through autograd's saved-tensor mechanism, so an enclosing
activation cache (:func:`actzip.cache`) decides how to store it: after a ReLU / ReLU² (the down projection of a
fused :class:`~actzip.memory.modules.SparseReLUMLP`) it is mostly zeros, and the default rules store it with the
lossless sparse codec. With :attr:`Fp8LinearConfig.recast_input` it keeps the caller's input instead and casts it
again in backward: then the fused MLPs rebuild the down projection's input from the sparse payload, and nothing
of it is stored.

Numerics (``q(t)`` is the float8 tensor, ``s_t`` its inverse scale; rounding is round-to-nearest-even):

- scale: ``amax = max|t|`` (exact), ``scale = fp32(FMAX / max(amax, 1e-12))`` with ``FMAX`` 448 (e4m3) or
  57344 (e5m2), optionally rounded down to a power of two (:attr:`Fp8LinearConfig.pow2_scales`); ``s_t =
  fp32(1 / scale)`` (exact for a power of two).
- cast: ``q(t) = float8(clamp(fp32(fp32(t) * scale), -FMAX, FMAX))``: one rounding to fp32, one to float8;
  values beyond ``FMAX`` (only from the scale's own rounding) saturate, values below float8's smallest
  subnormal flush to zero.
- matmul: ``out = round_out(s_a s_b Σ q_a q_b)``. On CUDA (cuBLASLt) the float8 products are exact and
  accumulate in fp32 (``use_fast_accum`` lets Hopper keep the tensor core's narrower accumulator longer: see
  :attr:`Fp8LinearConfig.fast_accum_forward`); on the CPU each operand is dequantized to fp32 (``q * s``, one
  rounding), multiplied in fp32, and the result rounded to the output dtype.
- the output dtype is the input's (the autocast dtype under autocast); ``grad_x`` has the input's dtype,
  ``grad_W`` the weight's. The bias is added after the matmul, ``y + bias.to(y.dtype)`` (a second rounding),
  and its gradient is autograd's sum of the unquantized ``G``, as torchao does.
- ``grad_W`` contracts over the tokens; ``_scaled_mm`` needs that dimension to be a multiple of 16, so the
  tokens are zero-padded to one (zeros add exactly nothing). Leading dimensions of the input are flattened.
- an inf or NaN anywhere in a tensor makes its scale 0 or NaN and the whole matmul result NaN, so a loss
  scaler sees a non-finite gradient and skips the step.

Where ``_scaled_mm`` refuses (a GPU before sm_89, a dtype pair it does not take such as e5m2 x e5m2 on CUDA),
the matmul falls back to a dequantized one: the float8 operands, converted exactly, are multiplied in the output
dtype (fp32 for an fp16 output, whose range the unscaled float8 products can exceed) and the result is
multiplied by ``s_a s_b`` (two roundings instead of one). Each refused combination is announced once
(``warnings``) and counted (:func:`scaled_mm_fallbacks`). The dtype pairs used here (e4m3 x e4m3 forward,
e5m2 x e4m3 backward) are the ones sm_89 / sm_90 accept; the CPU accepts every pair.

Shapes: ``in_features`` and ``out_features`` must be multiples of 16 (``_scaled_mm``'s rule for the contracted
and output dimensions): :class:`Fp8Linear` raises a :class:`~actzip.errors.ConfigError` naming the layer
otherwise, and ``compress_(model, Fp8LinearConfig())`` keeps such layers as ``nn.Linear``, saying which in its
report.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import torch
import torch.nn as nn

from actzip import compat
from actzip.api import CompressReport, Config, FilterFn, compress_, register_handler, replace_module, walk
from actzip.errors import ConfigError, NothingToCompressError, UnsupportedDtypeError

E4M3 = torch.float8_e4m3fn  # inputs and weights: more mantissa bits
E5M2 = torch.float8_e5m2  # output gradients: more exponent range
FP8_MAX = {E4M3: torch.finfo(E4M3).max, E5M2: torch.finfo(E5M2).max}  # 448, 57344
SCALE_EPS = 1e-12  # floor of amax: an all-zero tensor gets a finite scale and quantizes to zeros
MATMUL_MULTIPLE = 16  # _scaled_mm on CUDA: contracted and output dimensions must be multiples of this
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # output dtypes _scaled_mm can write


@dataclass(frozen=True)
class Fp8LinearConfig(Config):
    """How an :class:`Fp8Linear` runs its float8 matmuls; given to ``compress_``, it swaps every ``nn.Linear``.

    ``compress_(model, Fp8LinearConfig())`` replaces, in place, the modules of type exactly ``nn.Linear``
    (subclasses may be used through their weight directly, as ``nn.MultiheadAttention``'s output projection
    is) by :class:`Fp8Linear` layers sharing their parameters, so state dicts, optimizers and tied weights are
    unchanged. Layers whose dimensions are not multiples of 16 stay ``nn.Linear`` (the report says which).
    Works before or after ``SparseMLPConfig`` swaps MLPs (the fused MLPs call their linear layers as given).
    """

    # cuBLASLt's fast accumulation for the forward matmul (torchao's default for the output); the two backward
    # matmuls always accumulate precisely. Faster on Hopper, slightly less accurate; ignored on the CPU.
    fast_accum_forward: bool = True
    # Round every scale down to a power of two: scaling is then an exact exponent shift (the only rounding
    # left is the cast to float8), at the cost of up to one binade of float8 range (amax lands in
    # [FMAX / 2, FMAX]).
    pow2_scales: bool = False
    # Keep the caller's input for backward instead of its float8 copy, and cast it again there (same bits).
    # Free for the down projection of a fused SparseReLUMLP / SparseGatedReLUMLP, which rebuild that input
    # from the sparse payload; elsewhere it keeps 2 bytes an element (bf16) instead of 1.
    recast_input: bool = False

    def validate(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), bool):
                raise ConfigError(f"Fp8LinearConfig.{f.name} must be True or False, got {getattr(self, f.name)!r}")


def quantize_tensorwise(
    t: torch.Tensor, fp8_dtype: torch.dtype, pow2: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` in float8 with one dynamic scale, and the inverse scale (an fp32 0-d tensor) that dequantizes it.

    ``t ≈ q.float() * inverse_scale``; see the module docstring for every rounding. Runs on the device only.
    The result is contiguous.
    """
    fmax = FP8_MAX[fp8_dtype]
    # amax of an empty tensor is an error; its scale is never used, so any finite value does
    amax = t.detach().abs().amax().float() if t.numel() else t.new_zeros((), dtype=torch.float32)
    scale = fmax / amax.clamp(min=SCALE_EPS)
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    q = (t.detach().float() * scale).clamp(-fmax, fmax).to(fp8_dtype).contiguous()
    return q, scale.reciprocal()


# -- _scaled_mm, or a dequantized matmul where it refuses ---------------------------------------------------

_fallbacks: dict[str, int] = {}  # refused combination -> calls that took the dequantized matmul


def scaled_mm_fallbacks() -> dict[str, int]:
    """How many matmuls fell back to the dequantized path, by the combination ``_scaled_mm`` refused."""
    return dict(_fallbacks)


def _dequantized_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out_dtype) -> torch.Tensor:
    # float8 converts exactly to bf16, fp16 and fp32; the unscaled products (up to 448 * 57344 each) overflow
    # fp16, so an fp16 result is computed in fp32.
    work = torch.float32 if out_dtype == torch.float16 else out_dtype
    return torch.mm(a.to(work), b.to(work)).mul_(sa * sb).to(out_dtype)


def scaled_mm(
    a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, out_dtype: torch.dtype, fast_accum: bool
) -> torch.Tensor:
    """``round_out(sa * sb * (a @ b))`` for float8 ``a`` (row-major ``[m, k]``) and ``b`` (column-major ``[k, n]``).

    Through ``torch._scaled_mm``; where it refuses the combination (device, dtypes), through
    :func:`_dequantized_mm`, announced once per combination.
    """
    if a.numel() == 0 or b.numel() == 0:  # an empty batch: the layout of empty operands is meaningless
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device)
    key = f"{a.device.type}:{a.device.index} {a.dtype}x{b.dtype}->{out_dtype}".replace("torch.", "")
    if key not in _fallbacks:
        try:
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast_accum)
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, NotImplementedError, ValueError) as e:  # refused on the host: nothing was launched
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            warnings.warn(
                f"actzip Fp8Linear: torch._scaled_mm refused {key} ({reason}); using a dequantized matmul for "
                "it from now on (float8 values, rounded twice; see actzip.memory.modules.fp8_linear). Announced "
                "once; counted in actzip.memory.modules.fp8_linear.scaled_mm_fallbacks().",
                stacklevel=2,
            )
            _fallbacks[key] = 0
    _fallbacks[key] += 1
    return _dequantized_mm(a, b, sa, sb, out_dtype)


def _transpose_padded(q: torch.Tensor) -> torch.Tensor:
    """``q.t()`` as a contiguous ``[cols, rows']`` float8 tensor, ``rows'`` being ``rows`` rounded up to a multiple
    of 16 with zero columns added (the token dimension, contracted by the weight-gradient matmul)."""
    rows, cols = q.shape
    padded = -(-rows // MATMUL_MULTIPLE) * MATMUL_MULTIPLE
    bits = q.view(torch.uint8)  # moved as bytes: copies and fills of every float8 dtype on every device
    if padded == rows:
        return bits.t().contiguous().view(q.dtype)
    out = torch.zeros(cols, padded, dtype=torch.uint8, device=q.device)
    out[:, :rows].copy_(bits.t())
    return out.view(q.dtype)


# -- the autograd function -----------------------------------------------------------------------------------


def _forward(x2: torch.Tensor, weight: torch.Tensor, config: Fp8LinearConfig, out_dtype: torch.dtype):
    x_q, x_s = quantize_tensorwise(x2, E4M3, config.pow2_scales)
    w_q, w_s = quantize_tensorwise(weight, E4M3, config.pow2_scales)
    y = scaled_mm(x_q, w_q.t(), x_s, w_s, out_dtype, config.fast_accum_forward)
    return y, x_q, x_s, w_q, w_s


class Fp8LinearFunction(torch.autograd.Function):
    """``x2 Wᵀ`` in float8 (``x2`` 2-D); saves the float8 input (or ``x2``, see :attr:`Fp8LinearConfig.recast_input`)
    and weight with their scales.

    Returns ``(y, x_q, w_q)``. The float8 input and weight are outputs only so that autograd, and the rules of
    an enclosing activation cache (:func:`actzip.cache`), see them as activations of this step: a tensor made
    inside an autograd function and saved without being an output is, to autograd, a leaf, and the cache's
    rules never compress leaves (parameters and inputs are held elsewhere anyway). Their gradients are ignored.
    """

    @staticmethod
    def forward(ctx, x2: torch.Tensor, weight: torch.Tensor, config: Fp8LinearConfig, out_dtype: torch.dtype):
        y, x_q, x_s, w_q, w_s = _forward(x2, weight, config, out_dtype)
        ctx.set_materialize_grads(False)  # no zero float8 gradients for the two bookkeeping outputs
        ctx.save_for_backward(x2 if config.recast_input else x_q, x_s, w_q, w_s)
        ctx.x_dtype, ctx.w_dtype, ctx.config = x2.dtype, weight.dtype, config
        return y, x_q, w_q

    @staticmethod
    def backward(ctx, grad_y, _grad_x_q, _grad_w_q):
        if grad_y is None:
            return None, None, None, None
        x_saved, x_s, w_q, w_s = ctx.saved_tensors
        g_q, g_s = quantize_tensorwise(grad_y, E5M2)
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:  # G [m, n] @ W [n, k], W column-major
            grad_x = scaled_mm(g_q, _transpose_padded(w_q).t(), g_s, w_s, ctx.x_dtype, False)
        if ctx.needs_input_grad[1]:  # Gᵀ [n, m'] @ x [m', k], x column-major, tokens padded to m'
            x_q = quantize_tensorwise(x_saved, E4M3, ctx.config.pow2_scales)[0] if ctx.config.recast_input else x_saved
            grad_w = scaled_mm(_transpose_padded(g_q), _transpose_padded(x_q).t(), g_s, x_s, ctx.w_dtype, False)
        return grad_x, grad_w, None, None


# -- the module ----------------------------------------------------------------------------------------------


def _dims_problem(in_features: int, out_features: int) -> str | None:
    bad = [f"{n}={v}" for n, v in (("in_features", in_features), ("out_features", out_features)) if v % MATMUL_MULTIPLE]
    return f"{' and '.join(bad)} not a multiple of {MATMUL_MULTIPLE}" if bad else None


class Fp8Linear(nn.Linear):
    """``nn.Linear`` whose forward and backward matmuls run in float8 (see the module docstring for the numerics).

    Same parameters and state-dict keys as ``nn.Linear`` (``weight``, optional ``bias``), which stay in their
    own dtype (the float8 copies are made every call). ``in_features`` and ``out_features`` must be multiples
    of 16. ``name`` (set by ``compress_`` to the module's path) only labels error messages.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        *,
        config: Fp8LinearConfig | None = None,
        name: str | None = None,
    ) -> None:
        self.name = name
        if (problem := _dims_problem(in_features, out_features)) is not None:
            raise ConfigError(
                f"{self._label(in_features, out_features)}: torch._scaled_mm needs both dimensions to be multiples "
                f"of {MATMUL_MULTIPLE}: {problem}. Keep this layer as nn.Linear (compress_ with Fp8LinearConfig "
                "skips such layers)"
            )
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.config = config if config is not None else Fp8LinearConfig()

    def _label(self, in_features: int | None = None, out_features: int | None = None) -> str:
        i = self.in_features if in_features is None else in_features
        o = self.out_features if out_features is None else out_features
        where = f" {self.name!r}" if self.name else ""
        return f"Fp8Linear{where} ({i} -> {o})"

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, config: Fp8LinearConfig | None = None,
                    name: str | None = None) -> "Fp8Linear":
        """An :class:`Fp8Linear` sharing ``linear``'s parameters (the same ``Parameter`` objects, so optimizers
        and tied weights keep working), in ``linear``'s training mode."""
        if not isinstance(linear, nn.Linear):
            raise ConfigError(f"Fp8Linear.from_linear takes an nn.Linear, got {type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta",
                  config=config, name=name)  # fmt: skip
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1:] != (self.in_features,):
            raise ConfigError(f"{self._label()}: input of shape {tuple(x.shape)} has not {self.in_features} features")
        dev = x.device.type
        out_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        for what, dt in (("input", x.dtype), ("output", out_dtype)):
            if dt not in OUT_DTYPES:
                raise UnsupportedDtypeError(f"{self._label()}: {what} dtype {dt} not supported; use one of "
                                            f"{', '.join(str(d).replace('torch.', '') for d in OUT_DTYPES)}")
        x2 = x.reshape(-1, self.in_features)
        if torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad):
            y = Fp8LinearFunction.apply(x2, self.weight, self.config, out_dtype)[0]
        else:  # the same ops, without a graph: eval and recomputation give the same bits as training
            y = _forward(x2, self.weight, self.config, out_dtype)[0]
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y + self.bias.to(y.dtype) if self.bias is not None else y

    def extra_repr(self) -> str:
        c = self.config
        return (f"{super().extra_repr()}, fp8=e4m3/e5m2 tensorwise, fast_accum_forward={c.fast_accum_forward}, "
                f"pow2_scales={c.pow2_scales}, recast_input={c.recast_input}")  # fmt: skip


@register_handler(Fp8LinearConfig)
def swap_fp8_linears(model: nn.Module, config: Fp8LinearConfig, filter_fn: FilterFn | None,
                     report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`Fp8LinearConfig`."""

    def candidate(module: nn.Module, fqn: str):
        if type(module) is not nn.Linear:
            return False
        return True if fqn else "the model itself is an nn.Linear: wrap it in a parent module to swap it"

    for fqn, linear in walk(model, candidate, filter_fn, report):
        if (problem := _dims_problem(linear.in_features, linear.out_features)) is not None:
            dims = f"{linear.in_features} -> {linear.out_features}"
            report.skipped.append((fqn, f"kept as nn.Linear ({dims}): {problem}"))
            continue
        replace_module(model, fqn, Fp8Linear.from_linear(linear, config=config, name=fqn), report, "Fp8Linear")


def _fp8_linears_(model: nn.Module, filter_fn: FilterFn | None = None, *,
                  config: Fp8LinearConfig | None = None) -> list[str]:
    """The old entry point: ``compress_(model, config or Fp8LinearConfig(), filter_fn=filter_fn)``, returning the
    names swapped, and warning about the layers kept as ``nn.Linear``."""
    config = config if config is not None else Fp8LinearConfig()
    kept = [f"{n} ({m.in_features} -> {m.out_features})" for n, m in model.named_modules()
            if n and type(m) is nn.Linear and (filter_fn is None or filter_fn(m, n))
            and _dims_problem(m.in_features, m.out_features) is not None]  # fmt: skip
    if kept:
        warnings.warn(f"fp8_linears_: kept {len(kept)} layer(s) as nn.Linear, dimensions not multiples of "
                      f"{MATMUL_MULTIPLE}: {', '.join(kept)}", stacklevel=3)
    try:
        report = compress_(model, config, filter_fn=filter_fn)
    except NothingToCompressError:
        return []  # the old function swapped nothing quietly
    return [fqn for fqn, _ in report.swapped]


fp8_linears_ = compat.deprecated(_fp8_linears_, "actzip.memory.fp8_linears_",
                                 "actzip.compress_(model, Fp8LinearConfig())")
Fp8Config = compat.deprecated(Fp8LinearConfig, "actzip.memory.fp8_linear.Fp8Config", "Fp8LinearConfig")
