"""Role plans: a tracked step's roles replayed by position, the same decisions, misses kept and announced."""

import warnings

import pytest
import torch
import torch.nn as nn

import actzip
from actzip.memory.cache.role_plan import UNPLANNED, RolePlan, save_signature
from actzip.memory.cache.roles import RoleTracker, tracking
from actzip_bench.models import GPT, GPTConfig


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig.of_size("tiny", activation="gelu", n_layer=2))


def _batch(length: int = 17, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 256, (2, length), generator=g)
    return idx[:, :-1], idx[:, 1:]


def _steps(cache, model, batches):
    """Per step: the account's rows by rule and every parameter's gradient."""
    out = []
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        with cache:
            _, loss = model(x, y)
        loss.backward()
        rows = {name: (s.tensors, s.dense_bytes, s.stored_bytes) for name, s in cache.last.by_rule.items()}
        out.append((rows, [p.grad.clone() for p in model.parameters()]))
    return out


@pytest.mark.parametrize("preset", ["4bit", "2bit", "balanced"])
def test_replayed_steps_decide_and_compute_exactly_as_tracked_steps(preset):
    batches = [_batch(seed=s) for s in range(4)]
    model = _model()
    replayed = actzip.cache(preset, min_bytes=0, seed=3)
    tracked = actzip.cache(preset, min_bytes=0, seed=3, replay=False)
    got = _steps(replayed, model, batches)
    want = _steps(tracked, model, batches)
    assert replayed.role_plan.replayed_steps == 3 and replayed.role_plan.misses == 0
    assert tracked.role_plan.replayed_steps == 0
    for (rows, grads), (rows_t, grads_t) in zip(got, want):
        assert rows == rows_t
        assert all(torch.equal(a, b) for a, b in zip(grads, grads_t))


def test_a_replayed_step_runs_without_the_tracker():
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append(tracking())
            return x

    model = nn.Sequential(nn.Linear(8, 8), Probe(), nn.GELU(), nn.Linear(8, 1))
    cache = actzip.cache("4bit", min_bytes=0)
    for _ in range(3):
        with cache:
            model(torch.randn(4, 8)).sum().backward()
    assert seen == [True, False, False]


def test_batches_of_another_length_replay_too():
    model = _model()
    cache = actzip.cache("4bit", min_bytes=0)
    _steps(cache, model, [_batch(17), _batch(9), _batch(13)])
    assert cache.role_plan.replayed_steps == 2 and cache.role_plan.misses == 0
    assert UNPLANNED not in cache.last.by_rule


class _Switch(nn.Module):
    """A linear, then GELU only when asked: the second kind of step saves other tensors at the same positions."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 1)
        self.gelu = False

    def forward(self, x):
        h = self.a(x)
        if self.gelu:
            h = torch.nn.functional.gelu(h)
        return self.b(h).sum()


def test_a_step_that_leaves_the_plan_keeps_the_rest_as_it_is_is_announced_once_and_retracked():
    model = _Switch()
    cache = actzip.cache("4bit", min_bytes=0)
    x = torch.randn(32, 16)
    with cache:
        model(x).backward()  # recorded
    model.gelu = True
    model.zero_grad()
    with pytest.warns(RuntimeWarning, match="does not follow the step whose roles"):
        with cache:
            loss = model(x)
        loss.backward()
    rows = cache.last.by_rule
    assert rows[UNPLANNED].tensors >= 1 and rows[UNPLANNED].stored_bytes == rows[UNPLANNED].dense_bytes
    assert cache.role_plan.misses == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # announced once per cache
        for _ in range(3):
            model.zero_grad()
            with cache:
                model(x).backward()
    assert UNPLANNED not in cache.last.by_rule  # tracked again, then replayed
    assert cache.role_plan.misses == 1


def test_more_saves_than_recorded_leave_the_plan():
    plan = RolePlan(lifetime=5)
    t = torch.randn(3, requires_grad=True) * 2
    assert plan.start() is False
    with RoleTracker():
        plan.role(t)
    plan.finish(completed=True)
    assert plan.start() is True
    assert plan.role(t) == "other"
    with pytest.warns(RuntimeWarning, match="1 recorded"):
        assert plan.role(t) is None
    plan.finish(completed=True)
    assert plan.start() is False  # recorded again


def test_the_plan_is_recorded_again_after_its_lifetime_and_never_with_replay_off():
    t = torch.randn(3, requires_grad=True) * 2
    plan = RolePlan(lifetime=2)
    modes = []
    for _ in range(7):
        modes.append(plan.start())
        plan.role(t)
        plan.finish(completed=True)
    assert modes == [False, True, True, False, True, True, False]
    off = RolePlan(lifetime=0)
    for _ in range(3):
        assert off.start() is False
        off.role(t)
        off.finish(completed=True)


def test_a_step_that_raised_does_not_become_the_plan():
    plan = RolePlan(lifetime=3)
    plan.start()
    plan.role(torch.randn(2, requires_grad=True) * 1)
    plan.finish(completed=False)
    assert plan.start() is False


def test_signature_names_dtype_rank_grad_and_producer():
    a = torch.randn(4, 4, requires_grad=True)
    assert save_signature(a * 2) == (torch.float32, 2, True, type((a * 2).grad_fn))
    assert save_signature(a * 2) != save_signature(a + 2)
    assert save_signature(a) == (torch.float32, 2, True, None)


def test_replay_option_is_checked_and_allowed_with_rules():
    with pytest.raises(actzip.ConfigError, match="replay"):
        actzip.cache("4bit", replay="yes")
    from actzip.memory.cache.rules import count_only_rules

    assert actzip.cache(rules=count_only_rules(), replay=False).role_plan.lifetime == 0
