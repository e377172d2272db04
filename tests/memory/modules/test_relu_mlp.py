"""Fused ReLU / ReLU² MLPs: outputs and every gradient bit-identical to the unfused modules."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.memory.cache import CacheConfig, CacheContext as ActivationCache
from actzip.memory.modules.relu_mlp import SparseGatedReLUMLP, SparseReLUMLP


class RefMLP(nn.Module):
    def __init__(self, d, h, square, bias):
        super().__init__()
        self.up, self.down, self.square = nn.Linear(d, h, bias=bias), nn.Linear(h, d, bias=bias), square

    def forward(self, x):
        r = F.relu(self.up(x))
        return self.down(r.square() if self.square else r)


class RefGated(nn.Module):
    def __init__(self, d, h, square, bias):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, h, bias=bias), nn.Linear(d, h, bias=bias)
        self.down_proj, self.square = nn.Linear(h, d, bias=bias), square

    def forward(self, x):
        r = F.relu(self.gate_proj(x))
        return self.down_proj((r.square() if self.square else r) * self.up_proj(x))


def run(module, x):
    x = x.clone().requires_grad_()
    y = module(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
    return y.detach(), {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}


def assert_identical(ref, got):
    (y0, g0), (y1, g1) = ref, got
    assert torch.equal(y0, y1)
    assert g0.keys() == g1.keys()
    for k in g0:
        assert torch.equal(g0[k], g1[k]), k


@pytest.mark.parametrize("square", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64, 32), (3, 40, 32)])
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_bit_identical(square, dtype, shape, bias):
    ref = RefMLP(32, 96, square, bias).to(dtype)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=square, names=("up", "down"))
    x = torch.randn(*shape, dtype=dtype)
    assert_identical(run(ref, x), run(fused, x))
    assert fused.state_dict().keys() == ref.state_dict().keys() - {"square"}


@pytest.mark.parametrize("square", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_mlp_bit_identical(square, dtype):
    ref = RefGated(32, 96, square, bias=False).to(dtype)
    m = copy.deepcopy(ref)
    fused = SparseGatedReLUMLP(m.gate_proj, m.up_proj, m.down_proj, square=square)
    x = torch.randn(2, 24, 32, dtype=dtype)
    assert_identical(run(ref, x), run(fused, x))


def test_sign_packed_codec_also_exact():
    import actzip

    ref = RefMLP(32, 96, True, True)
    codec = actzip.codecs.get("sparse", sign_pack=True)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=True, codec=codec)
    x = torch.randn(128, 32)
    assert_identical(run(ref, x), run(fused, x))


def test_account_shows_only_the_payload_is_kept():
    ref = RefMLP(64, 256, True, False)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=True)
    x = torch.randn(512, 64, requires_grad=True)
    base, comp = ActivationCache.count_only(), ActivationCache(CacheConfig(min_bytes=0))
    with base:
        y0 = ref(x)
    with comp:
        y1 = fused(x)
    (y0.sum() + y1.sum()).backward()
    a, b = base.last, comp.last
    assert a.bytes_before == b.bytes_before  # same tensors accounted for, whatever keeps them
    r_bytes = 512 * 256 * 4
    assert b.by_rule["relu_mlp"].dense_bytes == r_bytes and b.by_rule["rebuilt"].stored_bytes == 0
    # Only the input of `up` (leaf x here) and the payload remain: far below relu(h) + relu(h)**2.
    assert b.bytes_after < 0.35 * a.bytes_before


def test_payload_is_freed_by_backward():
    fused = SparseReLUMLP(nn.Linear(16, 64), nn.Linear(64, 16), square=True)
    x = torch.randn(32, 16, requires_grad=True)
    y = fused(x)
    node = y.grad_fn  # activation and down projection in one node: the weight and the payload's 3 buffers
    assert type(node).__name__ == "SparseReLUDownBackward" and len(node.saved_tensors) == 4
    y.sum().backward()
    with pytest.raises(RuntimeError, match="freed"):
        node.saved_tensors


def test_no_grad_and_eval_paths_match():
    ref = RefMLP(16, 48, True, True)
    fused = SparseReLUMLP(copy.deepcopy(ref.up), copy.deepcopy(ref.down), square=True)
    x = torch.randn(8, 16)
    with torch.no_grad():
        assert torch.equal(ref(x), fused(x))


def test_lossy_codec_refused():
    from actzip.errors import ConfigError

    class Lossy:
        lossless = False
        name = "lossy"

    with pytest.raises(ConfigError, match="lossy"):
        SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, codec=Lossy())


@pytest.mark.parametrize("gated", [False, True])
def test_dense_activation_is_not_kept_alive(gated, monkeypatch):
    # After forward only the payload may remain: relu(h)² (and the gated product) must be freed.
    import weakref

    from actzip.memory.modules import relu_down

    outputs = []
    # Both forms run as one node with a plain down projection: the activation (and the gated product) is
    # written over h, the node's first input.
    spied = relu_down.SparseReLUDown
    real_apply = spied.apply

    def spy(*args):
        out = real_apply(*args)
        outputs.append(weakref.ref(args[0]))
        return out

    monkeypatch.setattr(spied, "apply", spy)
    if gated:
        ref = RefGated(16, 64, True, False)
        fused = SparseGatedReLUMLP(ref.gate_proj, ref.up_proj, ref.down_proj, square=True)
    else:
        fused = SparseReLUMLP(nn.Linear(16, 64), nn.Linear(64, 16), square=True)
    x = torch.randn(32, 16, requires_grad=True)
    y = fused(x)
    assert outputs and all(r() is None for r in outputs)
    y.sum().backward()
