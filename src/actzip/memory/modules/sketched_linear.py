"""A linear layer that keeps a random sketch of its input for backward instead of the input itself.

``y = x W^T + b`` needs ``x`` in backward only for the weight gradient ``G^T x`` (``G`` the output gradient,
leading dimensions flattened). :class:`SketchedLinear` keeps ``x S`` (``S`` a random ``in x k`` matrix with
``E[S S^T] = I``, see :mod:`actzip.codecs.sketch`, rebuilt from its seed in backward, never stored), and
computes the weight gradient as ``(G^T (x S)) S^T``, whose expectation is ``G^T x``: an unbiased gradient
from ``k / in`` of the memory. It is exactly rank ``k``: the factors ``G^T (x S)`` ``[out x k]`` and ``S^T``
``[k x in]`` hold it with no further error. Everything else is exact: the output, the input gradient
``G W`` (which never needs ``x``) and the bias gradient are those of ``nn.Linear``.

With the default ``"sign"`` sketch on a 16-bit input, ``x S`` is taken with the signs scaled by a power of two
(exact in 16 bits), as one 16-bit matmul with float32 accumulation, and ``G^T (x S)`` likewise with a float32
result: no float32 copy of ``x`` or ``G`` is made. Other kinds and dtypes compute in float32 (float64 for
float64 tensors).
"""

from __future__ import annotations

import math
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip import compat
from actzip.api import CompressReport, Config, FilterFn, compress_, register_handler, replace_module, walk
from actzip.codecs.sketch import check_kind, check_rank, derive_seed, sign_matrix, sketch_apply, sketch_matrix
from actzip.core.checks import check_seed
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.cache.active import record_external


def _work(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# The input (forward) or the output gradient (backward) is cast to the working precision whole when that copy
# stays under CHUNK_BYTES, else a slice of rows at a time, so the float32 temporary never exceeds it. Slicing
# small tensors costs time for nothing: 4096-row slices at GPT-124M and 32k tokens (copies of 400 MB at most)
# made an H200 step 155 -> 197 ms, with the same peak memory.
CHUNK_BYTES = 1 << 30


def _chunk_rows(features: int, work: torch.dtype) -> int:
    return max(1, CHUNK_BYTES // (features * torch.finfo(work).bits // 8))


_HALF = (torch.bfloat16, torch.float16)


def _sign16(kind: str, dtype: torch.dtype) -> bool:
    """Whether the sketch runs in the input's own 16-bit dtype: sign entries scaled by a power of two are exact
    there, so ``x S`` needs no float32 copy of ``x`` (nor ``G^T (x S)`` one of ``G``) and runs on the 16-bit
    tensor cores with float32 accumulation."""
    return kind == "sign" and dtype in _HALF


def _sign_scale(k: int) -> float:
    # 2**-round(log2(sqrt k)): close to the 1/sqrt(k) that keeps x S in x's range (fp16 overflows without it),
    # and exact in every float dtype.
    return 2.0 ** -round(math.log2(k) / 2)


# Whether torch.mm takes out_dtype here (CUDA, torch >= 2.8); cleared, with one warning, on the first refusal.
# Then the weight gradient casts G to float32 a slice at a time, as for the other kinds.
_MM_OUT_DTYPE = [True]


def _gram_left(g2: torch.Tensor, xs2: torch.Tensor, work: torch.dtype) -> torch.Tensor:
    """``G^T (x S)`` ``[out, k]`` in ``work`` precision, at most ``CHUNK_BYTES`` of ``G`` cast at a time."""
    if g2.is_cuda and g2.dtype == xs2.dtype and g2.dtype in _HALF and _MM_OUT_DTYPE[0]:
        try:  # 16-bit operands, float32 accumulation and result: no cast of G at all
            return torch.mm(g2.t(), xs2, out_dtype=work)
        except (RuntimeError, TypeError) as e:
            _MM_OUT_DTYPE[0] = False
            warnings.warn(f"actzip SketchedLinear: torch.mm(..., out_dtype=float32) is not available ({e}); the "
                          "weight gradient casts the output gradient to float32 instead (slower, same values "
                          "up to summation order; warned once)", RuntimeWarning, stacklevel=2)
    rows = _chunk_rows(g2.shape[1], work)
    if g2.dtype == work and xs2.dtype == work or g2.shape[0] <= rows:
        return g2.to(work).t().matmul(xs2.to(work))
    left = torch.zeros(g2.shape[1], xs2.shape[1], dtype=work, device=g2.device)
    for i in range(0, g2.shape[0], rows):
        left.addmm_(g2[i:i + rows].to(work).t(), xs2[i:i + rows].to(work))
    return left


def _sketch_rows(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """:func:`sketch_apply` (``x S`` in ``S``'s dtype), at most ``CHUNK_BYTES`` of ``x`` cast at a time."""
    x2 = x.reshape(-1, x.shape[-1])
    rows = _chunk_rows(x2.shape[1], s.dtype)
    if x.dtype == s.dtype or x2.shape[0] <= rows:
        return sketch_apply(x, s)
    out = torch.empty(x2.shape[0], s.shape[1], dtype=s.dtype, device=x.device)
    for i in range(0, x2.shape[0], rows):
        out[i:i + rows] = sketch_apply(x2[i:i + rows], s)
    return out.reshape(*x.shape[:-1], s.shape[1])


class SketchedLinearFunction(torch.autograd.Function):
    """``F.linear(x, weight, bias)`` that saves ``x S`` and ``weight`` (not ``x``) for backward.

    ``owner`` is the :class:`SketchedLinear` (or ``None``) that collects the weight-gradient factors.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, rank: int, kind: str, seed: int, owner):
        y = F.linear(x, weight, bias)
        d = x.shape[-1]
        ctx.rank, ctx.kind, ctx.seed, ctx.d = rank, kind, seed, d
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        ctx.owner = owner
        ctx.sign16 = _sign16(kind, x.dtype)
        if ctx.needs_input_grad[1]:
            if ctx.sign16:
                xs = torch.matmul(x.detach(), sign_matrix(d, rank, seed, x.device, x.dtype).mul_(_sign_scale(rank)))
            else:
                s = sketch_matrix(d, rank, seed, kind, x.device, _work(x.dtype))
                xs = _sketch_rows(x.detach(), s).to(x.dtype)
            record_external("sketch", x.numel() * x.element_size(), xs.numel() * xs.element_size())
        else:
            xs = None
        ctx.save_for_backward(xs, weight)
        return y

    @staticmethod
    def backward(ctx, grad_y: torch.Tensor):
        xs, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.matmul(grad_y, weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad_y.sum(dim=tuple(range(grad_y.dim() - 1)))
        if ctx.needs_input_grad[1]:
            left = _gram_left(grad_y.reshape(-1, grad_y.shape[-1]), xs.reshape(-1, ctx.rank), _work(weight.dtype))
            work = left.dtype
            if ctx.sign16:  # xs = x (c S+-): G^T x S S^T = left (1 / (k c)) S+-^T, S = S+- / sqrt(k)
                left = left.mul_(1.0 / (ctx.rank * _sign_scale(ctx.rank)))
                right = sign_matrix(ctx.d, ctx.rank, ctx.seed, weight.device, work).t()
            else:
                right = sketch_matrix(ctx.d, ctx.rank, ctx.seed, ctx.kind, weight.device, work).t()  # [k, in]
            grad_w = left.matmul(right).to(weight.dtype)
            owner = ctx.owner() if ctx.owner is not None else None
            if owner is not None:
                owner._collect_factors(left, right)
        return grad_x, grad_w, grad_b, None, None, None, None


class SketchedLinear(nn.Module):
    """``nn.Linear`` whose backward keeps a rank-``k`` sketch of the input instead of the input.

    The wrapped layer's parameters are registered under the same names (``weight``, ``bias``), so state
    dicts are interchangeable with the ``nn.Linear`` it replaces.

    Args:
      linear: the ``nn.Linear`` to wrap (its parameters are shared, not copied).
      rank: sketch width ``k`` (an int >= 1); the saved input is ``k / in_features`` of ``x``.
      kind: ``"sign"`` (default: drawn on the device, no host work) or ``"gaussian"`` (drawn on the host and
        moved, each call) (see :mod:`actzip.codecs.sketch`).
      seed: base seed. The ``i``-th forward with gradients (from 0) sketches with seed
        ``derive_seed(seed, i)``, so every step draws a fresh ``S``; ``last_seed`` holds the latest one.
      factored_grad: also keep the weight gradient as factors. After backward,
        ``weight.actzip_factors = (left, right)`` (``[out x r]`` and ``[r x in]``, in float32, float64 for
        float64 weights) with ``left @ right`` equal to the sketched part of ``weight.grad``; an optimizer
        could use these directly instead of the dense gradient, which is still set. Factors of several
        backward calls (layer reused, or gradients accumulated) are concatenated along ``r``; they restart
        when the backward pass finds ``weight.grad`` ``None`` (``zero_grad()``'s default), and can be
        dropped by deleting the attribute.

    Guarantees: the output, the input gradient and the bias gradient are bit-identical to ``nn.Linear``'s
    (the same ops on the same tensors); ``E[weight.grad] = G^T x`` over the draw of ``S``, with the variance
    of :class:`actzip.codecs.sketch.SketchCodec` for each row of ``x``, mixed by ``G``.
    """

    def __init__(
        self,
        linear: nn.Linear,
        *,
        rank: int,
        kind: str = "sign",
        seed: int = 0,
        factored_grad: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise ConfigError(f"SketchedLinear wraps an nn.Linear, got {type(linear).__name__}")
        check_rank("SketchedLinear", rank)
        check_kind("SketchedLinear", kind)
        check_seed("SketchedLinear", seed)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        if linear.bias is not None:
            self.bias = linear.bias
        else:
            self.register_parameter("bias", None)
        self.rank, self.kind, self.seed = rank, kind, 0 if seed is None else seed
        self.factored_grad = bool(factored_grad)
        self.calls = 0
        self.last_seed: int | None = None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._restart = True
        self._hook = None
        if self.factored_grad:
            self._hook = self.weight.register_post_accumulate_grad_hook(_make_publish(weakref.ref(self)))

    def _collect_factors(self, left: torch.Tensor, right: torch.Tensor) -> None:
        if not self.factored_grad:
            return
        if not self._pending:
            self._restart = self.weight.grad is None  # AccumulateGrad has not run yet in this pass
        self._pending.append((left, right))

    def _publish(self, param: torch.Tensor) -> None:
        if not self._pending:
            return
        parts = self._pending
        old = getattr(param, "actzip_factors", None)
        if not self._restart and old is not None:
            parts = [old, *parts]
        self._pending = []
        param.actzip_factors = (torch.cat([p[0] for p in parts], dim=1), torch.cat([p[1] for p in parts], dim=0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        needs = torch.is_grad_enabled() and (
            x.requires_grad or self.weight.requires_grad or (self.bias is not None and self.bias.requires_grad)
        )
        if not needs:
            return F.linear(x, self.weight, self.bias)
        seed = derive_seed(self.seed, self.calls)
        self.calls += 1
        self.last_seed = seed
        owner = weakref.ref(self) if self.factored_grad else None
        return SketchedLinearFunction.apply(x, self.weight, self.bias, self.rank, self.kind, seed, owner)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"rank={self.rank}, kind={self.kind!r}, factored_grad={self.factored_grad}"
        )


def _make_publish(owner_ref: weakref.ref) -> Callable[[torch.Tensor], None]:
    def hook(param: torch.Tensor) -> None:
        owner = owner_ref()
        if owner is not None:
            owner._publish(param)

    return hook


@dataclass
class SketchedLinearConfig(Config):
    """``compress_`` config: every ``nn.Linear`` becomes a :class:`SketchedLinear` (same parameters and state
    dict keys; the model itself is not replaced even if it is an ``nn.Linear``)."""

    rank: int | None = None  # sketch width k of every layer; None: each gets max(1, round(in_features * rank_ratio))
    rank_ratio: float = 1 / 8  # k / in_features when rank is None
    kind: str = "sign"  # "sign" (drawn on the device) or "gaussian" (see actzip.codecs.sketch)
    # base seed: layer i (in module order, among those swapped) draws from derive_seed(seed, i), so layers
    # sketch independently; None means 0
    seed: int | None = 0
    factored_grad: bool = False  # also keep each weight gradient as factors (SketchedLinear's docstring)

    def validate(self) -> None:
        if self.rank is not None:
            check_rank("SketchedLinearConfig", self.rank)
        r = self.rank_ratio
        if not (isinstance(r, (int, float)) and not isinstance(r, bool) and r > 0):
            raise ConfigError(f"SketchedLinearConfig: option rank_ratio must be a positive number, got {r!r}")
        check_kind("SketchedLinearConfig", self.kind)
        check_seed("SketchedLinearConfig", self.seed)
        if not isinstance(self.factored_grad, bool):
            raise ConfigError(f"SketchedLinearConfig: option factored_grad must be True or False, got "
                              f"{self.factored_grad!r}")

    def rank_for(self, in_features: int) -> int:
        """The sketch width of a layer with ``in_features`` inputs."""
        return self.rank if self.rank is not None else max(1, round(in_features * self.rank_ratio))


@register_handler(SketchedLinearConfig)
def swap_sketched_linears(model: nn.Module, config: SketchedLinearConfig, filter_fn: FilterFn | None,
                          report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`SketchedLinearConfig`."""

    def candidate(module: nn.Module, fqn: str):
        if type(module) is not nn.Linear:
            return False
        return True if fqn else "the model itself is an nn.Linear: wrap it in a parent module to swap it"

    base = 0 if config.seed is None else config.seed
    for i, (fqn, linear) in enumerate(walk(model, candidate, filter_fn, report)):
        k = config.rank_for(linear.in_features)
        new = SketchedLinear(linear, rank=k, kind=config.kind, seed=derive_seed(base, i),
                             factored_grad=config.factored_grad)
        replace_module(model, fqn, new, report, f"SketchedLinear(rank={k})")


def _sketch_linears_(
    model: nn.Module,
    rank: int | None = None,
    rank_ratio: float = 1 / 8,
    filter_fn: Callable[[str, nn.Linear], bool] | None = None,
    **kw,
) -> list[str]:
    """The old entry point: ``compress_(model, SketchedLinearConfig(rank, rank_ratio, **kw))``, with its
    ``filter_fn(name, module)`` order; returns the names swapped."""
    try:
        config = SketchedLinearConfig(rank=rank, rank_ratio=rank_ratio, **kw)
    except TypeError as e:  # an option SketchedLinearConfig does not have
        raise ConfigError(f"sketch_linears_: {e}") from None
    swapped = None if filter_fn is None else (lambda module, fqn: filter_fn(fqn, module))
    try:
        report = compress_(model, config, filter_fn=swapped)
    except NothingToCompressError:
        return []  # the old function swapped nothing quietly
    return [fqn for fqn, _ in report.swapped]


sketch_linears_ = compat.deprecated(
    _sketch_linears_, "actzip.memory.sketch_linears_", "actzip.compress_(model, SketchedLinearConfig(...))"
)
