"""What one replica put into its gradient collectives, and how long it spent inside them.

The bytes are what the link model prices; the time inside the collectives (``wait_s``: from the call to its
completion, the transfer and the wait for the other replicas) is what the link model replaces with its own
wire time, so the rest of a sync's measured time is the host's own work (encoding, decoding, staging copies).
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["DPMeter"]


@dataclass
class DPMeter:
    """What one replica contributed to its gradient collectives, against the buckets' own bytes."""

    payload_bytes: int = 0  # bytes this replica put into collectives
    dense_bytes: int = 0  # bytes of the buckets themselves (what a plain all-reduce would contribute)
    buckets: int = 0  # bucket syncs
    by_collective: dict[str, int] = field(default_factory=dict)  # payload bytes per collective kind
    fallback_buckets: int = 0  # bucket syncs sent plain because the method could not take them
    # seconds inside the collectives, from each call to its completion (transfer and wait for the peers):
    # kept by GradSync, OuterSync, sync_factored_grads and the top-k and quant hooks (under DDP the all-reduce
    # hooks' collectives complete inside DDP, untimed)
    wait_s: float = 0.0

    def add(self, collective: str, nbytes: int) -> None:
        self.payload_bytes += nbytes
        self.by_collective[collective] = self.by_collective.get(collective, 0) + nbytes

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the time of the block (a collective and its completion) into ``wait_s``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.wait_s += time.perf_counter() - t0

    @property
    def ratio(self) -> float:
        """Dense bytes over payload bytes (the compression factor; 1 for a plain all-reduce)."""
        return self.dense_bytes / self.payload_bytes if self.payload_bytes else 0.0
