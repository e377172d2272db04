"""Where codecs meet autograd: the compressed activation cache and fused ReLU / ReLU² MLPs."""

from actzip.memory.account import RuleStats, StepAccount
from actzip.memory.apply import CompressReport, SparseMLPConfig, compress_, register_handler
from actzip.memory.fp8_linear import Fp8Linear, fp8_linears_
from actzip.memory.linear import SketchedLinear, sketch_linears_
from actzip.memory.presets import PRESETS, compressed, preset_rules
from actzip.memory.relu_mlp import SparseGatedReLUMLP, SparseReLU, SparseReLUMLP
from actzip.memory.roles import RoleTracker, current_role
from actzip.memory.rules import CacheConfig, Rule, count_only_rules, default_rules
from actzip.memory.saved import ActivationCache, current_cache, record_external

__all__ = [
    "ActivationCache",
    "CacheConfig",
    "CompressReport",
    "Fp8Linear",
    "PRESETS",
    "RoleTracker",
    "Rule",
    "RuleStats",
    "SketchedLinear",
    "SparseGatedReLUMLP",
    "SparseMLPConfig",
    "SparseReLU",
    "SparseReLUMLP",
    "StepAccount",
    "compress_",
    "compressed",
    "count_only_rules",
    "current_cache",
    "current_role",
    "default_rules",
    "fp8_linears_",
    "preset_rules",
    "record_external",
    "register_handler",
    "sketch_linears_",
]
