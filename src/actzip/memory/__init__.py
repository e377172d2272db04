"""Where codecs meet autograd: the compressed activation cache and fused ReLU / ReLU² MLPs."""

from actzip import compat
from actzip.memory import cache
from actzip.memory.cache import (
    PRESETS,
    CacheConfig,
    CacheContext,
    Rule,
    RuleStats,
    StepAccount,
    count_only_rules,
    current_cache,
    current_role,
    default_rules,
    preset_rules,
    record_external,
)
from actzip.memory.cache.context import ActivationCache  # deprecated alias, warns once
from actzip.memory.cache.presets import compressed  # deprecated alias, warns once
from actzip.api import CompressReport, compress_, register_handler, restore_
from actzip.memory.modules import (
    Arena,
    Fp8Linear,
    Fp8LinearConfig,
    GraphedStep,
    NormRebuildConfig,
    SketchedLinear,
    SketchedLinearConfig,
    SparseGatedReLUMLP,
    SparseMLPConfig,
    SparseReLU,
    SparseReLUMLP,
    arena_of,
)
from actzip.memory.lora import LoRAConfig, LoRALinear
from actzip.memory.planner import Plan, PlannerConfig, plan_of
from actzip.memory.modules.fp8_linear import fp8_linears_  # deprecated alias, warns once
from actzip.memory.modules.sketched_linear import sketch_linears_  # deprecated alias, warns once

# deprecated alias, warns once: actzip.cache(...) tracks roles itself when its rules ask for them
RoleTracker = compat.deprecated(cache.RoleTracker, "actzip.memory.RoleTracker", "actzip.cache(...)")

__all__ = [
    "plan_of",
    "ActivationCache",
    "Arena",
    "CacheConfig",
    "CacheContext",
    "CompressReport",
    "Fp8Linear",
    "Fp8LinearConfig",
    "NormRebuildConfig",
    "GraphedStep",
    "LoRAConfig",
    "LoRALinear",
    "PRESETS",
    "Plan",
    "PlannerConfig",
    "RoleTracker",
    "Rule",
    "RuleStats",
    "SketchedLinear",
    "SketchedLinearConfig",
    "SparseGatedReLUMLP",
    "SparseMLPConfig",
    "SparseReLU",
    "SparseReLUMLP",
    "StepAccount",
    "arena_of",
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
    "restore_",
    "sketch_linears_",
]
