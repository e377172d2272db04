"""profile(...): options the host cannot take are left out with the reason, before any of their steps run."""

import os

import torch
import torch.nn as nn

from actzip.memory.planner.planned import PlannedUnits
from actzip.memory.planner.profile import HOST_FACTOR, profile


def _stack():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)) for _ in range(3)])


def test_offload_is_left_out_when_the_host_cannot_pin_what_the_units_keep(monkeypatch):
    model = _stack()
    planned = PlannedUnits([(str(i), m) for i, m in enumerate(model)])
    x = torch.randn(8, 16)
    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 1 if name == "SC_AVPHYS_PAGES" else real(name))
    try:
        measured = profile(model, planned, lambda m: m(x).square().mean(), ("keep", "offload"), repeats=1)
    finally:
        planned.remove()
    assert set(measured.left_out) == {"offload"} and "host memory" in measured.left_out["offload"]
    assert f"{HOST_FACTOR:g} x" in measured.left_out["offload"]
    assert all(c.options == ("keep",) for c in measured.costs)  # no offload step ran (it cannot on the CPU)


def test_an_ample_host_leaves_nothing_out():
    model = _stack()
    planned = PlannedUnits([(str(i), m) for i, m in enumerate(model)])
    x = torch.randn(8, 16)
    try:
        measured = profile(model, planned, lambda m: m(x).square().mean(), ("keep", "checkpoint"), repeats=1)
    finally:
        planned.remove()
    assert measured.left_out == {} and all(c.options == ("keep", "checkpoint") for c in measured.costs)
