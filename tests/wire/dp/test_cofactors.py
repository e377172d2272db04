"""Co-compressed gradients: sketched layers averaged through their left factor on two gloo ranks."""

import torch
import torch.nn as nn
from gloo_ranks import run_ranks

from actzip.memory.modules import SketchedLinear
from actzip.wire.dp import sync_factored_grads


def _model(seed):
    torch.manual_seed(0)
    return nn.Sequential(SketchedLinear(nn.Linear(32, 48), rank=4, seed=seed, factored_grad=True), nn.ReLU(),
                         nn.Linear(48, 1))


def _step(rank, world, seeds):
    model = _model(seeds[rank])
    torch.manual_seed(100 + rank)
    model(torch.randn(16, 32)).square().mean().backward()
    own = [p.grad.clone() for p in model.parameters()]
    try:
        meter = sync_factored_grads(model)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return type(e).__name__, str(e)
    return ([g.numpy() for g in own], [p.grad.numpy().copy() for p in model.parameters()], meter.payload_bytes,
            meter.dense_bytes)


def _ok(reports):
    assert all(r[0] == "ok" for r in reports), reports
    return [r[1] for r in reports]


def test_the_mean_gradient_from_the_left_factor_alone():
    (own0, got0, payload, dense), (own1, got1, _, _) = _ok(run_ranks(_step, 2, (5, 5)))
    for a, b, x, y in zip(got0, got1, own0, own1):
        assert (a == b).all()  # the replicas agree
        assert abs(a - (x + y) / 2).max() < 1e-6  # the mean of their own gradients
    # the sketched weight sends 48 x 4 floats instead of 48 x 32; the rest goes whole
    whole = (48 + 48 + 1) * 4
    assert payload == 48 * 4 * 4 + whole and dense == 48 * 32 * 4 + whole


def test_replicas_with_different_sketches_are_refused_on_every_replica():
    reports = _ok(run_ranks(_step, 2, (5, 6)))
    assert all(r[0] == "ConfigError" and "sketches differ" in r[1] for r in reports)
