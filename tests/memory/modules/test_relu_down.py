"""The activation + down projection node: bit-identical to the unfused modules for every projection it takes."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.memory.modules.relu_down import plain_projection, projection_fits
from actzip.memory.modules.relu_mlp import SparseGatedReLUMLP, SparseReLUMLP


class Ref(nn.Module):
    def __init__(self, up, down, square):
        super().__init__()
        self.up, self.down, self.square = up, down, square

    def forward(self, x):
        r = F.relu(self.up(x))
        return self.down(r.square() if self.square else r)


def exactness_grid(test):
    """Every activation, dtype, input rank and down projection the node takes (or leaves to the general path)."""
    for name, values in (("down", ["linear", "linear-bias", "conv1d"]), ("shape", [(48, 16), (2, 24, 16), (2, 3, 8, 16)]),
                         ("dtype", [torch.float32, torch.bfloat16]), ("square", [True, False])):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def grads(module, x):
    x = x.clone().requires_grad_()
    y = module(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in module.parameters()], y.grad_fn


def assert_exact_and_noded(ref, fused, shape, dtype) -> bool:
    """Gradients bit-identical to ``ref``'s, through the one node exactly when the projection fits it."""
    x = torch.randn(*shape, dtype=dtype)
    want, _ = grads(ref, x)
    got, node = grads(fused, x)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    one_node = projection_fits(len(shape), plain_projection(fused.down))
    assert (type(node).__name__ == "SparseReLUDownBackward") == one_node
    return one_node


def conv1d(n_in, n_out):
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    m = Conv1D(n_out, n_in)
    nn.init.normal_(m.weight, std=0.2)
    nn.init.normal_(m.bias, std=0.2)
    return m


@exactness_grid
def test_bit_identical_to_unfused(square, dtype, shape, down):
    torch.manual_seed(0)
    up = nn.Linear(16, 64)
    proj = {"linear": lambda: nn.Linear(64, 16, bias=False), "linear-bias": lambda: nn.Linear(64, 16),
            "conv1d": lambda: conv1d(64, 16)}[down]()
    ref = Ref(up, proj, square).to(dtype)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=square)
    one_node = assert_exact_and_noded(ref, fused, shape, dtype)
    assert one_node == (down != "linear-bias" or len(shape) <= 3)  # 4-D with a bias: the general path


def test_frozen_projection_makes_no_weight_gradient():
    torch.manual_seed(0)
    ref = Ref(nn.Linear(16, 64), nn.Linear(64, 16), True)
    ref.down.requires_grad_(False)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=True)
    x = torch.randn(32, 16)
    want, _ = grads(ref, x)
    got, _ = grads(fused, x)
    assert fused.down.weight.grad is None and fused.down.bias.grad is None
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(want, got))


def test_only_plain_hookless_projections_are_taken():
    class MyLinear(nn.Linear):
        pass

    assert plain_projection(nn.Linear(4, 4)) is not None
    assert plain_projection(MyLinear(4, 4)) is None
    hooked = nn.Linear(8, 4)
    hooked.register_forward_hook(lambda m, a, o: o * 2)
    assert plain_projection(hooked) is None
    fused = SparseReLUMLP(nn.Linear(4, 8), hooked, square=True)
    x = torch.randn(3, 4, requires_grad=True)
    y = fused(x)
    assert type(y.grad_fn).__name__ != "SparseReLUDownBackward"  # the hook ran: the general path
    assert torch.equal(y, hooked(torch.relu(fused.up(x)).square()))


class GatedRef(nn.Module):
    def __init__(self, gate, up, down, square):
        super().__init__()
        self.gate, self.up, self.down, self.square = gate, up, down, square

    def forward(self, x):
        r = F.relu(self.gate(x))
        return self.down((r.square() if self.square else r) * self.up(x))


def _gated(down, dtype, square):
    proj = {"linear": lambda: nn.Linear(64, 16, bias=False), "linear-bias": lambda: nn.Linear(64, 16),
            "conv1d": lambda: conv1d(64, 16)}[down]()
    ref = GatedRef(nn.Linear(16, 64, bias=False), nn.Linear(16, 64, bias=False), proj, square).to(dtype)
    fused = SparseGatedReLUMLP(*(copy.deepcopy(m) for m in (ref.gate, ref.up, ref.down)), square=square,
                               names=("gate", "up", "down"))
    return ref, fused


@exactness_grid
def test_gated_form_is_bit_identical_to_unfused(square, dtype, shape, down):
    torch.manual_seed(0)
    ref, fused = _gated(down, dtype, square)
    assert_exact_and_noded(ref, fused, shape, dtype)


@pytest.mark.parametrize("frozen", ["gate", "up", "down"])
def test_gated_form_with_a_frozen_layer(frozen):
    torch.manual_seed(0)
    ref, fused = _gated("linear-bias", torch.float32, True)
    for m in (ref, fused):
        getattr(m, frozen).requires_grad_(False)
    x = torch.randn(32, 16)
    want, _ = grads(ref, x)
    got, _ = grads(fused, x)
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(want, got))
    assert getattr(fused, frozen).weight.grad is None


def test_gated_node_saves_u_and_the_payload_not_the_product():
    from actzip.memory.cache import CacheConfig, CacheContext

    torch.manual_seed(0)
    ref, fused = _gated("linear", torch.float32, True)
    x = torch.randn(64, 16, requires_grad=True)
    cache = CacheContext(CacheConfig(min_bytes=0))
    with cache:
        y = fused(x)
    y.sum().backward()
    # the product a·u (and a) are rebuilt: accounted as rebuilt, not kept
    assert cache.last.by_rule["rebuilt"].dense_bytes >= 64 * 64 * 4
