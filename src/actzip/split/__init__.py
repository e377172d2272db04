"""Split learning: a client's modalities compressed under one uplink budget.

- :mod:`actzip.split.shapley`: Shapley contribution scores of modalities from server-side coalitions
  (:func:`shapley`: exact up to 8 modalities, permutation-sampled beyond, with standard errors).
- :mod:`actzip.split.allocation`: keep-ratios whose expected payload equals the budget exactly
  (:func:`keep_ratios`, ModalShare's, from the scores; :func:`equal_keep_ratios`, the baseline).
- :mod:`actzip.split.uplink`: a modality's activations through a compressor at its keep-ratio (random mask,
  top-k, SL-FAC's ``dct``, uniform ``quant``), the gradient back by the compressor's rule, bytes each way
  (:func:`send`; :func:`pack` / :func:`unpack` / :func:`pack_grad` / :func:`unpack_grad`, its wire form).
- :mod:`actzip.split.runtime`: clients and a server over the wire transport (:class:`SplitClient`,
  :class:`SplitServer`, :class:`SplitConfig`), in one process or under torchrun; SplitFed's :func:`fed_average`.
"""

from actzip.split.allocation import KeepRatios, equal_keep_ratios, keep_ratios
from actzip.split.shapley import EXACT_MAX, ShapleyScores, shapley
from actzip.split.runtime import SplitClient, SplitConfig, SplitServer, fed_average
from actzip.split.uplink import COMPRESSORS, Link, Sent, pack, pack_grad, send, unpack, unpack_grad

__all__ = ["COMPRESSORS", "EXACT_MAX", "KeepRatios", "Link", "Sent", "ShapleyScores", "SplitClient", "SplitConfig",
           "SplitServer", "equal_keep_ratios", "fed_average", "keep_ratios", "pack", "pack_grad", "send", "shapley",
           "unpack", "unpack_grad"]
