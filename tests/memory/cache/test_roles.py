"""Roles of saved tensors: which function saved them, as which argument; nesting and cleanup."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from actzip.memory.cache import CacheConfig, CacheContext, Rule
from actzip.memory.cache.roles import (
    ROLES,
    RoleTracker,
    current_argument,
    current_function,
    current_role,
    function_role,
    role_of_current,
    tracking,
)


class Recorder:
    """A cache whose first rule records (shape, role, argument) of every save, then keeps the tensor."""

    def __init__(self):
        self.saved = []

        def record(t):
            self.saved.append((tuple(t.shape), current_role(t), current_argument(t)))
            return False

        rules = [Rule("record", record), Rule("kept", lambda t: True)]
        self.cache = CacheContext(CacheConfig(dedup=False), rules=rules)  # rules that ask no role: untracked

    def __enter__(self):
        self.cache.__enter__()
        return self

    def __exit__(self, *exc):
        self.cache.__exit__(*exc)

    def roles(self):
        return sorted(role for _, role, _ in self.saved)


def nonleaf(*shape):
    return torch.randn(*shape, requires_grad=True) * 1.0  # a scalar mul saves nothing


def record(fn):
    rec = Recorder()
    with RoleTracker(), rec:
        fn()
    return rec


def test_roles_are_known():
    assert set(ROLES) == {"linear_input", "nonlinear_input", "relu_output", "attention", "norm", "loss", "parameter",
                          "other"}


def test_mlp_linear_gelu_linear():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
    x = nonleaf(4, 16)
    rec = record(lambda: model(x))
    assert sorted(rec.saved) == sorted([
        ((4, 16), "linear_input", "args[0]"),
        ((16, 32), "parameter", "args[1]"),  # the weight's transpose: a view of the parameter
        ((4, 32), "nonlinear_input", "args[0]"),  # GELU's input
        ((4, 32), "linear_input", "args[0]"),  # GELU's output, the second linear's input
        ((32, 16), "parameter", "args[1]"),
    ])


def test_linear_on_3d_input_saves_a_view_of_it():
    lin = nn.Linear(8, 8)
    x = nonleaf(2, 3, 8)
    rec = record(lambda: lin(x))
    assert ((6, 8), "linear_input", "args[0]") in rec.saved  # matched by storage
    assert rec.roles().count("parameter") == 1


def test_keyword_arguments_are_named():
    w = nn.Parameter(torch.randn(8, 8))
    x = nonleaf(4, 8)
    rec = record(lambda: F.linear(input=x, weight=w))
    assert ((4, 8), "linear_input", "input") in rec.saved


def test_matmul_einsum_of_activations_are_linear_inputs():
    a, b = nonleaf(2, 4, 8), nonleaf(2, 8, 4)
    assert set(record(lambda: a @ b).roles()) == {"linear_input"}
    assert set(record(lambda: torch.bmm(a, b)).roles()) == {"linear_input"}
    assert set(record(lambda: torch.einsum("bij,bjk->bik", a, b)).roles()) == {"linear_input"}


def test_attention_block():
    qkv = nn.Linear(16, 48)
    x = nonleaf(2, 5, 16)

    def block():
        q, k, v = qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rec = record(block)
    inside = [r for r in rec.saved if r[1] not in ("linear_input", "parameter")]
    assert inside and {r[1] for r in inside} == {"attention"}
    assert set(record(lambda: x.softmax(-1)).roles()) == {"attention"}
    assert set(record(lambda: F.log_softmax(x, -1)).roles()) == {"attention"}


@pytest.mark.parametrize("norm", [nn.LayerNorm(16), nn.RMSNorm(16), nn.GroupNorm(2, 16)])
def test_norms(norm):
    x = nonleaf(4, 16) if not isinstance(norm, nn.GroupNorm) else nonleaf(4, 16, 3)
    rec = record(lambda: norm(x))
    assert rec.saved and set(rec.roles()) <= {"norm", "parameter"} and "norm" in rec.roles()


@pytest.mark.parametrize(
    "fn",
    [lambda x: F.relu(x), lambda x: torch.relu(x), lambda x: x.relu(), lambda x: nn.ReLU(inplace=True)(x)],
    ids=["F.relu", "torch.relu", "Tensor.relu", "ReLU(inplace)"],
)
def test_relu_saves_its_output(fn):
    x = nonleaf(4, 16)
    rec = record(lambda: fn(x))
    assert rec.roles() == ["relu_output"]


def test_threshold_saves_its_input():
    x = nonleaf(4, 16)
    assert record(lambda: F.threshold(x, 0.0, 0.0)).saved == [((4, 16), "nonlinear_input", "args[0]")]


@pytest.mark.parametrize(
    "fn",
    [F.gelu, F.silu, torch.tanh, torch.sigmoid, torch.exp, F.softplus, F.mish, lambda x: x.square(),
     lambda x: x ** 2, lambda x: x * x.detach(), lambda x: x / (x.detach() + 3)],
)
def test_nonlinear_inputs(fn):
    x = nonleaf(4, 16)
    rec = record(lambda: fn(x))
    assert rec.saved and set(rec.roles()) == {"nonlinear_input"}


def test_autocast_weight_copy_is_a_parameter():
    lin = nn.Linear(16, 16)
    x = nonleaf(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rec = record(lambda: lin(x))
    assert sorted(rec.roles()) == ["linear_input", "parameter"]


def test_untracked_functions_and_outside_are_other():
    x = nonleaf(4, 16)
    assert set(record(lambda: torch.cumprod(x, 0)).roles()) == {"other"}
    rec = Recorder()
    with rec:  # no tracker
        F.gelu(x)
    assert rec.roles() == ["other"]
    assert role_of_current(x) == "other" and current_function() is None and current_argument(x) is None


def test_function_table():
    assert function_role(F.linear).argument == "linear_input"
    assert function_role(torch.Tensor.mul).argument == "nonlinear_input"
    assert function_role(F.relu).result == "relu_output"
    assert function_role(F.scaled_dot_product_attention).argument == "attention"
    assert function_role(F.layer_norm).argument == "norm"
    assert function_role(torch.cumsum) is None


def test_nested_trackers_restore_state():
    depth = torch._C._len_torch_function_stack()
    x = nonleaf(4, 16)
    assert not tracking()
    with RoleTracker():
        with RoleTracker():
            assert tracking()
            rec = Recorder()
            with rec:
                F.gelu(x)
            assert rec.roles() == ["nonlinear_input"]
        assert tracking()
        rec = Recorder()
        with rec:
            F.linear(x, torch.randn(4, 16))  # only the (plain tensor) weight is needed, for x's gradient
        assert rec.roles() == ["linear_input"]
    assert not tracking() and current_function() is None
    assert torch._C._len_torch_function_stack() == depth


def test_composes_with_other_modes_and_exceptions():
    calls = []

    class Counter(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return func(*args, **(kwargs or {}))

    x = nonleaf(4, 16)
    with Counter(), RoleTracker():
        rec = Recorder()
        with rec:
            F.gelu(x)
        with pytest.raises(RuntimeError):
            F.linear(x, torch.randn(3, 5))  # shape mismatch inside a tracked call
        assert current_function() is None  # the failed call's frame is gone
    assert rec.roles() == ["nonlinear_input"]
    assert F.gelu in calls
    assert not tracking()


def test_what_a_loss_function_saves_is_loss():
    logits = nonleaf(8, 32)
    y = torch.randint(0, 32, (8,))
    # everything cross_entropy saves (its log-probabilities, the targets) is the loss head's
    assert set(record(lambda: F.cross_entropy(logits, y)).roles()) == {"loss"}
    # split in two calls: log_softmax's output is attention's (a softmax), what nll_loss saves is the loss's
    assert record(lambda: F.nll_loss(F.log_softmax(logits, -1), y)).roles() == ["attention", "loss", "loss", "loss"]


def test_role_worked_out_once_per_save(monkeypatch):
    import actzip
    from actzip.memory.cache import roles

    calls = []
    real = roles.role_in_call
    monkeypatch.setattr(roles, "role_in_call", lambda t, frame: calls.append(id(t)) or real(t, frame))
    enter = roles.role_query.__enter__
    monkeypatch.setattr(roles.role_query, "__enter__", lambda self: calls.append("save") or enter(self))
    x = torch.randn(8, 16, requires_grad=True)
    w = nn.Parameter(torch.randn(16, 16))
    cache = actzip.cache("4bit", min_bytes=0)  # one rule per role: each asks the role (and the cache tracks them)
    with cache:
        F.gelu(F.linear(x, w)).sum()
    per_save = " ".join(map(str, calls)).split("save")[1:]
    assert len(per_save) == 3 and all(len(s.split()) == 1 for s in per_save)  # each save's role worked out once
    # outside a save nothing is remembered: a second question is answered afresh
    with RoleTracker():
        assert roles.current_role(x) == roles.OTHER
