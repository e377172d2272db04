"""Compressed activations for peft LoRA models: each supported ``lora.Linear`` becomes a subclass while training.

:func:`compress_peft_model` (what ``actzip.compress_(peft_model, LoRAConfig(...))`` runs) changes the class of
every supported peft ``lora.Linear`` to :class:`CompressedLoraLinear` (a subclass: adapters, scaling, dropout,
merging, saving and loading keep peft's code and state-dict keys) whose forward runs
:func:`actzip.memory.lora.lora_linear` while training. Bases may be ``nn.Linear`` or transformers' ``Conv1D``
(GPT-2; peft's ``fan_in_fan_out``). Whatever that path cannot take at call time (no gradient needed, adapters
disabled or merged, several active adapters, mixed-adapter batches) runs peft's own forward unchanged and is
counted in ``module.actzip_stats["plain_calls"]``. Layers it cannot take at all stay plain peft LoRA and are
listed, with the reason, in the report. ``actzip.restore_`` puts every class, flag and hook back.

A forward pre-hook on the model reads the ``attention_mask`` argument, so that the CARE fit leaves padding rows
out (see :func:`actzip.memory.lora.row_mask`).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

from actzip.api import CompressReport, FilterFn, add_undo, walk
from actzip.errors import ConfigError, MissingDependencyError

try:  # peft (and the transformers it needs) are optional: only this module, loaded on first use, needs them
    from peft.tuners.lora import layer as lora_layer
    from peft.tuners.lora.layer import LoraLayer
    from transformers.pytorch_utils import Conv1D
except ImportError as e:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(
        f"LoRAConfig on peft models needs peft and transformers ({e}): pip install 'actzip[hf]'"
    ) from e
from actzip.memory.lora.config import LoRAConfig
from actzip.memory.lora.function import lora_linear
from actzip.memory.lora.rows import row_mask

__all__ = ["CompressedLoraLinear", "attention_mask_owner", "compress_peft_model", "unsupported_reason"]

HOOKS_ATTR = "_actzip_lora_hooks"  # attribute of the model holding the attention-mask hook handles
PLAIN = "plain LoRA: "  # how the report's reasons for a layer left as peft's own begin


class CompressedLoraLinear(lora_layer.Linear):
    """peft's ``lora.Linear`` whose training forward keeps ``Z`` (and ``M``) instead of the input.

    Made by :func:`compress_peft_model` from an existing ``lora.Linear`` (never constructed directly);
    ``actzip_config`` is the :class:`~actzip.memory.lora.LoRAConfig` in use, ``actzip_stats`` counts compressed
    calls, plain fallbacks and row-mask mismatches.
    """

    actzip_config: LoRAConfig
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
            raise ConfigError(f"CompressedLoraLinear: method 'fa' but lora_A[{adapter!r}] requires grad; freeze it "
                              "again, or restore_ and compress_ with LoRAConfig(method='care')")
        return lora_linear(x, base.weight, base.bias, a, b, self.lora_B[adapter].bias, scale=self.scaling[adapter],
                           p=p, cast=getattr(self, "cast_input_dtype_enabled", True),
                           fan_in_fan_out=bool(self.fan_in_fan_out), config=cfg, stats=self.actzip_stats)

    def __repr__(self) -> str:
        return f"actzip[{self.actzip_config.method}]." + super().__repr__()


def unsupported_reason(module: nn.Module) -> str | None:
    """Why a peft LoRA layer cannot be compressed (None when it can)."""
    if not isinstance(module, lora_layer.Linear):
        return f"{type(module).__name__} layers are not supported (only lora.Linear over nn.Linear or Conv1D)"
    if type(module) not in (lora_layer.Linear, CompressedLoraLinear):
        return f"{type(module).__name__} (a specialised lora.Linear) is not supported"
    base = module.get_base_layer()
    transposed = bool(getattr(module, "fan_in_fan_out", False))
    if type(base) is nn.Linear:
        if transposed:
            return "fan_in_fan_out=True over an nn.Linear (its weight is not stored transposed)"
    elif type(base) is Conv1D:
        if not transposed:
            return "fan_in_fan_out=False over a Conv1D (whose weight is stored transposed)"
    else:
        return f"base layer {type(base).__name__} is not an nn.Linear or a transformers Conv1D (quantized weights?)"
    if base.weight.requires_grad:
        return "base weight requires grad (its gradient needs X)"
    variants = sorted(set(module.lora_variant))
    if variants:
        return f"adapter(s) {variants} use a LoRA variant (DoRA, ...)"
    custom = [n for n, d in module.lora_dropout.items() if not isinstance(d, (nn.Dropout, nn.Identity))]
    if custom:
        return f"adapter(s) {custom} have a custom dropout module"
    return None


def _mask_hooks(owner: nn.Module) -> list:
    """Pre/post hooks on ``owner``'s forward that put its ``attention_mask`` argument in a row_mask block."""
    try:
        sig = inspect.signature(owner.forward)
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

    return [owner.register_forward_pre_hook(pre, with_kwargs=True),
            owner.register_forward_hook(post, with_kwargs=True, always_call=True)]


def attention_mask_owner(model: nn.Module) -> nn.Module:
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


def _put_back(module: nn.Module, cls: type, config: LoRAConfig | None, stats: dict | None) -> None:
    """Undo one compress_ of a layer: its class, config and counters as they were before."""
    module.__class__ = cls
    if config is None:
        for attr in ("actzip_config", "actzip_stats"):
            module.__dict__.pop(attr, None)
    else:
        module.actzip_config, module.actzip_stats = config, stats


def _unfreeze(weights: list[torch.Tensor]) -> None:
    for w in weights:
        w.requires_grad_(True)


def _remove_hooks(model: nn.Module) -> None:
    for handle in model.__dict__.pop(HOOKS_ATTR, []):
        handle.remove()


def compress_peft_model(model: nn.Module, config: LoRAConfig, filter_fn: FilterFn | None,
                        report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`~actzip.memory.lora.LoRAConfig` for a peft model (see the module doc).

    A layer compressed before gets the new config (``restore_`` gives the earlier one back). ``"fa"`` freezes the
    ``lora_A`` weights that were trainable; ``restore_`` unfreezes them.
    """
    if not any(isinstance(m, LoraLayer) for m in model.modules()):
        raise ConfigError(f"compress_(LoRAConfig): {type(model).__name__} has no peft LoRA layers; wrap it with "
                          "peft.get_peft_model first, or use actzip.memory.lora.LoRALinear")

    def candidate(module: nn.Module, fqn: str):
        if not isinstance(module, LoraLayer):
            return False
        why = unsupported_reason(module)
        return True if why is None else PLAIN + why

    frozen: list[torch.Tensor] = []
    taken = list(walk(model, candidate, filter_fn, report))
    for fqn, module in taken:
        before = module.__dict__
        add_undo(model, functools.partial(_put_back, module, type(module), before.get("actzip_config"),
                                          before.get("actzip_stats")))
        module.__class__ = CompressedLoraLinear
        module.actzip_config = config
        module.actzip_stats = {}
        if config.method == "fa":
            for lin in module.lora_A.values():
                if lin.weight.requires_grad:
                    lin.weight.requires_grad_(False)
                    frozen.append(lin.weight)
        base = "Conv1D" if module.fan_in_fan_out else "Linear"
        report.swapped.append((fqn, f"CompressedLoraLinear (method {config.method!r}, {base} base)"))
    if frozen:
        add_undo(model, functools.partial(_unfreeze, frozen))
        report.notes.append(f"method 'fa' froze {len(frozen)} lora_A weight(s) (restore_ unfreezes them)")
    if taken and config.use_attention_mask and HOOKS_ATTR not in model.__dict__:
        owner = attention_mask_owner(model)
        model.__dict__[HOOKS_ATTR] = _mask_hooks(owner)
        add_undo(model, functools.partial(_remove_hooks, model))
        report.notes.append(f"the fit leaves out padding rows, read from {type(owner).__name__}.forward's "
                            "attention_mask")
