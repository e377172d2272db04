"""``compress_(model, NormRebuildConfig())``: norm outputs rebuilt in backward instead of kept, in any model.

What it does (also what :class:`~actzip.memory.modules.SparseMLPConfig` does with its MLPs, ``rebuild_norms``):

- every transformers RMSNorm whose form :func:`~actzip.memory.modules.rms_norm.exact_form` recognizes is swapped
  for an :class:`~actzip.memory.modules.rms_norm.ExactRMSNorm` (the same bits; keeps its input and one float32
  scale per row);
- every other norm (``nn.LayerNorm``, ``nn.RMSNorm``, transformers ``*RMSNorm`` / ``*LayerNorm``) marks its output
  (:func:`~actzip.memory.modules.norm_rebuild.mark_norm_outputs`);
- every ``nn.Linear`` / ``Conv1D`` fed a norm output keeps a rebuild handle in place of it
  (:func:`~actzip.memory.modules.norm_rebuild.rebuild_projection_inputs`), and with ``rebuild_mamba_projections``
  every transformers Mamba mixer rebuilds its in-projection output too
  (:func:`~actzip.memory.modules.norm_rebuild.rebuild_mamba_in_projections`).

Gradients stay bit-identical. It composes with ``actzip.cache``: a rebuilt tensor is stored in 0 bytes (account
rule ``rebuilt``) and the rest goes to the cache's rules, so a Llama-style model under a lossy preset or the
sketch no longer keeps its norms' outputs. Applied once per model; ``restore_`` undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from actzip.api import CompressReport, Config, FilterFn, add_undo, register_handler, replace_module
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.modules.norm_rebuild import (
    is_norm,
    mark_norm_outputs,
    rebuild_mamba_in_projections,
    rebuild_projection_inputs,
)
from actzip.memory.modules.relu_mlp import SparseGatedReLUMLP, SparseReLUMLP
from actzip.memory.modules.rms_norm import ExactRMSNorm, exact_form, is_hf_rms_norm

__all__ = ["NormRebuildConfig", "hook_norms"]

_NORMS_HOOKED = "actzip_norms_marked"  # set on a model whose norms compress_ hooked


@dataclass
class NormRebuildConfig(Config):
    """Rebuild norm outputs in backward instead of keeping them, exactly (see the module docstring)."""

    # a transformers Mamba mixer's in-projection output, which its fused scan keeps whole, rebuilt in backward by
    # the same matmul on the rebuilt norm output (one in-projection more per mixer in backward)
    rebuild_mamba_projections: bool = True

    def validate(self) -> None:
        if not isinstance(self.rebuild_mamba_projections, bool):
            raise ConfigError("NormRebuildConfig.rebuild_mamba_projections must be True or False, got "
                              f"{self.rebuild_mamba_projections!r}")


def _swap_exact_norms(model: nn.Module, report: CompressReport) -> int:
    """Swap each transformers RMSNorm whose forward :func:`exact_form` recognizes for an :class:`ExactRMSNorm`;
    the count swapped (the others are left to the norm hooks, and the report says why)."""
    swapped = 0
    for fqn, module in list(model.named_modules()):
        if not is_hf_rms_norm(module):
            continue
        form = exact_form(module)
        if form is None:
            report.notes.append(f"rebuild_norms: {fqn} ({type(module).__name__}, {module.weight.dtype}) is not one of "
                                "the RMSNorm forms computed exactly; its output is rebuilt by its own forward")
            continue
        replace_module(model, fqn, ExactRMSNorm(module, form), report, f"ExactRMSNorm({form})")
        swapped += 1
    return swapped


def hook_norms(model: nn.Module, report: CompressReport, mamba_projections: bool) -> list[str] | None:
    """Swap the transformers RMSNorms it can for exact lean ones, mark the other norms' outputs and hook their
    consumers (once per model, undone by restore_); the names of the norms marked, or None if ``model`` has no
    norm or its norms were hooked already (the report says so)."""
    if getattr(model, _NORMS_HOOKED, False):
        report.skipped.append(("", "its norms were hooked by an earlier compress_"))
        return None
    n_exact = _swap_exact_norms(model, report)
    marked = [fqn for fqn, m in model.named_modules() if is_norm(m)]
    handles = mark_norm_outputs(model)
    n_norms = len(marked)
    if not handles and not n_exact:
        return None
    projections = rebuild_projection_inputs(model, skip=(SparseReLUMLP, SparseGatedReLUMLP))
    mixers = rebuild_mamba_in_projections(model) if mamba_projections else []  # after: its block opens last
    handles += projections + mixers
    setattr(model, _NORMS_HOOKED, True)

    def undo() -> None:
        for h in handles:
            h.remove()
        delattr(model, _NORMS_HOOKED)

    add_undo(model, undo)
    if n_exact:
        report.notes.append(f"rebuild_norms: {n_exact} transformers RMSNorm(s) swapped for ExactRMSNorm (the same "
                            "bits; keeps its input and one float32 scale per row, its output rebuilt in one pass)")
    report.notes.append(f"rebuild_norms: {n_norms} other norm(s) mark their outputs; {len(projections) // 2} "
                        "projection(s) (nn.Linear / Conv1D) and any fused MLP fed a norm output rebuild it in backward "
                        "instead of keeping it")
    if mixers:
        report.notes.append(f"rebuild_mamba_projections: {len(mixers) // 2} Mamba mixer(s) rebuild their in-projection "
                            "output in backward (one matmul more each) instead of keeping it")
    return marked


@register_handler(NormRebuildConfig)
def rebuild_norm_outputs(model: nn.Module, config: NormRebuildConfig, filter_fn: FilterFn | None,
                         report: CompressReport) -> None:
    """The ``compress_`` handler of :class:`NormRebuildConfig` (``filter_fn`` is not consulted: a norm's consumers
    anywhere in the model must agree on whether its output is kept)."""
    if filter_fn is not None:
        report.notes.append("NormRebuildConfig: filter_fn is not consulted (every norm of the model is hooked)")
    if getattr(model, _NORMS_HOOKED, False):
        report.skipped.append(("", "its norms were hooked by an earlier compress_"))
        return  # compress_ raises NothingToCompressError with that reason
    marked = hook_norms(model, report, config.rebuild_mamba_projections)
    if marked is None:
        raise NothingToCompressError(f"compress_(NormRebuildConfig): {type(model).__name__} has no norm to rebuild "
                                     "(nn.LayerNorm, nn.RMSNorm, transformers *RMSNorm / *LayerNorm)")
    report.swapped.extend((fqn, "output marked, rebuilt in backward by its consumers") for fqn in marked)
