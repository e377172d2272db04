"""LoRA fine-tuning with compressed activations.

With LoRA the weights are small and what autograd saves is the memory that remains. One call on a peft model::

    import actzip.lora
    report = actzip.lora.apply(peft_model, method="care", lam=1e-6)   # or "fa" (LoRA-FA), "lora" (exact)
    print(report)                                                      # what was compressed, what stayed plain

or, without peft, :class:`LoRALinear` around an ``nn.Linear``. Methods, guarantees and costs:
:mod:`actzip.memory.lora` and docs/lora.md.
"""

from __future__ import annotations

from actzip.memory.lora import (
    METHODS,
    LoRACompression,
    LoRALinear,
    LoRALinearFunction,
    fit_reconstruction,
    lora_linear,
    row_mask,
    saved_bytes_by_module,
    sketch_matrix,
)

__all__ = [
    "METHODS",
    "LoRACompression",
    "LoRALinear",
    "LoRALinearFunction",
    "apply",
    "fit_reconstruction",
    "lora_linear",
    "remove",
    "row_mask",
    "saved_bytes_by_module",
    "sketch_matrix",
]


def apply(model, method: str = "care", **options):
    """Compress every supported LoRA layer of a peft model in place; returns a :class:`LoRAReport`.

    ``options``: ``lam``, ``fit_chunk_rows``, ``extra_rank``, ``dropout_mask`` (see :class:`LoRACompression`),
    ``use_attention_mask``.
    Needs peft.
    """
    from actzip.memory.lora_peft import apply_

    return apply_(model, method, **options)


def remove(model) -> int:
    """Undo :func:`apply`; returns the number of layers restored to peft's ``lora.Linear``."""
    from actzip.memory.lora_peft import remove_

    return remove_(model)


def __getattr__(name: str):
    if name == "LoRAReport":  # lives with the peft adapter: imported on first use, so peft stays optional
        from actzip.memory.lora_peft import LoRAReport

        return LoRAReport
    raise AttributeError(f"module 'actzip.lora' has no attribute {name!r}")
