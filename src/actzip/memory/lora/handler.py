"""``compress_`` for :class:`LoRAConfig`: peft LoRA layers keep compressed activations; ``restore_`` undoes it."""

from __future__ import annotations

import importlib.util

from torch import nn

from actzip.api import CompressReport, FilterFn, register_handler
from actzip.errors import MissingDependencyError
from actzip.memory.lora.config import LoRAConfig

__all__ = ["compress_lora_layers"]


@register_handler(LoRAConfig)
def compress_lora_layers(model: nn.Module, config: LoRAConfig, filter_fn: FilterFn | None,
                         report: CompressReport) -> None:
    """Make every supported peft LoRA layer of ``model`` keep what ``config`` says (see
    :func:`actzip.memory.lora.peft.compress_peft_model`); layers it cannot take stay plain LoRA, with the reason
    in ``report.skipped``."""
    missing = [name for name in ("peft", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingDependencyError(f"compress_(LoRAConfig) works on peft LoRA models and needs {' and '.join(missing)}"
                                     ": pip install 'actzip[hf]' (without peft, use actzip.memory.lora.LoRALinear)")
    from actzip.memory.lora.peft import compress_peft_model  # peft is optional: imported only when it is used

    compress_peft_model(model, config, filter_fn, report)
