"""The DiLoCo-style outer step on two gloo ranks: replicas agree after each sync, bytes metered, EF kept."""

import pytest
import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.errors import ConfigError
from actzip.wire.dp import OuterConfig, OuterSync


def _run(rank, world, config_kw, steps):
    torch.manual_seed(rank)  # different initial weights: the sync starts them from replica 0's
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    sync = OuterSync(model, OuterConfig(**config_kw))
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(100 + rank)
    locals_before_sync = None
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 8)).square().mean().backward()
        opt.step()
        locals_before_sync = [p.detach().clone() for p in model.parameters()]
        sync.step()
    return ([p.detach().numpy().copy() for p in start], [t.numpy().copy() for t in locals_before_sync],
            [p.detach().numpy().copy() for p in model.parameters()], sync.meter.payload_bytes, sync.meter.dense_bytes,
            sync.meter.syncs)


def _ok(reports):
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


def test_plain_outer_step_with_unit_lr_is_the_mean_of_the_replicas():
    (s0, l0, p0, b0, d0, n0), (s1, l1, p1, *_) = _ok(run_ranks(
        _run, 2, {"local_steps": 3, "outer_lr": 1.0, "momentum": 0.0, "error_feedback": False}, 3))
    assert all((a == b).all() for a, b in zip(s0, s1))  # started from one point
    assert n0 == 1 and b0 == d0  # one sync, raw float32
    for a, b, x, y in zip(p0, p1, l0, l1):
        assert (a == b).all()  # identical after the sync
        assert abs(a - (x + y) / 2).max() < 1e-6  # global - 1 * mean(global - local) = mean(local)


def test_compressed_pseudo_gradient_is_metered_and_keeps_the_replicas_identical():
    (_, _, p0, b0, d0, n0), (_, _, p1, b1, *_) = _ok(run_ranks(
        _run, 2, {"local_steps": 2, "codec": "mask:keep=0.1,mode=topk"}, 6))
    assert n0 == 3 and b0 == b1 and 4 < d0 / b0 < 10  # a tenth kept as value + position
    assert all((a == b).all() for a, b in zip(p0, p1))


def test_bad_configs():
    for bad in ({"local_steps": 0}, {"outer_lr": -1.0}, {"momentum": float("nan")},
                {"codec": "mask:keep=0.1+quant:bits=8"}, {"codec": "nosuchcodec"}):
        with pytest.raises(ConfigError):
            OuterConfig(**bad)
