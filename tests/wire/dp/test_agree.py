"""Replicas configured differently are refused on every replica before their first collective, never hung."""

import torch.nn as nn
from gloo_ranks import run_ranks


def _configure(rank, world):
    """Each case in turn on the same ranks: a refusal leaves the group usable for the next one."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from actzip.errors import ConfigError
    from actzip.wire.dp import DeMo, DPConfig, OuterConfig, OuterSync, attach

    cases = {"attach": lambda m: attach(DDP(m), DPConfig(method="topk" if rank else "allreduce")),
             "outer": lambda m: OuterSync(m, OuterConfig(local_steps=2 + rank)),
             "demo": lambda m: DeMo(m.parameters(), chunk=8, topk=1 + rank),
             "same": lambda m: attach(DDP(m), DPConfig(method="topk"))}  # the same everywhere: accepted
    said = {}
    for what, make in cases.items():
        try:
            make(nn.Linear(4, 3))
            said[what] = "accepted"
        except ConfigError as e:
            said[what] = str(e)
    return said


def test_mismatched_configurations_are_refused_on_every_replica():
    reports = run_ranks(_configure, 2)
    assert all(r[0] == "ok" for r in reports), reports
    for said in (r[1] for r in reports):
        for what, who in (("attach", "DP attach"), ("outer", "OuterSync"), ("demo", "DeMo")):
            assert who in said[what] and "differ" in said[what], (what, said)
        assert said["same"] == "accepted"
