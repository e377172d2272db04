"""Norm outputs marked by compress_(SparseMLPConfig()): the fused MLP keeps no copy of its input, exactly."""

import copy

import pytest
import torch
import torch.nn as nn

from actzip.memory.cache import CacheConfig, CacheContext
from actzip.memory.cache.rebuild import mark_rebuildable, rebuildable
from actzip.memory.modules import SparseMLPConfig, SparseReLUMLP, compress_, restore_
from actzip.memory.modules.norm_rebuild import is_norm, mark_norm_outputs
from actzip_bench.models import GPT, GPTConfig


class Block(nn.Module):
    """x + mlp(norm(x)), the pre-norm shape the marks are for."""

    def __init__(self, d=32, hidden=96, norm=nn.LayerNorm):
        super().__init__()
        self.norm = norm(d)
        self.mlp = SparseReLUMLP(nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d, bias=False), square=True)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


def saved_bytes(block, x):
    cache = CacheContext(CacheConfig(min_bytes=0))
    with cache:
        y = block(x)
    y.float().square().sum().backward()
    return cache.last


@pytest.mark.parametrize("norm", [nn.LayerNorm, nn.RMSNorm])
def test_marked_norm_output_is_rebuilt_not_kept_and_gradients_are_identical(norm):
    torch.manual_seed(0)
    ref = Block(norm=norm)
    marked = copy.deepcopy(ref)
    handles = mark_norm_outputs(marked)
    assert len(handles) == 1
    x = torch.randn(64, 32)
    grads = []
    for m in (ref, marked):
        xi = x.clone().requires_grad_()
        m(xi).float().square().sum().backward()
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    plain, rebuilt = saved_bytes(ref, x.clone().requires_grad_()), saved_bytes(marked, x.clone().requires_grad_())
    n_bytes = x.numel() * x.element_size()
    # the MLP's input (the norm output, saved by up and for a recompute) is a handle now: n's bytes fewer
    assert rebuilt.by_rule["rebuilt"].dense_bytes - plain.by_rule["rebuilt"].dense_bytes >= n_bytes
    assert rebuilt.bytes_after <= plain.bytes_after - n_bytes


def test_a_mark_is_dropped_once_the_tensor_is_modified_in_place():
    t = torch.randn(4, 4)
    mark_rebuildable(t, lambda: torch.zeros(4, 4))
    assert rebuildable(t) and rebuildable(t)[0][0] is t
    t.add_(1)
    assert rebuildable(t) == []
    assert rebuildable(torch.randn(2)) == []


def test_is_norm():
    assert is_norm(nn.LayerNorm(4)) and is_norm(nn.RMSNorm(4))
    assert not is_norm(nn.Linear(4, 4)) and not is_norm(nn.BatchNorm1d(4))


def test_compress_hooks_the_norms_once_and_restore_removes_them():
    model = GPT(GPTConfig.of_size("tiny"))
    report = compress_(model, SparseMLPConfig())
    norms = [m for m in model.modules() if is_norm(m)]
    assert norms and all(len(m._forward_hooks) == 1 for m in norms)
    assert any("rebuild_norms" in n for n in report.notes)
    restore_(model)
    assert all(len(m._forward_hooks) == 0 for m in norms)
    compress_(model, SparseMLPConfig(rebuild_norms=False))
    assert all(len(m._forward_hooks) == 0 for m in norms)


def test_rebuild_norms_must_be_a_bool():
    from actzip.errors import ConfigError

    with pytest.raises(ConfigError, match="rebuild_norms"):
        SparseMLPConfig(rebuild_norms="yes")
