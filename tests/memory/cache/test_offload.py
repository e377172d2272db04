"""Offloading the activation cache to pinned CPU memory: exact gradients, device bytes freed, no host sync.

On the CPU offloading is an announced no-op; the CUDA cases (skipped without a GPU) check the copies.
"""

import gc
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError
from actzip.memory.cache import CacheConfig, CacheContext, Rule, preset_rules
from actzip.memory.cache.offload import (
    OffloadConfig,
    Offloader,
    offload_fallbacks,
    reset_offload_fallbacks,
)
from actzip.memory.cache.rules import is_leaf_storage

D, H, N = 64, 256, 512


class GeluStack(nn.Module):
    """Three residual GELU MLP blocks: many saved tensors of several kinds (linear and nonlinear inputs)."""

    def __init__(self, d=D, h=H, blocks=3):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, h), nn.GELU(), nn.Linear(h, d))
                                    for _ in range(blocks))  # fmt: skip

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return x


class ReLUStack(GeluStack):
    def forward(self, x):
        for b in self.blocks:
            x = x + b[3](F.relu(b[1](b[0](x))))
        return x


def grads(model, x, cache=None, preset=None, retain=False, **options):
    """Loss and gradients of one step, under ``cache`` or the preset ``preset`` (with ``options``)."""
    model.zero_grad(set_to_none=True)
    if preset is not None:
        with actzip.cache(preset, min_bytes=0, **options) as preset_cache:
            loss = model(x).float().pow(2).mean()
        cache = preset_cache
    elif cache is not None:
        with cache:
            loss = model(x).float().pow(2).mean()
    else:
        loss = model(x).float().pow(2).mean()
    loss.backward(retain_graph=retain)
    if retain:
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, cache


def assert_identical(a, b):
    assert torch.equal(a[0], b[0])
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][n], b[1][n]) for n in a[1])


def offload_all(offloader):
    """Every saved activation kept as it is, and offloaded."""
    return [Rule("leaf", is_leaf_storage), Rule("all+offload", lambda t: True, offload=offloader)]


# -- CPU: an announced no-op ------------------------------------------------------------------------------


def test_cpu_offload_keeps_tensors_and_warns_once():
    reset_offload_fallbacks()
    model, x = ReLUStack(), torch.randn(N, D)
    ref = grads(model, x)
    off = Offloader()
    cache = CacheContext(rules=offload_all(off))
    with pytest.warns(RuntimeWarning, match="saved tensors on a cpu device stay where they are"):
        got = grads(model, x, cache)
    assert_identical(got, ref)
    acct = cache.last.by_rule["all+offload"]
    assert acct.tensors > 0 and acct.stored_bytes == acct.dense_bytes  # nothing left the (CPU) device
    assert off.stats.kept == acct.tensors and off.stats.offloaded == 0
    assert offload_fallbacks() == {"cpu": acct.tensors}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # announced once: no second warning
        grads(model, x, cache)
    assert offload_fallbacks()["cpu"] == 2 * acct.tensors


@pytest.mark.filterwarnings("ignore:actzip offload:RuntimeWarning")
@pytest.mark.parametrize("preset", ["lossless", "balanced"])
def test_presets_with_offload_on_cpu_are_unchanged(preset):
    model, x = ReLUStack(), torch.randn(N, D)
    ref = grads(model, x, preset=preset, seed=3)
    got = grads(model, x, preset=preset, seed=3, offload=True)
    assert_identical(got, ref)
    names = set(got[2].last.by_rule)
    assert names and all(n.endswith("+offload") for n in names - {"leaf", "small", "unsupported", "incompressible"})
    before = {n.removesuffix("+offload"): s.stored_bytes for n, s in got[2].last.by_rule.items()}
    assert before == {n: s.stored_bytes for n, s in ref[2].last.by_rule.items()}


def test_preset_rules_share_one_offloader_and_take_per_role_offload():
    off = Offloader(OffloadConfig(prefetch=2))
    rules = preset_rules("balanced", offload=off)
    assert {r.offload for r in rules if r.name.endswith("+offload")} == {off}
    assert [r.name for r in rules if r.offload is None] == ["leaf", "unsupported", "small"]
    rules = preset_rules("balanced", treatments={"attention": "kept+offload", "linear_input": "quant8-rn+offload"})
    by_name = {r.name: r for r in rules}
    assert by_name["attention:kept+offload"].offload is by_name["linear_input:quant8+offload"].offload is not None
    assert by_name["norm:kept"].offload is None and "kept" in by_name
    lossless = [r.name for r in preset_rules("lossless", offload=True)]
    assert lossless == ["leaf", "unsupported", "small", "sparse+offload", "dense+offload"]


def test_offload_options_are_checked():
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="prefetch must be an int >= 0"):
            OffloadConfig(prefetch=bad)
    with pytest.raises(ConfigError, match="offload must be an actzip.memory.cache.offload.Offloader or None, got str"):
        Rule("x", lambda t: True, offload="yes")
    with pytest.raises(ConfigError, match="offload must be True, False or an Offloader"):
        preset_rules("balanced", offload="cpu")
    with pytest.raises(ConfigError, match="CacheConfig.offload must be True, False or an OffloadConfig"):
        actzip.cache("balanced", offload=Offloader())  # an Offloader to share goes to preset_rules(offload=...)
    assert repr(Offloader()) == "Offloader(prefetch=1)"


# -- CUDA -------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_gradients_bit_identical(dtype, prefetch):
    model, x = GeluStack().cuda().to(dtype), torch.randn(N, D, device="cuda", dtype=dtype)
    ref = grads(model, x)
    off = Offloader(OffloadConfig(prefetch=prefetch))
    got = grads(model, x, CacheContext(rules=offload_all(off)))
    assert_identical(got, ref)
    assert off.stats.offloaded > 5 and off.stats.kept == 0
    assert off.stats.prefetched + off.stats.loaded_on_use >= off.stats.offloaded  # each loaded at least once
    assert (off.stats.prefetched > 0) == (prefetch > 0)
    acct = got[2].last.by_rule["all+offload"]
    assert acct.stored_bytes == 0 and acct.dense_bytes > 0
    del got
    gc.collect()
    assert off.stats.host_bytes == 0  # every stash was freed with the graph


@pytest.mark.cuda
@pytest.mark.parametrize("preset", ["lossless", "balanced"])
def test_cuda_offloaded_payloads_give_the_same_gradients(preset):
    model, x = ReLUStack().cuda(), torch.randn(N, D, device="cuda")
    ref = grads(model, x, preset=preset, seed=1)
    got = grads(model, x, preset=preset, seed=1, offload=True)
    assert_identical(got, ref)
    off_rules = [s for n, s in got[2].last.by_rule.items() if n.endswith("+offload")]
    assert off_rules and all(s.stored_bytes == 0 for s in off_rules)
    assert got[2].last.bytes_after < ref[2].last.bytes_after


@pytest.mark.cuda
def test_cuda_retained_graph_loads_again():
    model, x = GeluStack().cuda(), torch.randn(N, D, device="cuda")
    ref = grads(model, x, retain=True)
    got = grads(model, x, CacheContext(rules=offload_all(Offloader())), retain=True)
    assert_identical(got, ref)


@pytest.mark.cuda
def test_cuda_device_memory_is_freed_in_forward():
    model, x = GeluStack(d=512, h=2048).cuda(), torch.randn(4096, 512, device="cuda")

    def held_after_forward(cache):
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        if cache is None:
            loss = model(x).pow(2).mean()
        else:
            with cache:
                loss = model(x).pow(2).mean()
        torch.cuda.synchronize()
        held = torch.cuda.memory_allocated() - start
        loss.backward()
        return held

    plain = held_after_forward(None)
    cache = CacheContext(rules=offload_all(Offloader()))
    offloaded = held_after_forward(cache)
    acct = cache.last.by_rule["all+offload"]
    # What the cache moved to the host is no longer on the device: nothing else holds those tensors here.
    assert plain - offloaded >= 0.9 * acct.dense_bytes


@pytest.mark.cuda
def test_cuda_offload_does_not_synchronize():
    model, x = GeluStack().cuda(), torch.randn(N, D, device="cuda")
    cache = CacheContext(CacheConfig(dedup=True), rules=offload_all(Offloader()))
    grads(model, x, cache)  # warm up: pinned blocks, kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.zero_grad(set_to_none=True)
        with cache:
            loss = model(x).pow(2).mean()
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
