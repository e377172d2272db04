"""Compressed activations for peft LoRA models: one call swaps each ``lora.Linear`` for a subclass.

:func:`apply_` changes the class of every supported peft ``lora.Linear`` to :class:`CompressedLoraLinear` (a
subclass: adapters, scaling, dropout, merging, saving and loading keep peft's code and state-dict keys) whose
forward runs :func:`actzip.memory.lora.lora_linear` while training. Whatever that path cannot take at call
time (no gradient needed, adapters disabled or merged, several active adapters, mixed-adapter batches)
runs peft's own forward unchanged and is counted in ``module.actzip_stats["plain_calls"]``. Layers it cannot
take at all stay plain peft LoRA and are listed, with the reason, in the returned report.

A forward pre-hook on the model reads the ``attention_mask`` argument, so that the CARE fit leaves padding rows
out (see :func:`actzip.memory.lora.row_mask`).
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field

import torch
from peft.tuners.lora import layer as lora_layer
from peft.tuners.lora.layer import LoraLayer
from torch import nn

from actzip.errors import ConfigError
from actzip.memory.lora import LoRACompression, current_row_mask, lora_linear, row_mask

_HOOKS = "_actzip_lora_hooks"  # attribute of the model holding the attention-mask hook handles


class CompressedLoraLinear(lora_layer.Linear):
    """peft's ``lora.Linear`` whose training forward keeps ``Z`` (and ``M``) instead of the input.

    Made by :func:`apply_` from an existing ``lora.Linear`` (never constructed directly); ``actzip_config`` is the
    :class:`LoRACompression` in use, ``actzip_stats`` counts compressed calls, plain fallbacks and row-mask
    mismatches.
    """

    actzip_config: LoRACompression
    actzip_stats: dict

    def _plain_reason(self, x: torch.Tensor, args, kwargs) -> str | None:
        if args or any(v is not None for v in kwargs.values()):
            return "extra forward arguments"
        if self.disable_adapters or self.merged:
            return "adapters disabled or merged"
        active = [n for n in self.active_adapters if n in self.lora_A]
        if len(active) != 1:
            return "not exactly one active adapter"
        if active[0] in self.lora_variant:
            return "a LoRA variant (DoRA, ...) is active"
        drop = self.lora_dropout[active[0]]
        if not isinstance(drop, (nn.Dropout, nn.Identity)):
            return "custom dropout module"
        return None

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        adapter = self.active_adapters[0] if self.active_adapters else None
        a = self.lora_A[adapter].weight if adapter in self.lora_A else None
        b = self.lora_B[adapter].weight if adapter in self.lora_B else None
        wants_grad = torch.is_grad_enabled() and a is not None and (
            x.requires_grad or a.requires_grad or b.requires_grad)
        if not wants_grad:
            return super().forward(x, *args, **kwargs)
        why = self._plain_reason(x, args, kwargs)
        base = self.get_base_layer()
        if why is None and base.weight.requires_grad:
            why = "base weight requires grad"
        if why is not None:
            self.actzip_stats["plain_calls"] = self.actzip_stats.get("plain_calls", 0) + 1
            return super().forward(x, *args, **kwargs)
        drop = self.lora_dropout[adapter]
        p = drop.p if isinstance(drop, nn.Dropout) and drop.training else 0.0
        cfg = self.actzip_config
        if cfg.method == "fa" and a.requires_grad:  # LoRA-FA keeps nothing for grad_A: A must stay frozen
            raise ConfigError(f"CompressedLoraLinear: method 'fa' but lora_A[{adapter!r}] requires grad; re-apply "
                              "actzip.lora.apply(model, method='fa') after unfreezing, or choose 'care'")
        return lora_linear(x, base.weight, base.bias, a, b, self.lora_B[adapter].bias, scale=self.scaling[adapter],
                           p=p, cast=getattr(self, "cast_input_dtype_enabled", True), config=cfg,
                           rows=current_row_mask(), stats=self.actzip_stats)

    def __repr__(self) -> str:
        return f"actzip[{self.actzip_config.method}]." + super().__repr__()


def unsupported_reason(module: nn.Module) -> str | None:
    """Why a peft LoRA layer cannot be compressed (None when it can)."""
    if not isinstance(module, lora_layer.Linear):
        return f"{type(module).__name__} layers are not supported (only lora.Linear over nn.Linear)"
    if type(module) not in (lora_layer.Linear, CompressedLoraLinear):
        return f"{type(module).__name__} (a specialised lora.Linear) is not supported"
    base = module.get_base_layer()
    if type(base) is not nn.Linear:
        return f"base layer {type(base).__name__} is not an nn.Linear (quantized or transposed weights)"
    if getattr(module, "fan_in_fan_out", False):
        return "fan_in_fan_out=True"
    if base.weight.requires_grad:
        return "base weight requires grad (its gradient needs X)"
    variants = sorted(set(module.lora_variant))
    if variants:
        return f"adapter(s) {variants} use a LoRA variant (DoRA, ...)"
    custom = [n for n, d in module.lora_dropout.items() if not isinstance(d, (nn.Dropout, nn.Identity))]
    if custom:
        return f"adapter(s) {custom} have a custom dropout module"
    return None


@dataclass
class LoRAReport:
    """What :func:`apply_` did: the layers compressed and those left as plain LoRA, with the reason."""

    method: str
    compressed: list[str] = field(default_factory=list)
    plain: list[tuple[str, str]] = field(default_factory=list)  # (layer name, why it stays plain LoRA)
    frozen_a: int = 0  # lora_A weights frozen by method "fa"

    def lines(self) -> list[str]:
        head = (f"actzip.lora ({self.method}): {len(self.compressed)} LoRA layers compressed, "
                f"{len(self.plain)} left as plain LoRA")
        out = [head]
        out += [f"  {name}: left as plain LoRA: {why}" for name, why in self.plain]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _mask_hooks(model: nn.Module) -> list:
    """Pre/post hooks on the model's forward that put its ``attention_mask`` argument in a row_mask block."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        sig = None
    ctx: list = []

    def pre(mod, args, kwargs):
        mask = kwargs.get("attention_mask")
        if mask is None and sig is not None and args:
            try:
                mask = sig.bind_partial(*args, **kwargs).arguments.get("attention_mask")
            except TypeError:
                mask = None
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            cm = row_mask(mask)
            cm.__enter__()
            ctx.append(cm)
        else:
            ctx.append(None)

    def post(mod, args, kwargs, out):
        cm = ctx.pop() if ctx else None
        if cm is not None:
            cm.__exit__(None, None, None)

    return [model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, with_kwargs=True, always_call=True)]


def _mask_owner(model: nn.Module) -> nn.Module:
    """The outermost of ``model`` and the models it wraps whose forward takes ``attention_mask``."""
    owner = model
    for _ in range(8):  # PeftModel -> LoraModel -> transformers model: a few levels at most
        try:
            if "attention_mask" in inspect.signature(owner.forward).parameters:
                return owner
        except (TypeError, ValueError):
            pass
        inner = getattr(owner, "get_base_model", None)
        nxt = inner() if callable(inner) else getattr(owner, "model", None)
        if not isinstance(nxt, nn.Module) or nxt is owner:
            break
        owner = nxt
    return model


def apply_(model: nn.Module, method: str = "care", *, lam: float = 1e-6, fit_chunk_rows: int = 4096,
           extra_rank: int = 0, power_iters: int = 0, fit_group_rows: int = 0, dropout_mask: str = "bitmask",
           use_attention_mask: bool = True) -> LoRAReport:
    """Compress the activations of every supported LoRA layer of the peft ``model`` in place.

    ``method``: ``"care"`` (keep Z and the fitted M), ``"fa"`` (LoRA-FA: freeze every lora_A, keep Z) or
    ``"lora"`` (keep the branch input: exact, for reference). ``lam``, ``fit_chunk_rows``, ``extra_rank``,
    ``power_iters``, ``fit_group_rows``, ``dropout_mask``: see
    :class:`LoRACompression`. Applying again replaces the method. Layers that
    cannot be taken (embeddings, convolutions, quantized or transposed bases, DoRA, trainable base weights) stay
    plain peft LoRA: one warning line per reason, and the report lists each. ``use_attention_mask``: leave
    padding rows out of the fit, read from the model's ``attention_mask`` argument.
    """
    cfg = LoRACompression(method=method, lam=lam, fit_chunk_rows=fit_chunk_rows, extra_rank=extra_rank,
                          power_iters=power_iters, fit_group_rows=fit_group_rows, dropout_mask=dropout_mask)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    if not layers:
        raise ConfigError(f"actzip.lora.apply: {type(model).__name__} has no peft LoRA layers; wrap it with "
                          "peft.get_peft_model first, or use actzip.lora.LoRALinear")
    report = LoRAReport(method=method)
    for name, mod in layers:
        why = unsupported_reason(mod)
        if why is not None:
            report.plain.append((name, why))
            continue
        if type(mod) is lora_layer.Linear:
            mod.__class__ = CompressedLoraLinear
            mod.actzip_stats = {}
        mod.actzip_config = cfg
        if method == "fa":
            for lin in mod.lora_A.values():
                if lin.weight.requires_grad:
                    lin.weight.requires_grad_(False)
                    report.frozen_a += 1
        report.compressed.append(name)
    for hd in getattr(model, _HOOKS, []):
        hd.remove()
    handles = _mask_hooks(_mask_owner(model)) if use_attention_mask else []
    setattr(model, _HOOKS, handles)
    by_reason: dict[str, list[str]] = {}
    for name, why in report.plain:
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        warnings.warn(f"actzip.lora.apply: {len(names)} layer(s) left as plain LoRA ({names[0]}, ...): {why}",
                      stacklevel=3)
    return report


def remove_(model: nn.Module) -> int:
    """Undo :func:`apply_`: every compressed layer becomes peft's ``lora.Linear`` again; return how many.

    lora_A weights frozen by method ``"fa"`` stay frozen (unfreeze them with ``requires_grad_()`` if wanted).
    """
    n = 0
    for mod in model.modules():
        if type(mod) is CompressedLoraLinear:
            mod.__class__ = lora_layer.Linear
            for attr in ("actzip_config", "actzip_stats"):
                mod.__dict__.pop(attr, None)
            n += 1
    for hd in getattr(model, _HOOKS, []):
        hd.remove()
    if _HOOKS in model.__dict__:
        delattr(model, _HOOKS)
    return n
