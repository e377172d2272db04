"""The memory-budget planner: per block, keep / checkpoint / a cache preset, chosen to fit a peak at least time.

``actzip.compress_(model, PlannerConfig(budget_bytes=..., probe=...))``; see :mod:`.config`.
"""

from actzip.memory.planner.config import PlannerConfig, plan_of, set_exposure
from actzip.memory.planner.plan import Plan, bucket_of, exposure_bucket
from actzip.memory.planner.solver import UnitCosts, minimum_peak, solve
from actzip.memory.planner.units import find_units, model_signature

__all__ = ["Plan", "PlannerConfig", "UnitCosts", "bucket_of", "exposure_bucket", "find_units", "minimum_peak",
           "model_signature", "plan_of", "set_exposure", "solve"]
