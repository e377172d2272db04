"""Where codecs meet autograd: the compressed activation cache."""

from actzip.memory.account import RuleStats, StepAccount
from actzip.memory.rules import CacheConfig, Rule, count_only_rules, default_rules
from actzip.memory.saved import ActivationCache

__all__ = ["ActivationCache", "CacheConfig", "Rule", "RuleStats", "StepAccount", "count_only_rules", "default_rules"]
