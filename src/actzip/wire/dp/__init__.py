"""Data-parallel gradient sync with compression (DDP communication hooks), every byte metered."""

from actzip.wire.dp.hooks import DP_METHODS, DPConfig, DPMeter, attach

__all__ = ["DP_METHODS", "DPConfig", "DPMeter", "attach"]
