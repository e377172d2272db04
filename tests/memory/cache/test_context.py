"""The cache context: bit-identical gradients, dedup, rules, accounting, composition; ``actzip.cache``."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import actzip
from actzip.errors import ConfigError, UnknownCodecError
from actzip.memory.cache import CacheConfig, CacheContext, Rule
from actzip_bench.models import GPT, GPTConfig


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a
    for n in a:
        assert torch.equal(a[n], b[n]), f"gradient of {n} differs"


class ReLU2MLP(nn.Module):
    def __init__(self, d=64, h=256, act="relu2"):
        super().__init__()
        self.up, self.down, self.act = nn.Linear(d, h), nn.Linear(h, d), act

    def forward(self, x):
        a = F.relu(self.up(x))
        return self.down(a.square() if self.act == "relu2" else a)


def step(model, x, cache=None):
    model.zero_grad(set_to_none=True)
    if cache is None:
        loss = model(x).float().pow(2).mean()
    else:
        with cache:
            loss = model(x).float().pow(2).mean()
    loss.backward()
    return loss.detach(), grads_of(model)


@pytest.mark.parametrize("act", ["relu", "relu2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlp_gradients_bit_identical(act, dtype):
    model = ReLU2MLP(act=act).to(dtype)
    x = torch.randn(512, 64, dtype=dtype)
    loss0, g0 = step(model, x)
    cache = actzip.cache(min_bytes=0)
    loss1, g1 = step(model, x, cache)
    assert torch.equal(loss0, loss1)
    assert_grads_identical(g0, g1)
    acct = cache.last
    assert acct.by_rule["sparse"].tensors >= 1
    assert acct.bytes_after < acct.bytes_before


def test_relu_output_saved_twice_is_stored_once():
    model = ReLU2MLP(act="relu2")
    x = torch.randn(256, 64)
    cache = actzip.cache(min_bytes=0)
    step(model, x, cache)
    # relu saves its output and square saves the same tensor as input: one payload, one duplicate.
    assert cache.last.duplicates >= 1
    assert cache.last.duplicate_bytes >= 256 * 256 * 4


def test_parameters_and_inputs_are_never_compressed():
    lin = nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(F.relu(lin.weight))  # a mostly-zero weight would be a compression target
    x = F.relu(torch.randn(128, 64)).requires_grad_()
    cache = actzip.cache(min_bytes=0)
    with cache:
        y = lin(x).sum()
    y.backward()
    assert cache.last.by_rule["leaf"].tensors == 2  # x and weight.t()
    assert "sparse" not in cache.last.by_rule
    assert cache.last.bytes_before == 0


def test_small_and_dense_tensors_are_kept():
    model = ReLU2MLP()
    x = torch.randn(8, 64)
    cache = actzip.cache()  # default min_bytes: everything here is small
    step(model, x, cache)
    assert set(cache.last.by_rule) <= {"leaf", "small"}
    dense = nn.Linear(64, 64)
    cache2 = actzip.cache(min_bytes=0)
    with cache2:
        y = torch.tanh(dense(torch.randn(512, 64))).sum()
    y.backward()
    assert cache2.last.by_rule["dense"].tensors >= 1
    assert cache2.last.bytes_before == cache2.last.bytes_after


def test_custom_rules_and_unmatched():
    seen = []
    rules = [Rule("everything", lambda t: seen.append(tuple(t.shape)) or False)]
    cache = actzip.cache(rules=rules)
    model = ReLU2MLP()
    step(model, torch.randn(32, 64), cache)
    # Rules see each distinct tensor once: duplicates are answered before the rules run.
    assert seen and cache.last.by_rule["unmatched"].tensors == len(seen)
    assert cache.last.duplicates >= 1


def test_count_only_counts_the_same_bytes_without_compressing():
    model = ReLU2MLP()
    x = torch.randn(512, 64)
    counting, compressing = CacheContext.count_only(), actzip.cache(min_bytes=0)
    _, g0 = step(model, x, counting)
    _, g1 = step(model, x, compressing)
    assert_grads_identical(g0, g1)
    assert counting.last.bytes_before == counting.last.bytes_after == compressing.last.bytes_before


def test_entering_twice_is_an_error_and_history_accumulates():
    cache = actzip.cache()
    with cache:
        with pytest.raises(RuntimeError, match="already active"):
            cache.__enter__()
    with cache:
        pass
    assert len(cache.history) == 2
    with pytest.raises(RuntimeError, match="no account yet"):
        actzip.cache().last


def test_config_errors_at_config_time():
    with pytest.raises(UnknownCodecError, match="available"):
        CacheConfig(codec="nope")
    with pytest.raises(ConfigError, match="min_zero_fraction"):
        CacheConfig(min_zero_fraction=1.5)
    with pytest.raises(ConfigError, match="min_bytes"):
        CacheConfig(min_bytes=-1)
    with pytest.raises(ConfigError, match="tile_size"):
        CacheConfig(codec_options={"tile_size": 7})


def test_composes_with_activation_checkpointing():
    model = ReLU2MLP()
    x = torch.randn(512, 64, requires_grad=True)

    def run(cache):
        model.zero_grad(set_to_none=True)
        x.grad = None
        ctx = cache if cache is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        with ctx:
            h = checkpoint(model, x, use_reentrant=False)
            loss = (model(F.relu(h)) ** 2).mean()
        loss.backward()
        return {**grads_of(model), "x": x.grad.clone()}

    g0 = run(None)
    cache = actzip.cache(min_bytes=0)
    g1 = run(cache)
    assert_grads_identical(g0, g1)
    assert cache.last.by_rule["sparse"].tensors >= 1


@pytest.mark.parametrize("activation", ["relu2", "relu", "gelu"])
def test_reference_gpt_gradients_bit_identical(activation):
    cfg = GPTConfig.of_size("tiny", activation=activation)
    model = GPT(cfg)
    idx = torch.randint(0, 256, (4, cfg.block_size))
    tgt = torch.randint(0, 256, (4, cfg.block_size))

    def run(cache):
        model.zero_grad(set_to_none=True)
        if cache is None:
            _, loss = model(idx, tgt)
        else:
            with cache:
                _, loss = model(idx, tgt)
        loss.backward()
        return loss.detach(), grads_of(model)

    l0, g0 = run(None)
    cache = actzip.cache(min_bytes=0)
    l1, g1 = run(cache)
    assert torch.equal(l0, l1)
    assert_grads_identical(g0, g1)
    if activation != "gelu":
        assert cache.last.by_rule["sparse"].tensors >= cfg.n_layer
        assert cache.last.bytes_after < cache.last.bytes_before


def test_payload_without_gain_keeps_the_tensor():
    # A mostly-zero tensor too small for the mask to pay off: the rule matches but the tensor is kept.
    cache = CacheContext(CacheConfig(min_bytes=0, min_zero_fraction=0.0, codec_options={"tile_size": 4096}))
    x = torch.randn(4, requires_grad=True)
    with cache:
        y = (F.relu(x * 2) * 3).sum()
    y.backward()
    assert cache.last.by_rule["incompressible"].tensors >= 1


def test_zero_fraction_exact_when_small_and_close_when_sampled():
    from actzip.memory.cache.rules import zero_fraction

    x = torch.zeros(1000)
    x[:300] = 1.0
    assert zero_fraction(x) == pytest.approx(0.7)
    big = (torch.rand(3_000_000) < 0.37).float()
    assert abs(zero_fraction(big) - (1 - 0.37)) < 0.01
    # A periodic pattern must not fool the sampler (every 4096th element non-zero).
    periodic = torch.zeros(1 << 22)
    periodic[::4096] = 1.0
    assert zero_fraction(periodic) > 0.99
    assert zero_fraction(torch.zeros(0)) == 0.0
    assert zero_fraction(torch.tensor([-0.0, 0.0])) == 0.5  # -0.0 has a bit set
    rng_before = torch.get_rng_state()
    zero_fraction(big)
    assert torch.equal(rng_before, torch.get_rng_state())


def test_a_node_that_saves_its_output_does_not_keep_the_graph_alive():
    # relu saves its own output; holding that tensor itself in the hook's box would be a cycle
    # (node -> box -> output -> node) that keeps every tensor of a graph alive when no backward runs
    # (a probe forward, an evaluation step with grad enabled, an exception before backward).
    from torch.multiprocessing.reductions import StorageWeakRef

    x = torch.randn(64, 64, requires_grad=True)
    for cache in (CacheContext.count_only(), actzip.cache()):
        with cache:
            r = torch.relu(x * 2.0)
            loss = r.square().sum()
        ref = StorageWeakRef(r.untyped_storage())
        del r, loss
        assert ref.expired()


def test_mostly_zero_decision_is_remembered_per_save_site(monkeypatch):
    from actzip.memory.cache import rules as rules_mod

    calls = []
    real = rules_mod.zero_fraction
    monkeypatch.setattr(rules_mod, "zero_fraction", lambda t, *a: calls.append(tuple(t.shape)) or real(t, *a))
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
    x = torch.randn(32, 64, requires_grad=True)
    cache = actzip.cache(min_bytes=0, recheck_every=3)

    def step():
        with cache:
            a = lin1(x)
            y = lin2(torch.relu(a)).sum() + torch.tanh(a).sum()  # tanh keeps its dense output
        y.backward()
        return {k: v.tensors for k, v in cache.last.by_rule.items()}

    first = step()
    sampled = len(calls)
    assert sampled == 2 and first["sparse"] == 1 and first["dense"] == 1  # relu's output is mostly zeros
    assert step() == first and step() == first and len(calls) == sampled  # remembered: no sample, same decisions
    step()  # the 3rd reuse is over: each site is sampled again
    assert len(calls) == 2 * sampled
    calls.clear()
    with cache:  # another shape at the same sites: sampled afresh
        a = lin1(torch.randn(16, 64))
        lin2(torch.relu(a)).sum() + torch.tanh(a).sum()
    assert len(calls) == sampled


def test_recheck_every_zero_samples_every_time_and_bad_values_fail():
    with pytest.raises(ConfigError, match="recheck_every"):
        CacheConfig(recheck_every=-1)
    cache = actzip.cache(CacheConfig(min_bytes=0, recheck_every=0))
    rule = next(r for r in cache.rules if r.name == "sparse")
    x = torch.relu(torch.randn(1000))
    with cache:
        for _ in range(3):
            rule.when(x)
    assert rule.when.samples == 3


def test_a_payload_shared_by_several_saves_is_decoded_once():
    # q, k and v projections of one input: three saves of one tensor, unpacked one after another in backward.
    import actzip

    codec = actzip.codecs.get("quant", bits=8, rounding="nearest", kernel="torch")
    decodes = []
    decode = codec.decode
    codec.decode = lambda p: decodes.append(p) or decode(p)
    projections = nn.ModuleList(nn.Linear(32, 32, bias=False) for _ in range(3))
    x = torch.randn(16, 32, requires_grad=True)
    cache = actzip.cache(rules=[Rule("all", lambda t: t.dim() == 2 and not isinstance(t, nn.Parameter), codec)])
    for _ in range(2):  # the count restarts with each step's own payloads
        decodes.clear()
        with cache:
            h = x.tanh()  # one input for all three (tanh saves its output: the same tensor, a fourth save)
            loss = sum(p(h).square().sum() for p in projections)
        loss.backward()
        assert cache.last.duplicates == 3 and decodes and len({id(p) for p in decodes}) == len(decodes)


def test_a_codec_error_names_the_saved_tensor():
    import actzip
    from actzip.errors import InvalidValueError

    codec = actzip.codecs.get("quant", bits=8, kernel="torch")  # check=True: inf/NaN refused
    cache = actzip.cache(rules=[Rule("all", lambda t: t.dim() == 2 and t.shape[0] == 4, codec)])
    x = torch.tensor([[1.0, float("nan")] * 4] * 4, requires_grad=True)
    message = r"saved tensor \(4, 8\) torch.float32 has 16 of 32 elements non-finite"
    with pytest.raises(InvalidValueError, match=message):
        with cache:
            x.exp()


# -- actzip.cache: one entry point -----------------------------------------------------------------------------


def _names(cache) -> list[str]:
    return [r.name for r in cache.rules]


def test_cache_default_is_the_lossless_preset():
    default = actzip.cache()
    assert default.config == CacheConfig() and default.config.preset == "lossless"
    assert _names(default) == ["leaf", "unsupported", "small", "sparse", "dense"]
    assert not default.track_roles  # the lossless rules never ask for a role


def test_cache_from_a_preset_name_a_config_and_options():
    four = actzip.cache("4bit", min_bytes=0, seed=3)
    assert four.config == CacheConfig(preset="4bit", min_bytes=0, seed=3)
    assert four.track_roles and "linear_input:quant4" in _names(four)
    cfg = CacheConfig(preset="balanced", group_size=64)
    assert actzip.cache(cfg).config is cfg
    assert actzip.cache(cfg, min_bytes=0).config == CacheConfig(preset="balanced", group_size=64, min_bytes=0)
    offloaded = actzip.cache("balanced", offload=True)
    offloading = [r for r in offloaded.rules if r.name.endswith("+offload")]
    assert offloading and all(r.offload is offloaded.rules[-1].offload for r in offloading)


def test_cache_with_rules_tracks_roles_only_when_they_ask():
    from actzip.memory.cache import current_role, preset_rules
    from actzip.memory.cache.roles import tracking

    seen = []
    asks = Rule("asks", lambda t: seen.append((current_role(t), tracking())) or False, needs_role=True)
    cache = actzip.cache(rules=[asks, Rule("kept", lambda t: True)])
    assert cache.track_roles
    x = torch.randn(64, 64, requires_grad=True) * 1.0
    with cache:
        F.gelu(x)
    assert seen == [("nonlinear_input", True)] and not tracking()
    plain = actzip.cache(rules=[Rule("kept", lambda t: True)])
    assert not plain.track_roles
    assert not actzip.cache(rules=preset_rules("balanced"), track_roles=False).track_roles
    assert actzip.cache(rules=preset_rules("balanced"), dedup=False).config.dedup is False


def test_cache_under_a_lossy_preset_compresses_and_prints_its_account():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    x = torch.randn(512, 64)
    with actzip.cache("balanced", min_bytes=0) as c:
        loss = model(x).pow(2).mean()
    loss.backward()
    assert c.last.by_rule["linear_input:quant4"].tensors == 1 and c.last.bytes_after < c.last.bytes_before
    text = str(c.last)
    assert text.splitlines()[0].split() == ["rule", "tensors", "before", "after", "ratio"]
    assert "linear_input:quant4" in text and "total (no leaf)" in text and "MiB" in text


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        (("fast",), {}, r"unknown activation cache preset 'fast'; presets: lossless, conservative, balanced"),
        ((), {"min_byte": 0}, r"unknown option\(s\) min_byte; options: preset, min_bytes"),
        (("4bit",), {"preset": "2bit"}, r"preset given twice"),
        ((4,), {}, r"expected a preset name or a CacheConfig, got int"),
        (("balanced",), {"rules": []}, r"the option\(s\) preset would be ignored"),
        ((), {"rules": [], "min_bytes": 0}, r"the option\(s\) min_bytes would be ignored"),
        ((), {"rules": Rule("kept", lambda t: True)}, r"rules must be a list of Rule objects"),
        ((), {"rules": ["kept"]}, r"rules must be actzip.memory.cache.rules.Rule objects"),
        ((), {"treatments": {"mlp": "kept"}}, r"unknown role 'mlp' in treatments"),
        (("balanced",), {"codec": "passthrough"}, r"CacheConfig.codec is the lossless preset's"),
    ],
)
def test_cache_refuses_bad_input_before_any_block(args, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        actzip.cache(*args, **kwargs)


def test_record_external_goes_to_the_innermost_open_cache():
    from actzip.memory.cache import record_external

    outer, inner = CacheContext.count_only(), CacheContext.count_only()
    record_external("fused", 10, 2)  # no cache open: nothing to account, no error
    with outer:
        with inner:
            record_external("fused", 100, 25)
        record_external("fused", 8, 8)
    assert inner.last.by_rule["fused"].dense_bytes == 100 and outer.last.by_rule["fused"].stored_bytes == 8


def test_a_block_that_compresses_nothing_is_announced_once_and_counted():
    import warnings

    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 1))
    cache = actzip.cache("4bit")  # every tensor of this model is under min_bytes
    with pytest.warns(RuntimeWarning, match=r"saved 2 activation tensors and compressed none \(by rule: small 2\).*min_bytes"):
        with cache:
            model(torch.randn(2, 4)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with cache:
                model(torch.randn(2, 4)).sum().backward()
        assert cache.idle_steps == 3
        working = actzip.cache("4bit", min_bytes=0)
        with working:
            model(torch.randn(256, 4)).sum().backward()
        assert working.idle_steps == 0
        counting = actzip.memory.cache.CacheContext.count_only()  # compresses nothing by design: silent
        with counting:
            model(torch.randn(2, 4)).sum().backward()
        with actzip.cache("4bit"), torch.no_grad():  # nothing saved: nothing to announce
            model(torch.randn(2, 4))
