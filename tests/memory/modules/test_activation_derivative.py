"""Activations keeping their derivative: the same forward bits, autograd's gradient up to rounding, the derivative a
linear input to the cache (unbiased under its stochastic codes), swapped in and out by compress_ / restore_."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import actzip
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.modules import DerivativeActivation, DerivativeActivationConfig
from actzip.memory.modules.activation_derivative import KINDS, activation

REFERENCE = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_is_the_same_bits_and_the_gradient_autograd_s_up_to_rounding(kind, dtype):
    x = (torch.randn(7, 33, dtype=torch.float64) * 3).to(dtype).requires_grad_()
    ref = x.detach().clone().requires_grad_()
    y, y_ref = DerivativeActivation(kind)(x), REFERENCE[kind](ref)
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y)
    y.backward(g)
    y_ref.backward(g)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(x.grad, ref.grad, rtol=tol, atol=tol)


def test_a_second_derivative_through_it_is_refused():
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(actzip.errors.ActzipError, match="second derivative"):
        torch.autograd.grad(DerivativeActivation("gelu")(x).sum(), x, create_graph=True)
    (g,) = torch.autograd.grad(DerivativeActivation("gelu")(x).sum(), x)  # a first derivative as ever
    assert g.shape == x.shape


def test_without_grad_or_a_cache_it_is_the_plain_activation():
    x = torch.randn(5, 8)
    with torch.no_grad():
        assert torch.equal(DerivativeActivation("silu")(x), F.silu(x))
    assert torch.equal(activation("gelu", x), F.gelu(x))
    with pytest.raises(ConfigError, match="kind"):
        DerivativeActivation("relu")


def _tiny_gpt():
    from actzip_bench.models import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig.of_size("tiny", activation="gelu"))


def _loss(model, idx):
    out = model(idx[:, :-1], idx[:, 1:])
    return out[1] if isinstance(out, tuple) else out


def test_under_a_lossy_preset_the_derivative_is_a_linear_input_and_no_nonlinear_input_is_kept():
    idx = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    counts = {}
    for swapped in (False, True):
        model = _tiny_gpt()
        if swapped:
            actzip.compress_(model, DerivativeActivationConfig())
        c = actzip.cache("2bit", min_bytes=0)
        for _ in range(2):  # a tracked step, then a replayed one
            with c:
                loss = _loss(model, idx)
            loss.backward()
        counts[swapped] = {name: s.tensors for name, s in c.last.by_rule.items()}
    n_layer = 2
    assert counts[False]["nonlinear_input:quant4"] == n_layer and "nonlinear_input:quant4" not in counts[True]
    assert counts[True]["linear_input:quant2"] == counts[False]["linear_input:quant2"] + n_layer
    assert c.role_plan.misses == 0


def test_the_gradient_through_a_stochastic_code_of_the_derivative_is_unbiased():
    x = (torch.randn(64, 128, dtype=torch.float64) * 2).requires_grad_()
    ones = torch.ones(64, 128, dtype=torch.float64)
    exact = torch.autograd.grad(F.gelu(x), x, ones)[0]  # f'(x): what each trial's gradient estimates
    act, c = DerivativeActivation("gelu"), actzip.cache("2bit", min_bytes=0, replay=False)
    trials = []
    for _ in range(200):
        with c:
            y = act(x)
        trials.append(torch.autograd.grad(y, x, ones)[0])
    stack = torch.stack(trials)
    assert not torch.equal(stack[0], stack[1])  # each step draws its own rounding
    assert c.last.by_rule["linear_input:quant2"].tensors == 1
    # Each code lies within one step (a group's span / 3 at 2 bits, at most the whole range's) of f'(x), so by
    # Hoeffding the mean of n trials strays by 3 steps / sqrt(n) with probability under 3e-8, element by element;
    # and the mean over every element and trial by 3 steps / sqrt(n * elements).
    step = float(exact.max() - exact.min()) / 3
    err = stack.mean(0) - exact
    assert err.abs().max() <= 3 * step / len(trials) ** 0.5
    assert abs(float(err.mean())) <= 3 * step / (len(trials) * err.numel()) ** 0.5
    assert stack.std(0).mean() > 0.01 * step  # the codes are noisy: the bounds above are not met trivially


def test_compress_takes_modules_and_declared_mlp_functions_and_restore_puts_them_back():
    import transformers.activations as hf

    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(approximate="tanh"), nn.SiLU(), hf.GELUActivation(),
                          hf.NewGELUActivation(), nn.ReLU())
    ref = copy.deepcopy(model)
    report = actzip.compress_(model, DerivativeActivationConfig())
    assert [what for _, what in report.swapped] == ["DerivativeActivation('gelu_tanh')", "DerivativeActivation('silu')",
                                                    "DerivativeActivation('gelu')"]
    assert any(fqn == "4" and "rounding" in why for fqn, why in report.skipped)  # NewGELU writes its formula out
    x = torch.randn(3, 8)
    assert torch.equal(model(x), ref(x))
    actzip.restore_(model)
    assert [type(m) for m in model] == [type(m) for m in ref]

    gpt = _tiny_gpt()
    act = gpt.h[0].mlp.act
    report = actzip.compress_(gpt, DerivativeActivationConfig())
    assert [fqn for fqn, _ in report.swapped] == ["h.0.mlp.act", "h.1.mlp.act"]
    assert isinstance(gpt.h[0].mlp.act, DerivativeActivation)
    actzip.restore_(gpt)
    assert gpt.h[0].mlp.act is act and "act" not in gpt.h[0].mlp._modules


def test_nothing_to_take_and_bad_kinds_are_refused_by_name():
    with pytest.raises(NothingToCompressError, match="DerivativeActivationConfig"):
        actzip.compress_(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), DerivativeActivationConfig())
    with pytest.raises(NothingToCompressError, match="silu is not among"):
        actzip.compress_(nn.Sequential(nn.SiLU()), DerivativeActivationConfig(kinds=("gelu",)))
    with pytest.raises(ConfigError, match="kinds"):
        DerivativeActivationConfig(kinds=("tanh",))
    cfg = DerivativeActivationConfig(kinds=["silu"])
    assert cfg.kinds == ("silu",) and DerivativeActivationConfig.from_dict(cfg.to_dict()) == cfg


def test_a_swiglu_llama_keeps_its_logits_and_trains_under_a_lossy_preset():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    ref = LlamaForCausalLM(cfg)
    model = copy.deepcopy(ref)
    report = actzip.compress_(model, DerivativeActivationConfig())
    assert len(report.swapped) == 2  # each MLP's act_fn
    idx = torch.randint(0, 64, (2, 16))
    out, out_ref = model(idx, labels=idx), ref(idx, labels=idx)
    assert torch.equal(out.logits, out_ref.logits)
    counts = {}
    for name, m in (("ref", ref), ("swapped", model)):
        c = actzip.cache("2bit", min_bytes=0)
        with c:
            loss = m(idx, labels=idx).loss
        loss.backward()
        counts[name] = {rule: s.tensors for rule, s in c.last.by_rule.items()}
    # each MLP's SiLU input leaves the nonlinear inputs; its derivative joins the linear ones
    assert counts["swapped"]["nonlinear_input:quant4"] == counts["ref"]["nonlinear_input:quant4"] - 2
    assert counts["swapped"]["linear_input:quant2"] == counts["ref"]["linear_input:quant2"] + 2
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.cuda
def test_a_2bit_gpt_step_with_kept_derivatives_does_not_synchronize_after_its_first_steps(sync_free_after_warmup):
    """The derivative goes through the cache's Triton quant codes on the GPU, no host synchronization."""
    model = _tiny_gpt().cuda()
    actzip.compress_(model, DerivativeActivationConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 256, (4, 65), device="cuda")
    cache = actzip.cache("2bit", min_bytes=0)

    def step():
        with cache:
            loss = _loss(model, idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cache.history.clear()

    sync_free_after_warmup(step)
    with cache:
        loss = _loss(model, idx)
    loss.backward()
    assert "nonlinear_input:quant4" not in cache.last.by_rule and cache.last.by_rule["linear_input:quant2"].tensors
