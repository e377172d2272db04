"""Replicas check that they run the same data-parallel configuration before their first collective: a
replica configured otherwise would send buffers of other shapes or take part in other collectives, and the
others would wait on it forever."""

import torch
import torch.distributed as dist

from actzip.errors import ConfigError
from actzip.wire.transport import config_hash

__all__ = ["check_same_config"]


def check_same_config(who: str, config: dict, group) -> None:
    """Raise :class:`ConfigError` on every replica of ``group`` unless all hold the same ``config`` (JSON-able)."""
    mine, raw = config_hash(config)
    world = dist.get_world_size(group)
    # int64 holds the hash's low 63 bits: enough to tell configurations apart
    local = torch.tensor([mine & ((1 << 63) - 1)], dtype=torch.int64)
    hashes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(hashes, local, group=group)
    values = [int(h) for h in hashes]
    if len(set(values)) > 1:
        odd = [r for r, h in enumerate(values) if h != values[0]]
        raise ConfigError(f"{who}: the replicas' configurations differ (replicas {odd} differ from replica 0; this "
                          f"one's is {raw.decode()[:300]}); every replica must use the same one")
