"""The anchor circuit: snapshots in a background thread, handed over late or lost, never waited for."""

import threading
import warnings

import pytest
import torch
import torch.nn as nn

from actzip.errors import ConfigError
from actzip.wire.anchor import AnchorCircuit, AnchorConfig, SpectralConfig, SpectralCorrection


def _setup(**kw):
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    correction = SpectralCorrection(torch.optim.SGD(model.parameters(), lr=0.1), SpectralConfig(rank=2))
    return model, correction, AnchorCircuit(model, correction, AnchorConfig(**kw))


def _loss(batch):
    return lambda m: m(batch).square().mean()


def test_every_anchor_is_launched_on_schedule_and_handed_over():
    model, correction, anchor = _setup(every=2, delay=1, max_pending=3)  # none skipped, however slow the threads
    batch = torch.randn(16, 8)
    for step in range(6):
        anchor.maybe_launch(step, _loss(batch))
        anchor.deliver(step)
    anchor.wait_all()
    anchor.deliver(100)
    assert anchor.launched == 3 and anchor.delivered == 3 and correction.anchors == 3 and not anchor.pending


def test_a_late_anchor_is_not_waited_for_and_carries_the_weights_of_its_launch():
    model, correction, anchor = _setup(every=1, delay=1)
    release = threading.Event()
    batch = torch.randn(16, 8)

    def slow(m):
        release.wait(10)
        return m(batch).square().mean()

    want = nn.Linear(8, 4)
    want.load_state_dict(model.state_dict())
    want(batch).square().mean().backward()  # the gradient at launch time
    anchor.maybe_launch(0, slow)
    with torch.no_grad():
        model.weight.add_(1.0)  # the fast circuit moves on
    assert anchor.deliver(1) == 0 and anchor.late == 1  # due, not finished: not waited for
    release.set()
    anchor.wait_all()
    seen = {}
    real = correction.observe_anchor
    correction.observe_anchor = lambda grads, launched=None: seen.update(grads) or real(grads, launched)
    assert anchor.deliver(2) == 1
    assert torch.equal(seen[model.weight], want.weight.grad)


def test_a_failed_anchor_is_lost_said_once_and_training_goes_on():
    model, correction, anchor = _setup(every=1, delay=0)

    def broken(m):
        raise RuntimeError("link down")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            anchor.maybe_launch(step, broken)
            anchor.wait_all()
            anchor.deliver(step)
    assert anchor.lost == 3 and correction.anchors == 0
    assert sum("link down" in str(w.message) for w in caught) == 1


def test_launches_beyond_max_pending_are_skipped_and_bad_configs_refused():
    model, correction, anchor = _setup(every=1, delay=5, max_pending=1)
    release = threading.Event()
    anchor.maybe_launch(0, lambda m: (release.wait(10), m(torch.randn(2, 8)).sum())[1])
    assert not anchor.maybe_launch(1, _loss(torch.randn(2, 8))) and anchor.skipped == 1
    release.set()
    anchor.wait_all()
    for bad in ({"every": 0}, {"delay": -1}, {"max_pending": 0}):
        with pytest.raises(ConfigError):
            AnchorConfig(**bad)
