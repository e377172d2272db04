"""Gradient sync of a bare module on one flat bucket, on two gloo ranks: the DDP hooks' results, metered."""

import pytest
import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.errors import ConfigError
from actzip.wire.dp import DPConfig, GradSync, attach


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))


def _both(rank, world, method, options, steps):
    """Per step: the gradients DDP (one bucket, the same hook) gives, and GradSync's on the bare module."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(_model(), bucket_cap_mb=64)
    attach(ddp, DPConfig(method=method, **options))
    bare = _model()
    sync = GradSync(bare, DPConfig(method=method, **options))
    torch.manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        x = torch.randn(8, 16)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
        bare.zero_grad()
        bare(x).square().mean().backward()
        sync.sync()
        out.append(([p.grad.numpy().copy() for p in ddp.parameters()],
                    [p.grad.numpy().copy() for p in bare.parameters()]))
    return out, sync.meter.payload_bytes, sync.meter.dense_bytes, sync.syncs


def _ok(reports):
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


@pytest.mark.parametrize("method,options", [("allreduce", {}), ("bf16", {}), ("topk", {"keep": 0.05})])
def test_flat_bucket_gives_what_the_ddp_hook_gives(method, options):
    runs = _ok(run_ranks(_both, 2, method, options, 3))
    for steps, payload, dense, syncs in runs:
        assert syncs == 3
        for ddp_grads, bare_grads in steps:
            for a, b in zip(ddp_grads, bare_grads):
                assert (a == b).all(), method
    if method == "allreduce":
        assert runs[0][1] == runs[0][2]
    else:
        assert runs[0][1] < runs[0][2]


def test_powersgd_on_one_flat_bucket_agrees_across_replicas_and_compresses():
    runs = _ok(run_ranks(_both, 2, "powersgd", {"rank": 2, "start_iter": 2}, 5))
    (steps0, payload, dense, _), (steps1, *_) = runs
    for (_, g0), (_, g1) in zip(steps0, steps1):
        assert all((a == b).all() for a, b in zip(g0, g1))  # replicas hold the same averaged gradient
    for (ddp_grads, bare_grads) in steps0[:2]:  # the plain iterations: the exact mean
        assert all((a == b).all() for a, b in zip(ddp_grads, bare_grads))
    assert payload < dense


def _refuse(rank, world):
    torch.manual_seed(0)
    module = nn.Linear(4, 4 + rank)  # replicas of other shapes
    GradSync(module, DPConfig())


def test_replicas_of_other_shapes_are_refused_on_every_rank():
    reports = run_ranks(_refuse, 2)
    assert all(r[0] == "error" and r[1] == "ConfigError" and "differ" in r[2] for r in reports), reports


def test_bad_config_and_frozen_module_are_named():
    with pytest.raises(ConfigError, match="DPConfig"):
        GradSync(nn.Linear(2, 2), "topk")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ConfigError, match="no trainable"):
        GradSync(frozen, DPConfig())
