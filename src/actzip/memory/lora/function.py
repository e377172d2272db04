"""The autograd function of a LoRA linear that keeps the low-rank ``Z = X·Aᵀ`` for backward instead of the input ``X``.

A LoRA linear computes ``y = base(X) + s·(Z·Bᵀ + b_B)`` with ``Z = drop(X)·Aᵀ``. With the base weight frozen,
backward needs ``X`` only for ``grad_A = dZᵀ·drop(X)`` (``dZ = s·dY·B``): ``grad_X = dY·W + drop'(dZ·A)`` and
``grad_B = s·dYᵀ·Z`` need no ``X``. :class:`LoRALinearFunction` runs the whole layer (base and branch) as one
autograd function, so that autograd keeps, besides the parameters, only:

- ``"lora"``: the branch input ``drop(X)``; every gradient exact (the reference);
- ``"fa"`` (LoRA-FA, ``A`` frozen): ``Z`` only;
- ``"care"`` (CARE-LoRA): ``Z`` and what ``M = (ZᵀZ + λI)⁻¹·Zᵀ·drop(X)`` (``r x d_in``, float32) needs:
  ``ZᵀZ`` and ``Zᵀ·drop(X)``, computed in forward while ``X`` is at hand; the ridge systems of all layers are solved
  together when backward first needs one. ``grad_A ≈ (dZᵀ·Z)·M``, the exact gradient with ``drop(X)`` replaced by
  its least-squares reconstruction ``Z·M`` from ``Z``. Exact when the rows of ``drop(X)`` lie in an
  ``r``-dimensional space that ``A`` maps one to one (up to the ridge ``λ``). ``extra_rank=k`` also keeps a
  ``k``-column sketch ``S = drop(X)·Ω`` and reconstructs from ``[Z, S]`` (``power_iters`` turns ``Ω`` toward
  ``X``'s strongest directions first); ``fit_group_rows=g`` fits one ``M`` per ``g`` tokens.

In all three, the output, ``grad_X``, ``grad_B`` and the bias gradients are bit-identical to peft's
``lora_B(lora_A(dropout(x))) * scaling`` added to ``base(x)`` under autograd: the backward issues the same matmuls
in the same order and layout. The dropout mask (same draws as ``F.dropout``) is kept as 1 bit per element, as
1 byte (``dropout_mask="bool"``), or not at all (``"regenerate"``: the RNG state is kept and backward draws the
mask again).

The frozen base may keep its weight as ``nn.Linear`` does (``[out, in]``) or transposed (``[in, out]``, as
transformers' ``Conv1D`` in GPT-2 does, and peft's ``fan_in_fan_out``): the base then runs ``Conv1D``'s own
``addmm``, and its input gradient is the one autograd computes through it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from actzip.codecs.bitpack import unpack_bool
from actzip.errors import ConfigError
from actzip.memory.lora.config import LoRAConfig
from actzip.memory.lora.dropout import (
    dropout_backward_from_mask,
    dropout_backward_regenerated,
    dropout_with_mask,
    pack_mask,
    rng_state,
)
from actzip.memory.lora.fit import (
    cached_gaussian_projection,
    fit_dtype,
    fit_group_moments,
    fit_moments,
    orthonormal_rows,
    pending_fits,
)
from actzip.memory.lora.rows import current_row_mask
from actzip.memory.cache.active import record_external

__all__ = ["LoRALinearFunction", "lora_linear"]


def _base_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fan_in_fan_out: bool):
    """The frozen base layer's output, computed as ``nn.Linear`` or transformers' ``Conv1D`` computes it."""
    if not fan_in_fan_out:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    out = flat.mm(weight) if bias is None else torch.addmm(bias, flat, weight)
    return out.view(*x.shape[:-1], weight.shape[1])


class LoRALinearFunction(torch.autograd.Function):
    """``base(x) + scale·lora_B(lora_A(dropout(x)))``, saving what ``method`` keeps (see the module docstring).

    Positional arguments: ``x, x_again, weight, bias, a, b, b_bias`` (tensors; biases may be None; ``x_again`` is
    ``x`` itself, or its autocast copy: the two edges return the branch's and the base's input gradients
    separately, branch first, so autograd's engine sums them with the other users of ``x`` in the order it sums
    plain LoRA's), ``scale`` (float), ``p`` (dropout probability, 0 when not training), ``cast_to`` (dtype that
    ``x`` is cast to before dropout, as peft does, or None; the dropped input is then cast to ``a``'s dtype if it
    differs, as autocast does), ``cfg`` (:class:`LoRAConfig`), ``rows`` (flattened row mask or None), ``stats``
    (dict of counters or None), and optionally ``fan_in_fan_out`` (``weight`` is stored ``[in, out]``, as
    ``Conv1D`` keeps it; default False).
    """

    @staticmethod
    def forward(ctx, x, x_again, weight, bias, a, b, b_bias, scale, p, cast_to, cfg, rows, stats, fan_in_fan_out=False):
        base = _base_forward(x_again, weight, bias, fan_in_fan_out)
        xa = x.to(cast_to) if cast_to is not None and x.dtype != cast_to else x
        state = packed = None
        if p > 0 and cfg.dropout_mask == "regenerate":
            state = rng_state(x.device)
            dropped = F.dropout(xa, p, True)
        elif p > 0:
            dropped, mask = dropout_with_mask(xa, p)
            packed = mask if cfg.dropout_mask == "bool" else pack_mask(mask)
            del mask
        else:
            dropped = xa
        h = dropped.to(a.dtype)
        z = F.linear(h, a)
        u = F.linear(z, b, b_bias)
        us = u * scale
        total = base + us
        out = total.to(base.dtype)

        ctx.scale, ctx.p, ctx.state = scale, p, state
        ctx.like = (xa.shape, xa.stride(), xa.dtype, xa.device)
        ctx.dtypes = (x.dtype, dropped.dtype, base.dtype, us.dtype, total.dtype)
        ctx.has_b_bias = b_bias is not None
        ctx.fan_in_fan_out = fan_in_fan_out
        method = cfg.method
        keep = gram = sketch = None
        if method == "lora" and ctx.needs_input_grad[4]:
            keep = h
        elif method == "care" and ctx.needs_input_grad[4]:
            n = z.numel() // z.shape[-1]
            if rows is not None and rows.numel() != n:
                rows = None
                if stats is not None:
                    stats["mask_mismatch"] = stats.get("mask_mismatch", 0) + 1
            h2, basis = h.reshape(n, -1), z.reshape(n, -1)
            if cfg.extra_rank:
                sketch = F.linear(h2, cached_gaussian_projection(h2.shape[1], cfg.extra_rank, h.dtype, h.device))
                for _ in range(cfg.power_iters):  # S = X·W, W's rows an orthonormal basis of the rows of SᵀX
                    sketch = F.linear(h2, orthonormal_rows(sketch.t().mm(h2)).to(h.dtype))
                basis = torch.cat([basis.to(fit_dtype(z)), sketch.to(fit_dtype(z))], 1)
            if cfg.fit_group_rows:
                gram, keep = fit_group_moments(basis, h2, cfg.fit_group_rows, rows, cfg.fit_chunk_rows)
            else:
                gram, keep = (t[None] for t in fit_moments(basis, h2, rows, cfg.fit_chunk_rows))
            ctx.fits = pending_fits()
            ctx.fit_index = ctx.fits.add(gram, keep, cfg.lam)
        ctx.method = method if keep is not None else "fa"
        ctx.group = cfg.fit_group_rows
        # for "care", keep = [Z, S]ᵀX and gram = [Z, S]ᵀ[Z, S] (the solve's inputs, also held by the pending group)
        ctx.save_for_backward(weight, a, b, z, keep, gram, sketch, packed)
        if stats is not None:
            stats["calls"] = stats.get("calls", 0) + 1
        if method != "lora":
            # what plain LoRA would have kept of X and is not kept here (Z and M are accounted by the cache's hooks)
            record_external(f"lora_{method}:input_not_kept", h.numel() * h.element_size(), 0)
        return out

    @staticmethod
    def backward(ctx, grad):
        weight, a, b, z, keep, _, sketch, packed = ctx.saved_tensors
        x_dtype, dropped_dtype, base_dtype, us_dtype, total_dtype = ctx.dtypes
        need = ctx.needs_input_grad
        # The casts below are the ones autograd's engine inserts (ToCopyBackward, and an input's dtype check).
        g_total = grad.to(total_dtype)
        g_base = g_total.to(base_dtype).reshape(-1, weight.shape[1] if ctx.fan_in_fan_out else weight.shape[0])
        g_u = (g_total.to(us_dtype) * ctx.scale).reshape(-1, b.shape[0])
        z2 = z.reshape(-1, z.shape[-1])
        grad_x = grad_x_base = grad_w = grad_bias = grad_a = grad_b = grad_b_bias = None
        if need[5]:
            grad_b = g_u.t().mm(z2)
        if ctx.has_b_bias and need[6]:
            grad_b_bias = g_u.sum(0)
        if need[0] or need[4]:
            dz = g_u.mm(b)
            if need[4]:
                if ctx.method == "lora":
                    grad_a = dz.t().mm(keep.reshape(dz.shape[0], -1))
                else:  # Σ over fit groups of (dZᵀZ)·M: r x r first, never N x d
                    m = ctx.fits.solution(ctx.fit_index)
                    basis = z2.to(m.dtype)
                    if sketch is not None:
                        basis = torch.cat([basis, sketch.to(m.dtype)], 1)
                    dzf = dz.to(m.dtype)
                    if m.shape[0] == 1:
                        k = dzf.t().mm(basis)
                    else:
                        pad = m.shape[0] * ctx.group - dzf.shape[0]
                        k = torch.bmm(F.pad(dzf, (0, 0, 0, pad)).view(m.shape[0], ctx.group, -1).transpose(1, 2),
                                      F.pad(basis, (0, 0, 0, pad)).view(m.shape[0], ctx.group, -1))
                        k = k.transpose(0, 1).reshape(dz.shape[1], -1)  # [r, G·r'], matching M stacked below
                    grad_a = k.mm(m.reshape(-1, m.shape[-1])).to(a.dtype)
            if need[0]:
                shape = ctx.like[0]
                g_h = dz.mm(a).reshape(shape).to(dropped_dtype)
                if packed is not None:
                    mask = packed if packed.dtype == torch.bool else unpack_bool(packed, g_h.numel()).reshape(shape)
                    g_h = dropout_backward_from_mask(g_h, mask, ctx.p)
                elif ctx.p > 0:
                    g_h = dropout_backward_regenerated(g_h, ctx.p, ctx.state, ctx.like)
                grad_x = g_h.to(x_dtype)
        if need[1]:
            # Conv1D's addmm(bias, x, W) gives x the gradient grad·Wᵀ (a transposed view, as autograd passes it)
            grad_x_base = g_base.mm(weight.t() if ctx.fan_in_fan_out else weight).reshape(ctx.like[0])
        if need[3]:
            grad_bias = g_base.sum(0)
        return (grad_x, grad_x_base, grad_w, grad_bias, grad_a, grad_b, grad_b_bias,
                None, None, None, None, None, None, None)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor,
                b_bias: torch.Tensor | None = None, *, scale: float, p: float = 0.0, cast: bool = True,
                fan_in_fan_out: bool = False, config: LoRAConfig | None = None, rows: torch.Tensor | None = None,
                stats: dict | None = None) -> torch.Tensor:
    """Functional form of a compressed LoRA linear (``weight`` and ``bias`` of the frozen base layer).

    ``p`` is the dropout probability applied to the branch input (pass 0 outside training). ``fan_in_fan_out``:
    ``weight`` is stored ``[in, out]`` (transformers' ``Conv1D``, as in GPT-2), not ``[out, in]``. ``rows``
    defaults to the mask of the enclosing :func:`~actzip.memory.lora.row_mask` block (when
    ``config.use_attention_mask``). The base weight must be frozen: its gradient would need X.
    """
    cfg = config or LoRAConfig()
    if weight.requires_grad:
        raise ConfigError("lora_linear: the base weight requires grad; its gradient needs X, which a compressed "
                          "LoRA layer does not keep (freeze it, or use plain LoRA for this layer)")
    if rows is None and cfg.use_attention_mask:
        rows = current_row_mask()
    if not isinstance(fan_in_fan_out, bool):
        raise ConfigError(f"lora_linear: fan_in_fan_out must be a bool, got {fan_in_fan_out!r}")
    d_in = weight.shape[0] if fan_in_fan_out else weight.shape[-1]
    if weight.dim() != 2 or x.shape[-1] != d_in or a.shape[-1] != d_in:
        layout = "[in, out]" if fan_in_fan_out else "[out, in]"
        raise ConfigError(f"lora_linear: input of {x.shape[-1]} features, base weight {tuple(weight.shape)} "
                          f"(stored {layout}) and lora_A {tuple(a.shape)} do not fit together")
    if cfg.method == "fa" and a.requires_grad:
        raise ConfigError("lora_linear: method 'fa' (LoRA-FA) keeps no input for grad_A, but lora_A requires grad; "
                          "freeze lora_A or choose method 'care'")
    cast_to = a.dtype if cast else None  # peft's cast of the branch input to the adapter's dtype
    kind = x.device.type
    if torch.is_autocast_enabled(kind):  # run the function in the autocast dtype, as F.linear would, with casts
        dt = torch.get_autocast_dtype(kind)  # outside it (so lora_A / lora_B get float32 gradients back)

        def low(t):
            return t.to(dt) if t is not None and t.is_floating_point() and t.dtype not in (dt, torch.float64) else t

        with torch.autocast(kind, enabled=False):
            # as under peft: the base gets a cast copy of x; the branch casts after dropout (same masks, and the
            # two input gradients meet in x's own dtype, in the same order)
            return LoRALinearFunction.apply(x, low(x), low(weight), low(bias), low(a), low(b), low(b_bias),
                                            float(scale), float(p), cast_to, cfg, rows, stats, fan_in_fan_out)
    return LoRALinearFunction.apply(x, x, weight, bias, a, b, b_bias, float(scale), float(p), cast_to, cfg, rows,
                                    stats, fan_in_fan_out)
