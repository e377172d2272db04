"""Data-parallel sync with compression: DDP communication hooks every step, or an outer step every H steps
(DiLoCo-style, a compressed pseudo-gradient); every byte metered."""

from actzip.wire.dp.hooks import DP_METHODS, DPConfig, DPMeter, attach
from actzip.wire.dp.outer import OuterConfig, OuterMeter, OuterSync

__all__ = ["DP_METHODS", "DPConfig", "DPMeter", "OuterConfig", "OuterMeter", "OuterSync", "attach"]
