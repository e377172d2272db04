"""The activation cache: compress the tensors autograd saves for backward, ``actzip.cache(preset_or_config)``.

- :mod:`~actzip.memory.cache.context`: :class:`CacheContext`, the ``with`` block over the saved-tensor hooks, and
  :func:`cache`, which builds one from a preset name or a :class:`CacheConfig`;
- :mod:`~actzip.memory.cache.config`: :class:`CacheConfig`, the preset and the options of its rules;
- :mod:`~actzip.memory.cache.presets`: the cache presets (``lossless``, ``balanced``, ``4bit``, ...);
- :mod:`~actzip.memory.cache.rules`: :class:`Rule`, which codec a saved tensor is stored with;
- :mod:`~actzip.memory.cache.roles`: which torch function saved a tensor, for rules by role;
- :mod:`~actzip.memory.cache.account`: :class:`StepAccount`, the bytes of one block, by rule;
- :mod:`~actzip.memory.cache.offload`: stored tensors in pinned CPU memory;
- :mod:`~actzip.memory.cache.rebuild`: saved tensors made again in backward instead of stored;
- :mod:`~actzip.memory.cache.stored`: what autograd holds for a stored activation, shared by its saves;
- :mod:`~actzip.memory.cache.active`: the open caches, and bytes kept outside their hooks.
- :mod:`~actzip.memory.cache.compiled`: tensors torch.compile'd graphs save, kept uncompressed for now.
"""

from actzip import compat
from actzip.memory.cache.account import RuleStats, StepAccount
from actzip.memory.cache.active import current_cache, record_external
from actzip.memory.cache.config import CacheConfig, preset_names, register_preset
from actzip.memory.cache.context import CacheContext, cache
from actzip.memory.cache.offload import OffloadConfig, Offloader
from actzip.memory.cache.presets import PRESETS, describe, preset_rules
from actzip.memory.cache.rebuild import rebuild_saved, recompute
from actzip.memory.cache.roles import ROLES, RoleTracker, current_role
from actzip.memory.cache.rules import Rule, count_only_rules, default_rules, mostly_zero_rules

# Where each module of the cache lived before it had a package of its own.
compat.MOVED_MODULES.update({
    "actzip.memory.saved": "actzip.memory.cache.context",
    "actzip.memory.rules": "actzip.memory.cache.rules",
    "actzip.memory.roles": "actzip.memory.cache.roles",
    "actzip.memory.presets": "actzip.memory.cache.presets",
    "actzip.memory.account": "actzip.memory.cache.account",
    "actzip.memory.offload": "actzip.memory.cache.offload",
    "actzip.memory.rebuild": "actzip.memory.cache.rebuild",
    "actzip.memory.handout": "actzip.memory.cache.stored",
})

__all__ = [
    "CacheConfig",
    "CacheContext",
    "OffloadConfig",
    "Offloader",
    "PRESETS",
    "ROLES",
    "RoleTracker",
    "Rule",
    "RuleStats",
    "StepAccount",
    "cache",
    "count_only_rules",
    "current_cache",
    "current_role",
    "default_rules",
    "describe",
    "mostly_zero_rules",
    "preset_names",
    "preset_rules",
    "rebuild_saved",
    "recompute",
    "record_external",
    "register_preset",
]
