"""The previous release's LoRA entry points, kept for one release: ``apply`` / ``remove`` and their report.

``apply(model, method, **options)`` is ``actzip.compress_(model, LoRAConfig(method, **options))`` returning a
:class:`LoRAReport` (and warning once per reason a layer stays plain LoRA); ``remove(model)`` is
``actzip.restore_(model)``, which also unfreezes the ``lora_A`` weights method ``"fa"`` froze.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from torch import nn

from actzip.api import APPLIED_ATTR, compress_, restore_
from actzip.compat import deprecated
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.lora.config import LORA_METHODS, LoRAConfig
from actzip.memory.lora.fit import cached_gaussian_projection

__all__ = ["OLD_VALUES", "LoRACompression", "LoRAReport", "apply", "apply_", "remove", "remove_", "sketch_matrix"]


@dataclass
class LoRAReport:
    """What the deprecated ``apply`` did: the layers compressed and those left as plain LoRA, with the reason.

    ``actzip.compress_`` returns an :class:`actzip.api.CompressReport` instead.
    """

    method: str  # the LoRA method applied: "care", "fa" or "lora"
    compressed: list[str] = field(default_factory=list)  # names of the layers now compressed
    plain: list[tuple[str, str]] = field(default_factory=list)  # (layer name, why it stays plain LoRA)
    frozen_a: int = 0  # lora_A weights frozen by method "fa"

    def lines(self) -> list[str]:
        head = (f"actzip.lora ({self.method}): {len(self.compressed)} LoRA layers compressed, "
                f"{len(self.plain)} left as plain LoRA")
        return [head] + [f"  {name}: left as plain LoRA: {why}" for name, why in self.plain]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _trainable_lora_a(model: nn.Module) -> int:
    return sum(1 for n, p in model.named_parameters() if "lora_A" in n and p.requires_grad)


def _apply(model: nn.Module, method: str = "care", **options) -> LoRAReport:
    fields = set(LoRAConfig.__dataclass_fields__) - {"method"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ConfigError(f"actzip.lora.apply: unknown option(s) {unknown}; LoRAConfig's options: {sorted(fields)}")
    config = LoRAConfig(method=method, **options)
    trainable = _trainable_lora_a(model)
    result = LoRAReport(method=method)
    try:
        report = compress_(model, config)
    except NothingToCompressError:  # the old entry point compressed nothing and reported why, without raising
        from peft.tuners.lora.layer import LoraLayer  # peft is optional

        from actzip.memory.lora.peft import unsupported_reason

        result.plain = [(n, unsupported_reason(m)) for n, m in model.named_modules()
                        if isinstance(m, LoraLayer) and unsupported_reason(m)]
    else:
        from actzip.memory.lora.peft import PLAIN

        result.compressed = [n for n, _ in report.swapped]
        result.plain = [(n, why.removeprefix(PLAIN)) for n, why in report.skipped]
        result.frozen_a = trainable - _trainable_lora_a(model)
    by_reason: dict[str, list[str]] = {}
    for name, why in result.plain:
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        warnings.warn(f"actzip.lora.apply: {len(names)} layer(s) left as plain LoRA ({names[0]}, ...): {why}",
                      stacklevel=3)
    return result


def _remove(model: nn.Module) -> int:
    from actzip.memory.lora.peft import CompressedLoraLinear  # peft is optional

    n = sum(1 for m in model.modules() if type(m) is CompressedLoraLinear)
    if model.__dict__.get(APPLIED_ATTR):
        restore_(model)
    return n


NEW_APPLY = "actzip.compress_(model, actzip.memory.lora.LoRAConfig(method=..., ...))"
apply = deprecated(_apply, "actzip.lora.apply", NEW_APPLY)
apply_ = deprecated(_apply, "actzip.memory.lora_peft.apply_", NEW_APPLY)
remove = deprecated(_remove, "actzip.lora.remove", "actzip.restore_(model)")
remove_ = deprecated(_remove, "actzip.memory.lora_peft.remove_", "actzip.restore_(model)")
LoRACompression = deprecated(LoRAConfig, "actzip.memory.lora.LoRACompression", "actzip.memory.lora.LoRAConfig")
sketch_matrix = deprecated(cached_gaussian_projection, "actzip.memory.lora.sketch_matrix",
                           "actzip.memory.lora.cached_gaussian_projection")

# old names of plain values (no call to hook a warning on): the package's __getattr__ serves them, warning once
OLD_VALUES = {"METHODS": (LORA_METHODS, "actzip.memory.lora.LORA_METHODS")}
