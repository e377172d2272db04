"""Cache presets: lossless is exact, lossy ones shrink linear inputs and keep nonlinear inputs at >= 8 bits."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError
from actzip.memory.cache import CacheConfig, CacheContext, RoleTracker
from actzip.memory.cache.presets import PRESETS, describe, preset_rules
from actzip.memory.cache.roles import tracking
from actzip.memory.cache.rules import same_treatment

D, H, N = 64, 256, 1024


def gelu_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(D), nn.Linear(D, H), nn.GELU(), nn.Linear(H, D))


class ReLUMLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.up, self.down = nn.LayerNorm(D), nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return self.down(F.relu(self.up(self.norm(x))))


def grads(model, x, y, preset=None, **options):
    model.zero_grad(set_to_none=True)
    cache = None
    if preset is None:
        loss = (model(x) - y).pow(2).mean()
    else:
        with actzip.cache(preset, min_bytes=0, **options) as cache:
            loss = (model(x) - y).pow(2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, cache


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, D, generator=g), torch.randn(N, D, generator=g)


def test_presets_listed_and_unknown_refused():
    assert {"lossless", "conservative", "balanced", "aggressive"} <= set(PRESETS)
    with pytest.raises(ConfigError, match="lossless.*conservative.*balanced.*aggressive"):
        preset_rules("fast")
    with pytest.raises(ConfigError, match="presets:"):
        with actzip.cache("nope"):
            pass
    assert not tracking()
    for name, p in PRESETS.items():
        assert p.lossy == (name != "lossless")
        assert ("lossy" in describe(name)) == p.lossy


@pytest.mark.parametrize("model_fn", [gelu_mlp, ReLUMLP])
def test_lossless_is_bit_identical(model_fn, data):
    model = model_fn()
    loss0, g0, _ = grads(model, *data)
    loss1, g1, cache = grads(model, *data, preset="lossless")
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
    assert cache.last.bytes_before > 0


def test_balanced_gelu_mlp_close_and_smaller(data):
    model = gelu_mlp()
    loss0, g0, _ = grads(model, *data)
    loss1, g1, cache = grads(model, *data, preset="balanced", seed=0)
    assert torch.equal(loss0, loss1)  # the forward pass is untouched
    acct = cache.last
    lin = acct.by_rule["linear_input:quant4"]
    assert lin.tensors == 2 and lin.dense_bytes >= 6 * lin.stored_bytes  # fp32 -> 4 bits + group params
    assert acct.by_rule["nonlinear_input:quant8"].tensors == 2  # the GELU input and the squared error
    assert acct.bytes_before >= 3 * acct.bytes_after
    # One step: 4-bit stochastic rounding adds noise of about 10% of the weight gradients' norm ...
    for n in ("1.weight", "3.weight"):
        assert rel(g1[n], g0[n]) < 0.2
        assert F.cosine_similarity(g1[n].flatten(), g0[n].flatten(), dim=0) > 0.98
    # ... which averages out: the rounding is unbiased, so 8 seeds bring the mean ~sqrt(8) closer.
    mean = {n: torch.zeros_like(g) for n, g in g0.items()}
    for seed in range(8):
        _, g, _ = grads(model, *data, preset="balanced", seed=seed)
        for n in mean:
            mean[n] += g[n] / 8
    for n in ("1.weight", "3.weight"):
        assert rel(mean[n], g0[n]) < 0.5 * rel(g1[n], g0[n])
    # Gradients that depend only on exactly stored or 8-bit tensors stay very close.
    assert rel(g1["0.weight"], g0["0.weight"]) < 0.02


def test_aggressive_is_smaller_still(data):
    model = gelu_mlp()
    sizes = {}
    for preset in ("conservative", "balanced", "aggressive"):
        _, g, cache = grads(model, *data, preset=preset)
        sizes[preset] = cache.last.bytes_after
        assert all(torch.isfinite(v).all() for v in g.values())
    assert sizes["aggressive"] < sizes["balanced"] < sizes["conservative"]


def test_relu_outputs_go_to_lossless_sparse(data):
    model = ReLUMLP()
    _, g0, _ = grads(model, *data)
    _, g1, cache = grads(model, *data, preset="conservative")
    acct = cache.last
    assert acct.by_rule["relu_output:sparse"].tensors == 1
    assert acct.duplicates >= 1  # the relu output, saved again as the next linear's input, is stored once
    assert acct.by_rule["linear_input:quant8"].tensors == 1  # the norm's output
    assert rel(g1["down.weight"], g0["down.weight"]) < 1e-6  # reads only the (lossless) relu output


NONLINEAR_MODELS = {
    "gelu_mlp": gelu_mlp,
    "swiglu": lambda: SwiGLU(),
    "tanh_mul": lambda: TanhMul(),
}


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(D, H), nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class TanhMul(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(D, D), nn.Linear(D, D)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h * torch.sigmoid(h) / (h.square() + 1))


SAFE_PRESETS = [name for name, p in PRESETS.items() if p.min_nonlinear_bits >= 8]  # all but 4bit and 2bit


@pytest.mark.parametrize("preset", SAFE_PRESETS)
@pytest.mark.parametrize("model", list(NONLINEAR_MODELS))
def test_nonlinear_inputs_never_below_8_bits(preset, model, data):
    _, _, cache = grads(NONLINEAR_MODELS[model](), *data, preset=preset)
    names = [n for n in cache.last.by_rule if n.startswith("nonlinear_input:")]
    if preset in ("balanced", "aggressive"):
        assert names
    for name in names:
        m = re.fullmatch(r"nonlinear_input:(kept|sparse|quant(\d+))", name)
        assert m and (m.group(2) is None or int(m.group(2)) >= 8), name


@pytest.mark.parametrize("preset", SAFE_PRESETS)
def test_rules_keep_the_safety_rule(preset):
    for rule in preset_rules(preset):
        if rule.name.startswith("nonlinear_input:") and rule.codec is not None:
            assert rule.codec.lossless or rule.codec.bits >= 8
        if rule.codec is not None and not rule.codec.lossless:
            assert rule.name.startswith("linear_input:") or rule.name.startswith("nonlinear_input:")
            assert rule.name.endswith(f"quant{rule.codec.bits}")


def test_without_a_tracker_nothing_is_lossy(data):
    model = gelu_mlp()
    _, g0, _ = grads(model, *data)
    cache = CacheContext(CacheConfig(track_roles=False), rules=preset_rules("aggressive", min_bytes=0))
    model.zero_grad(set_to_none=True)
    with cache:
        (model(data[0]) - data[1]).pow(2).mean().backward()
    assert all(torch.equal(p.grad, g0[n]) for n, p in model.named_parameters())
    assert cache.last.bytes_after == cache.last.bytes_before
    assert set(cache.last.by_rule) <= {"leaf", "other:kept"}


def test_manual_composition_and_small_tensors(data):
    model = gelu_mlp()
    cache = CacheContext(rules=preset_rules("balanced"))  # default min_bytes: 64 KiB
    x = data[0][:16]  # every activation is under 64 KiB
    with RoleTracker():
        with cache:
            model(x).sum().backward()
    assert "small" in cache.last.by_rule
    assert not any(":quant" in n for n in cache.last.by_rule)
    assert not tracking()


def test_lossy_copy_is_not_shared_with_a_stricter_save():
    # h is saved by the linear layer (4-bit under "balanced") and by the multiply (a nonlinear input: 8 bits).
    torch.manual_seed(0)
    lin = nn.Linear(64, 64)
    x = torch.randn(512, 64, requires_grad=True)
    with actzip.cache("balanced", min_bytes=0) as cache:
        h = x * 2.0  # not a leaf, so the cache may compress it
        y = (lin(h) * h).sum()
    y.backward()
    rules = cache.last.by_rule
    assert rules["linear_input:quant4"].tensors == 1
    # Both operands of the multiply (lin(h) and h itself) get 8-bit copies: h's 4-bit copy is not reused.
    assert rules["nonlinear_input:quant8"].tensors == 2
    assert cache.last.duplicates == 0


def test_a_lossy_copy_is_shared_by_saves_the_rules_treat_alike():
    # q, k and v projections of one input: three saves of the same tensor as a linear input, one 4-bit copy.
    torch.manual_seed(0)
    q, k, v = (nn.Linear(64, 64) for _ in range(3))
    x = torch.randn(512, 64, requires_grad=True)
    with actzip.cache("balanced", min_bytes=0) as cache:
        h = x * 2.0
        y = (q(h) + k(h) + v(h)).sum()
    y.backward()
    assert cache.last.by_rule["linear_input:quant4"].tensors == 1
    assert cache.last.duplicates == 2


def test_the_4bit_preset_stores_every_float_activation_in_4_bits():
    # It opts out of the safety rule, and says so; everything not a leaf and not small goes to 4 bits.
    import torch.nn as nn

    assert PRESETS["4bit"].min_nonlinear_bits == 4 and "safety rule" in PRESETS["4bit"].description
    assert set(PRESETS) - set(SAFE_PRESETS) == {"4bit", "2bit"}
    torch.manual_seed(0)
    fc, proj, norm = nn.Linear(64, 256), nn.Linear(256, 64), nn.LayerNorm(64)
    x = torch.randn(512, 64, requires_grad=True)
    with actzip.cache("4bit", min_bytes=0) as cache:
        h = fc(norm(x * 2.0))
        y = proj(torch.relu(h) ** 2).sum()  # relu² : relu's output is saved by relu and by the square
    y.backward()
    lossy = {n: a for n, a in cache.last.by_rule.items() if n != "leaf"}
    assert lossy and all(n.endswith(":quant4") for n in lossy), sorted(lossy)
    assert cache.last.bytes_after * 3.5 < cache.last.bytes_before - cache.last.by_rule["leaf"].dense_bytes
    # the relu output, saved twice under rules that store it alike (4-bit, nearest), is stored once
    assert cache.last.duplicates >= 1


def test_saves_under_different_roles_but_the_same_codec_share_one_copy():
    rules = {r.name: r for r in preset_rules("4bit")}
    assert same_treatment(rules["relu_output:quant4"], rules["nonlinear_input:quant4"])
    assert not same_treatment(rules["linear_input:quant4"], rules["nonlinear_input:quant4"])  # sr vs rn
    bal = {r.name: r for r in preset_rules("balanced")}
    assert not same_treatment(bal["linear_input:quant4"], bal["nonlinear_input:quant8"])


def test_the_2bit_preset_takes_linear_inputs_to_2_bits_and_the_rest_to_4():
    import torch.nn as nn

    assert PRESETS["2bit"].min_nonlinear_bits == 4 and "safety rule" in PRESETS["2bit"].description
    torch.manual_seed(0)
    fc, proj, norm = nn.Linear(64, 256), nn.Linear(256, 64), nn.LayerNorm(64)
    x = torch.randn(512, 64, requires_grad=True)
    with actzip.cache("2bit", min_bytes=0) as cache:
        y = proj(torch.nn.functional.gelu(fc(norm(x * 2.0)))).sum()
    y.backward()
    by = cache.last.by_rule
    assert by["linear_input:quant2"].tensors == 2 and by["nonlinear_input:quant4"].tensors == 1, sorted(by)
    assert by["norm:quant4"].tensors >= 1
    assert all(n.endswith((":quant2", ":quant4")) for n in by if n != "leaf"), sorted(by)


@pytest.mark.cuda
@pytest.mark.parametrize("preset", ["4bit", "2bit", "conservative", "balanced", "aggressive"])
def test_a_lossy_preset_trains_a_gpt_step_without_synchronizing_after_its_first_steps(preset, sync_free_after_warmup):
    """Forward, backward and the optimizer's step of the reference GPT (GELU: no mostly-zero tensors) under a
    lossy preset, with the roles replayed: after a few steps nothing waits for the device."""
    from actzip_bench.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.of_size("tiny", activation="gelu")).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 256, (4, 65), device="cuda")
    cache = actzip.cache(preset, min_bytes=0)

    def step():
        with cache:
            _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cache.history.clear()

    sync_free_after_warmup(step)
