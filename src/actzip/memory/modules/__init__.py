"""Modules that keep less for backward, swapped in by ``actzip.compress_``, and undone by ``actzip.restore_``.

- :mod:`.relu_mlp`: fused ReLU / ReLU² MLPs keeping only the lossless sparse payload of ReLU's output;
  :mod:`.sparse_mlp_config`: :class:`SparseMLPConfig`, which swaps them in (``arena="auto"`` for no host sync);
- :mod:`.rms_norm`: :class:`ExactRMSNorm`, transformers' RMSNorms with the same bits, keeping only their input and
  one scale per row; :mod:`.norm_rebuild` rebuilds norm outputs and Mamba in-projections for the layers that read
  them; :mod:`.norm_rebuild_config`: :class:`NormRebuildConfig`, which does both on any model (and
  :class:`SparseMLPConfig` with its MLPs);
- :mod:`.activation_derivative`: :class:`DerivativeActivation`, a GELU / SiLU keeping its derivative for backward
  instead of its input (a linear input to the cache's rules); :mod:`.activation_derivative_config`:
  :class:`DerivativeActivationConfig`, which swaps them in;
- :mod:`.arena`: the preallocated device buffer those payloads can live in, and :class:`GraphedStep`;
- :mod:`.fp8_linear`: :class:`Fp8Linear`, float8 matmuls in forward and backward (:class:`Fp8LinearConfig`);
- :mod:`.sketched_linear`: :class:`SketchedLinear`, a random sketch of the input instead of the input
  (:class:`SketchedLinearConfig`).
"""

from actzip import compat
from actzip.api import CompressReport, compress_, restore_
from actzip.memory.modules.activation_derivative import DerivativeActivation
from actzip.memory.modules.activation_derivative_config import DerivativeActivationConfig
from actzip.memory.modules.arena import Arena, GraphedStep
from actzip.memory.modules.fp8_linear import Fp8Linear, Fp8LinearConfig
from actzip.memory.modules.norm_rebuild_config import NormRebuildConfig
from actzip.memory.modules.relu_mlp import SparseGatedReLUMLP, SparseReLU, SparseReLUMLP
from actzip.memory.modules.rms_norm import ExactRMSNorm
from actzip.memory.modules.sketched_linear import SketchedLinear, SketchedLinearConfig
from actzip.memory.modules.sparse_mlp_config import SparseMLPConfig, arena_of, mlp_layout

# The module paths of the previous release.
compat.MOVED_MODULES.update({
    "actzip.memory.apply": "actzip.memory.modules",
    "actzip.memory.arena": "actzip.memory.modules.arena",
    "actzip.memory.fp8_linear": "actzip.memory.modules.fp8_linear",
    "actzip.memory.linear": "actzip.memory.modules.sketched_linear",
    "actzip.memory.relu_mlp": "actzip.memory.modules.relu_mlp",
})

__all__ = [
    "Arena",
    "DerivativeActivation",
    "DerivativeActivationConfig",
    "CompressReport",
    "ExactRMSNorm",
    "Fp8Linear",
    "Fp8LinearConfig",
    "GraphedStep",
    "NormRebuildConfig",
    "SketchedLinear",
    "SketchedLinearConfig",
    "SparseGatedReLUMLP",
    "SparseMLPConfig",
    "SparseReLU",
    "SparseReLUMLP",
    "arena_of",
    "compress_",
    "mlp_layout",
    "restore_",
]
