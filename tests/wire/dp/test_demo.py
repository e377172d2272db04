"""DeMo-style optimizer on two gloo ranks: DCT exact, fast components shared, replicas identical, bytes metered."""

import pytest
import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.errors import ConfigError
from actzip.wire.dp import DeMo, dct_matrix


def test_dct_matrix_is_orthonormal_dct_ii():
    d = dct_matrix(16, dtype=torch.float64)
    assert torch.allclose(d @ d.T, torch.eye(16, dtype=torch.float64), atol=1e-12)
    x = torch.randn(16, dtype=torch.float64)
    n = torch.arange(16, dtype=torch.float64)
    want = torch.stack([(x * torch.cos(torch.pi / 16 * (n + 0.5) * k)).sum() for k in range(16)])
    scale = torch.full((16,), (2 / 16) ** 0.5, dtype=torch.float64)
    scale[0] = (1 / 16) ** 0.5
    assert torch.allclose(d @ x, want * scale, atol=1e-12)


def _train_and_step(rank, world, chunk, topk, steps, sign):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.ReLU(), nn.Linear(24, 1))
    start = [p.detach().clone() for p in model.parameters()]
    opt = DeMo(model.parameters(), lr=1e-2, beta=0.9, chunk=chunk, topk=topk, sign=sign)
    torch.manual_seed(100 + rank)
    grads = []
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 8)).square().mean().backward()
        grads.append([p.grad.clone().numpy() for p in model.parameters()])
        opt.step()
    params = [p.detach().numpy().copy() for p in model.parameters()]
    slow = [opt.state[p]["momentum"].abs().max().item() for p in model.parameters()]
    return ([s.numpy() for s in start], params, slow, opt.meter.payload_bytes, opt.meter.dense_bytes, grads)


def _ok(reports):
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


def test_keeping_every_component_shares_the_whole_momentum():
    (s0, p0, slow0, *_ , g0), (_, p1, _, _, _, g1) = _ok(run_ranks(_train_and_step, 2, 8, 8, 1, False))
    assert all(v < 1e-6 for v in slow0)  # nothing stays local
    for start, a, b, ga, gb in zip(s0, p0, p1, g0[0], g1[0]):
        assert (a == b).all()  # one update on both replicas
        # one step from zero momentum: the mean gradient, through the DCT and back
        assert abs(a - (start - 1e-2 * (ga + gb) / 2)).max() < 1e-6


def test_top_components_keep_replicas_identical_and_meter_the_bytes():
    (_, p0, slow0, payload, dense, _), (_, p1, *_) = _ok(run_ranks(_train_and_step, 2, 16, 2, 3, True))
    assert all((a == b).all() for a, b in zip(p0, p1))
    assert any(v > 0 for v in slow0)  # the slow part stays on each replica
    # 2 of every 16 coefficients as float32 + uint8: 10 / 64 of the fp32 bytes (chunks padded)
    assert 0.15 < payload / dense < 0.25


def test_bad_options():
    def make(**kw):
        return DeMo([nn.Parameter(torch.zeros(3))], **kw)

    for bad in ({"lr": 0.0}, {"beta": 1.0}, {"chunk": 1}, {"chunk": 8, "topk": 9}, {"topk": 0}, {"lr": True}):
        with pytest.raises(ConfigError):
            make(**bad)
