"""LoRA fine-tuning with compressed activations: what autograd keeps of a LoRA linear is ``Z = X·Aᵀ``, not ``X``.

With LoRA the weights are small and what autograd saves is the memory that remains. One call on a peft model::

    import actzip
    from actzip.memory.lora import LoRAConfig

    report = actzip.compress_(peft_model, LoRAConfig(method="care"))   # or "fa" (LoRA-FA), "lora" (exact)
    print(report)                                                      # layers compressed, layers left and why
    actzip.restore_(peft_model)                                        # plain peft again

or, without peft, :class:`LoRALinear` around an ``nn.Linear``, or the functional :func:`lora_linear`.

Modules: :mod:`~actzip.memory.lora.config` (``LoRAConfig``), :mod:`~actzip.memory.lora.function` (the autograd
function: what each method keeps, and the exactness guarantees), :mod:`~actzip.memory.lora.fit` (CARE-LoRA's
fitted reconstruction), :mod:`~actzip.memory.lora.dropout`, :mod:`~actzip.memory.lora.rows` (padding rows),
:mod:`~actzip.memory.lora.module` (``LoRALinear``), :mod:`~actzip.memory.lora.peft` (the peft adapter, needs
peft), :mod:`~actzip.memory.lora.saved_bytes` (what each module saved). Costs and measurements: docs/lora.md.
"""

from __future__ import annotations

from actzip.compat import MOVED_MODULES, warn_once
from actzip.memory.lora.config import DROPOUT_MASKS, LORA_METHODS, LoRAConfig
from actzip.memory.lora.deprecated import (
    OLD_VALUES,
    LoRACompression,
    LoRAReport,
    apply,
    apply_,
    remove,
    remove_,
    sketch_matrix,
)
from actzip.memory.lora.dropout import dropout_backward_from_mask, dropout_with_mask
from actzip.memory.lora.fit import (
    cached_gaussian_projection,
    fit_group_moments,
    fit_moments,
    fit_reconstruction,
    orthonormal_rows,
    solve_ridge,
)
from actzip.memory.lora.function import LoRALinearFunction, lora_linear
from actzip.memory.lora.handler import compress_lora_layers
from actzip.memory.lora.module import LoRALinear
from actzip.memory.lora.rows import current_row_mask, row_mask
from actzip.memory.lora.saved_bytes import saved_bytes_by_module

# actzip.lora was a second module of this name; actzip.memory.lora_peft is now actzip.memory.lora.peft. Both
# old paths give this package, which keeps every old public name (the deprecated ones warn once).
MOVED_MODULES.update({"actzip.lora": "actzip.memory.lora", "actzip.memory.lora_peft": "actzip.memory.lora"})

_NEEDS_PEFT = {"CompressedLoraLinear", "unsupported_reason", "compress_peft_model"}

__all__ = [
    "DROPOUT_MASKS",
    "LORA_METHODS",
    "LoRAConfig",
    "LoRALinear",
    "LoRALinearFunction",
    "cached_gaussian_projection",
    "compress_lora_layers",
    "current_row_mask",
    "dropout_backward_from_mask",
    "dropout_with_mask",
    "fit_group_moments",
    "fit_moments",
    "fit_reconstruction",
    "lora_linear",
    "orthonormal_rows",
    "row_mask",
    "saved_bytes_by_module",
    "solve_ridge",
    # deprecated, for one release
    "LoRACompression",
    "LoRAReport",
    "apply",
    "apply_",
    "remove",
    "remove_",
    "sketch_matrix",
]


def __getattr__(name: str):
    if name in _NEEDS_PEFT:  # the peft adapter is imported on first use, so peft stays optional
        from actzip.memory.lora import peft as adapter

        return getattr(adapter, name)
    if name in OLD_VALUES:
        value, new = OLD_VALUES[name]
        warn_once(f"actzip.memory.lora.{name}", new)
        return value
    raise AttributeError(f"module 'actzip.memory.lora' has no attribute {name!r}")
