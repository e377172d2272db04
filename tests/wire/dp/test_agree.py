"""Replicas configured differently are refused on every replica before their first collective, never hung."""

import torch.nn as nn
from gloo_ranks import run_ranks


def _configure(rank, world, what):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from actzip.errors import ConfigError
    from actzip.wire.dp import DeMo, DPConfig, OuterConfig, OuterSync, attach

    model = nn.Linear(4, 3)
    try:
        if what == "attach":
            attach(DDP(model), DPConfig(method="topk" if rank else "allreduce"))
        elif what == "outer":
            OuterSync(model, OuterConfig(local_steps=2 + rank))
        elif what == "demo":
            DeMo(model.parameters(), chunk=8, topk=1 + rank)
        else:  # the same configuration everywhere: accepted
            attach(DDP(model), DPConfig(method="topk"))
    except ConfigError as e:
        return str(e)
    return "accepted"


def test_mismatched_configurations_are_refused_on_every_replica():
    for what, who in (("attach", "DP attach"), ("outer", "OuterSync"), ("demo", "DeMo")):
        reports = run_ranks(_configure, 2, what)
        assert all(r[0] == "ok" and who in r[1] and "differ" in r[1] for r in reports), (what, reports)
    assert [r[1] for r in run_ranks(_configure, 2, "same")] == ["accepted", "accepted"]
