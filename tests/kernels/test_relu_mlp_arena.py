"""The fused ReLU² MLP on the kernel path with an arena: exact, no host sync, overflow recomputed."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.core.errors import ConfigError
from actzip.memory import ActivationCache, SparseGatedReLUMLP, SparseReLUMLP
from actzip.memory import relu_mlp as R
from actzip.memory.arena import Arena

pytest.importorskip("triton")
from actzip.kernels import runtime  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(runtime.unavailable_reason("cpu") is not None, reason="no interpreter")),
    pytest.param("cuda", marks=pytest.mark.cuda),
]


def ref_and_fused(device, dtype, arena, square=True, sign_pack=False, gated=False):
    torch.manual_seed(0)
    d, h = 32, 96
    if gated:
        ref = nn.ModuleDict({"gate_proj": nn.Linear(d, h), "up_proj": nn.Linear(d, h), "down_proj": nn.Linear(h, d)})
    else:
        ref = nn.ModuleDict({"up": nn.Linear(d, h), "down": nn.Linear(h, d)})
    ref = ref.to(device=device, dtype=dtype)
    m = copy.deepcopy(ref)
    codec = actzip.codecs.get("sparse", kernel="triton", tile_size=256, sign_pack=sign_pack, check=not sign_pack)
    if gated:
        fused = SparseGatedReLUMLP(m["gate_proj"], m["up_proj"], m["down_proj"], square=square, codec=codec, arena=arena)
    else:
        fused = SparseReLUMLP(m["up"], m["down"], square=square, codec=codec, arena=arena)

    def run_ref(x):
        if gated:
            r = F.relu(ref["gate_proj"](x))
            return ref["down_proj"]((r.square() if square else r) * ref["up_proj"](x))
        r = F.relu(ref["up"](x))
        return ref["down"](r.square() if square else r)

    return run_ref, ref, fused


def grads(fn, params, x):
    x = x.clone().requires_grad_()
    y = fn(x)
    (y.float() * torch.linspace(-1, 1, y.shape[-1], device=y.device)).sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in params]


def dtypes_for(device):
    return [torch.float32] if device == "cpu" else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("capacity", [1 << 20, 0])
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("gated", [False, True])
def test_arena_path_is_exact_and_overflow_recomputes(device, capacity, sign_pack, gated):
    for dtype in dtypes_for(device):
        arena = Arena(capacity, device=device)
        run_ref, ref, fused = ref_and_fused(device, dtype, arena, sign_pack=sign_pack, gated=gated)
        # Small on the CPU: Triton's interpreter runs the sign-packing scan slowly.
        x = torch.randn(*((2, 8, 32) if device == "cpu" else (3, 40, 32)), device=device, dtype=dtype)
        before = R.arena_overflows()
        want = grads(run_ref, list(ref.parameters()), x)
        with pytest.warns(UserWarning, match="arena had no room") if capacity == 0 and before == 0 else _nothing():
            got = grads(fused, list(fused.parameters()), x)
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        assert (R.arena_overflows() > before) == (capacity == 0)
        assert arena.overflows() == (1 if capacity == 0 else 0)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("device", DEVICES)
def test_arena_fit_then_no_overflow_and_account(device):
    arena = Arena(device=device)
    run_ref, ref, fused = ref_and_fused(device, torch.float32, arena)
    x = torch.randn(16, 32, device=device)
    grads(fused, list(fused.parameters()), x)  # first step: unsized, measured, recomputed
    arena.reset()
    cap = arena.fit()
    assert cap >= arena.high_water_bytes()
    refused = arena.overflows()
    cache = ActivationCache.count_only()
    with cache:
        y = fused(x.requires_grad_())
    y.sum().backward()
    assert arena.overflows() == refused
    st = cache.last.by_rule["relu_mlp"]
    assert 0 < st.stored_bytes < st.dense_bytes


def test_arena_needs_kernels_and_unchecked_sign_packing():
    arena = Arena(1024, device="cpu")
    with pytest.raises(ConfigError, match="Triton kernels"):
        SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, codec=actzip.codecs.get("sparse", kernel="torch"), arena=arena)
    with pytest.raises(ConfigError, match="check=False"):
        SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, codec=actzip.codecs.get("sparse", sign_pack=True), arena=arena)
    if runtime.unavailable_reason("cpu") is not None:
        with pytest.raises(ConfigError, match="cannot run"):
            SparseReLUMLP(nn.Linear(4, 8), nn.Linear(8, 4), square=True, arena=arena)


@pytest.mark.cuda
def test_training_step_has_no_host_sync():
    device = "cuda"
    arena = Arena(64 << 20, device=device)
    _, _, fused = ref_and_fused(device, torch.bfloat16, arena, sign_pack=True)
    x = torch.randn(512, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    opt = torch.optim.SGD(fused.parameters(), lr=0.1)
    for _ in range(2):  # warm up: compile the kernels, fill caches
        fused(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        arena.reset()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = fused(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        arena.reset()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert arena.overflows() == 0
