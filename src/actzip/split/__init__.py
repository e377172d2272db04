"""Split learning: a client's modalities compressed under one uplink budget.

- :mod:`actzip.split.shapley`: Shapley contribution scores of modalities from server-side coalitions
  (:func:`shapley`: exact up to 8 modalities, permutation-sampled beyond, with standard errors).
- :mod:`actzip.split.allocation`: keep-ratios whose expected payload equals the budget exactly
  (:func:`keep_ratios`, ModalShare's, from the scores; :func:`equal_keep_ratios`, the baseline).
"""

from actzip.split.allocation import KeepRatios, equal_keep_ratios, keep_ratios
from actzip.split.shapley import EXACT_MAX, ShapleyScores, shapley

__all__ = ["EXACT_MAX", "KeepRatios", "ShapleyScores", "equal_keep_ratios", "keep_ratios", "shapley"]
