import torch
import torch.nn as nn
import torch.nn.functional as F

from actzip.memory.cache import CacheContext
from actzip.memory.cache.rebuild import rebuild_saved, recompute


def _grads(fn, params):
    for p in params:
        p.grad = None
    fn().sum().backward()
    return [p.grad.clone() for p in params]


def test_norm_output_rebuilt_bit_identical_and_not_kept():
    torch.manual_seed(0)
    norm, lin = nn.LayerNorm(32), nn.Linear(32, 48)
    x = torch.randn(4, 8, 32, requires_grad=True)
    params = [x, *norm.parameters(), *lin.parameters()]

    def plain():
        return lin(norm(x))

    def rebuilt():
        n = norm(x)
        with rebuild_saved([(n, recompute(norm, x))]):
            return lin(n)

    assert all(torch.equal(a, b) for a, b in zip(_grads(plain, params), _grads(rebuilt, params)))
    with CacheContext.count_only() as cache:
        n = norm(x)
        with rebuild_saved([(n, recompute(norm, x))]):
            lin(n)
    acc = cache.last
    assert acc.by_rule["rebuilt"].tensors == 1 and acc.by_rule["rebuilt"].stored_bytes == 0
    # what linear saved of n (a 2-D view of it) is counted dense, and nothing of it is stored
    assert acc.by_rule["rebuilt"].dense_bytes == n.numel() * n.element_size()


def test_nested_blocks_keep_the_outer_targets():
    torch.manual_seed(1)
    w1, w2 = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16, requires_grad=True)

    def plain():
        n = F.layer_norm(x, (16,))
        return F.linear(F.linear(n, w1).relu(), w2) + F.linear(n, w2)

    def rebuilt():
        n = F.layer_norm(x, (16,))
        with rebuild_saved([(n, recompute(F.layer_norm, x, (16,)))]):
            h = F.linear(n, w1).relu()
            with rebuild_saved([]):  # an inner block with its own (no) targets: n stays rebuildable
                return F.linear(h, w2) + F.linear(n, w2)

    params = [x, w1, w2]
    assert all(torch.equal(a, b) for a, b in zip(_grads(plain, params), _grads(rebuilt, params)))
    with CacheContext.count_only() as cache:
        rebuilt()
    assert cache.last.by_rule["rebuilt"].tensors == 2  # n saved by both linears that read it


def test_non_contiguous_targets_are_saved_as_usual():
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(16, 16, requires_grad=True)
    t = x.t()  # [8, 16], not contiguous: cannot be re-viewed from a contiguous rebuild
    with CacheContext.count_only() as cache:
        with rebuild_saved([(t, lambda: x.t().contiguous())]):
            F.linear(t, w)
    assert "rebuilt" not in cache.last.by_rule


def test_recompute_keeps_the_autocast_state():
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        make = recompute(lin, x)
        ref = lin(x)
    out = make()
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref) and not out.requires_grad


def test_recompute_refuses_an_input_changed_in_place():
    import pytest
    import torch

    from actzip.errors import ActzipError
    from actzip.memory.cache.rebuild import recompute

    x = torch.randn(4)
    make = recompute(torch.exp, x)
    assert torch.equal(make(), torch.exp(x))
    x.add_(1.0)
    with pytest.raises(ActzipError, match="exp was modified in place"):
        make()
