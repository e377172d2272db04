"""graph_safe caches: each block moves the step offset of the stochastic rounding (so a captured CUDA graph's
replays draw new noise), rules that a graph cannot replay are refused by name, and on a GPU a captured training
step replays with new noise each time and no synchronization."""

import pytest
import torch
import torch.nn as nn

import actzip
from actzip.codecs.step_noise import current_offset
from actzip.errors import ConfigError


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))


def test_each_block_moves_the_offset_and_only_inside_the_block():
    cache = actzip.cache("4bit", min_bytes=0, graph_safe=True)
    model, x = _mlp(), torch.randn(32, 64)
    for step in range(3):
        with cache:
            model(x).square().mean().backward()
            assert current_offset(torch.device("cpu")) is cache.step_noise.offset(torch.device("cpu"))
        assert current_offset(torch.device("cpu")) is None
    # made at the first block's first encode, moved on entering the second and third
    assert cache.step_noise.offset(torch.device("cpu")).tolist() == [2]
    assert cache.last.bytes_after * 3 < cache.last.bytes_before


def test_the_offset_changes_the_noise_and_nothing_else():
    """Two caches with the same seed and the same host keys: moving one's offset changes its stochastic codes
    (other gradients), while the account stays the same."""
    x = torch.randn(32, 64)
    grads, kept = [], []
    for moved in (False, True):
        model = _mlp()
        cache = actzip.cache("4bit", min_bytes=0, seed=3, graph_safe=True)
        with cache:
            pass  # the offset exists only once a device has been seen: nothing encoded, nothing made
        with cache:
            if moved:
                cache.step_noise.offset(torch.device("cpu")).fill_(100)
            model(x).square().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        kept.append(cache.last.bytes_after)
    assert any(not torch.equal(a, b) for a, b in zip(*grads)) and kept[0] == kept[1]


def test_a_block_under_capture_tracks_its_roles_instead_of_replaying_the_plan(monkeypatch):
    """The eager steps record a plan and replay it; a block being captured into a CUDA graph tracks its roles
    (a model may take another path under capture), with the same account."""
    cache = actzip.cache("4bit", min_bytes=0, graph_safe=True)
    model, x = _mlp(), torch.randn(32, 64)
    tracked = []
    for capturing in (False, False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: capturing)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        with cache:
            tracked.append(not cache.role_plan.replaying)
            model(x).square().mean().backward()
    assert tracked == [True, False, True]
    assert cache.history[-1].by_rule == cache.history[-2].by_rule


@pytest.mark.parametrize("preset, rule", [("lossless", "sparse"), ("balanced", None)])
def test_rules_a_graph_cannot_replay_are_refused_by_name(preset, rule):
    if rule is None:  # balanced keeps its mostly-zero rule: the sparse codec's payload size needs the values
        with pytest.raises(ConfigError, match="graph_safe=True, but rule .* size depends on the values"):
            actzip.cache(preset, graph_safe=True)
        return
    with pytest.raises(ConfigError, match=f"rule '{rule}'.*size depends on the values"):
        actzip.cache(preset, graph_safe=True)


def test_a_stochastic_codec_that_does_not_follow_the_step_offset_is_refused():
    from actzip.codecs.fp8 import FP8Codec
    from actzip.memory.cache import CacheConfig, CacheContext
    from actzip.memory.cache.rules import Rule

    fp8 = Rule("fp8 everything", lambda t: True, FP8Codec(rounding="stochastic", check=False))
    with pytest.raises(ConfigError, match="rule 'fp8 everything'.*rounds stochastically"):
        CacheContext(CacheConfig(graph_safe=True), rules=[fp8])
    nearest = Rule("fp8 nearest", lambda t: True, FP8Codec(rounding="nearest", check=False))
    assert CacheContext(CacheConfig(graph_safe=True), rules=[nearest]).step_noise is not None


def test_offload_is_refused_and_the_option_must_be_a_bool():
    with pytest.raises(ConfigError, match="offloads to CPU memory"):
        actzip.cache("4bit", offload=True, graph_safe=True)
    with pytest.raises(ConfigError, match="graph_safe must be True or False"):
        actzip.cache("4bit", graph_safe=1)


@pytest.mark.cuda
def test_a_captured_training_step_replays_with_new_noise_and_without_synchronizing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
    x = torch.randn(512, 256, device="cuda")
    cache = actzip.cache("4bit", graph_safe=True)

    def step():
        with cache:
            loss = model(x).float().square().mean()
        loss.backward()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch's recipe: warm up on a side stream (kernels compiled, offsets made)
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step()
    grads = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            graph.replay()
            # the second layer's: its input (the GELU's output) is rounded stochastically; the first layer's
            # weight gradient reads the kept input x and the GELU input rounded to nearest, the same each replay
            grads.append(model[2].weight.grad.clone())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss) and not torch.equal(grads[0], grads[1])  # the same batch, new rounding noise
    # and the replays are 4-bit steps: close to the exact gradient, not equal to it
    model.zero_grad(set_to_none=True)
    model(x).float().square().mean().backward()
    exact = model[2].weight.grad
    assert not torch.equal(grads[0], exact)
    assert torch.nn.functional.cosine_similarity(grads[0].flatten(), exact.flatten(), dim=0) > 0.99
