"""Data-parallel sync with compression: DDP communication hooks every step, or an outer step every H steps
(DiLoCo-style, a compressed pseudo-gradient), or an optimizer that shares only its momentum's fast DCT
components (DeMo-style); every byte metered."""

from actzip.wire.dp.cofactors import sync_factored_grads
from actzip.wire.dp.demo import DeMo, dct_matrix
from actzip.wire.dp.grad_sync import FlatBucket, GradSync
from actzip.wire.dp.hooks import DP_METHODS, DPConfig, attach
from actzip.wire.dp.meter import DPMeter
from actzip.wire.dp.outer import OuterConfig, OuterMeter, OuterSync

__all__ = ["DP_METHODS", "DPConfig", "DPMeter", "DeMo", "FlatBucket", "GradSync", "OuterConfig", "OuterMeter", "OuterSync", "attach",
           "dct_matrix", "sync_factored_grads"]
