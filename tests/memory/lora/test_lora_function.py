"""Compressed LoRA linear: exact output / grad_X / grad_B, CARE's grad_A, dropout masks, and what is kept."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from actzip.errors import ConfigError
from actzip.memory.cache import CacheContext
from actzip.memory.lora import (
    LoRAConfig,
    LoRALinear,
    LoRALinearFunction,
    fit_reconstruction,
    lora_linear,
    row_mask,
    saved_bytes_by_module,
)

D_IN, D_OUT, R = 48, 40, 4


def plain_lora(x, base, a, b, b_bias, scale, p):
    """peft's LoRA forward under autograd: base(x) + lora_B(lora_A(dropout(x))) * scaling."""
    result = base(x)
    xa = x.to(a.dtype)
    h = F.dropout(xa, p, True) if p > 0 else xa
    return (result + F.linear(F.linear(h, a), b, b_bias) * scale).to(result.dtype)


def make(dtype=torch.float32, adapter_dtype=None, bias=True, lora_bias=False):
    base = nn.Linear(D_IN, D_OUT, bias=bias).to(dtype).requires_grad_(False)
    adt = adapter_dtype or dtype
    a = (torch.randn(R, D_IN) / D_IN**0.5).to(adt).requires_grad_()
    b = (torch.randn(D_OUT, R) / R**0.5).to(adt).requires_grad_()
    bb = torch.randn(D_OUT).to(adt).requires_grad_() if lora_bias else None
    return base, a, b, bb


def grads(fn, x0, g, params, seed=5):
    x = x0.clone().requires_grad_()
    for prm in params:
        prm.grad = None
    torch.manual_seed(seed)
    y = fn(x)
    y.backward(g)
    return [y.detach(), x.grad] + [prm.grad for prm in params]


def grad_a_errors(base, a, b, x0, g, configs: dict) -> dict:
    """grad_A's relative error against plain LoRA under each named config; grad_X and grad_B must stay
    bit-identical to plain LoRA's."""
    ref = grads(lambda x: plain_lora(x, base, a, b, None, 1.0, 0.0), x0, g, [a, b])
    errors = {}
    for key, cfg in configs.items():
        got = grads(lambda x, cfg=cfg: lora_linear(x, base.weight, base.bias, a, b, scale=1.0, config=cfg), x0, g,
                    [a, b])
        assert torch.equal(got[1], ref[1]) and torch.equal(got[3], ref[3])  # grad_x, grad_b unchanged
        errors[key] = float((got[2] - ref[2]).norm() / ref[2].norm())
    return errors


@pytest.mark.parametrize("dtype,adapter_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                                 (torch.bfloat16, torch.float32), (torch.float64, None)])
@pytest.mark.parametrize("bias,lora_bias", [(True, False), (False, True)])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("method", ["lora", "fa", "care"])
def test_output_grad_x_grad_b_bit_identical_to_plain_lora(dtype, adapter_dtype, bias, lora_bias, p, method):
    base, a, b, bb = make(dtype, adapter_dtype, bias, lora_bias)
    if method == "fa":
        a.requires_grad_(False)
    params = [t for t in (a, b, bb) if t is not None and t.requires_grad]
    x0 = torch.randn(3, 7, D_IN).to(dtype)
    g = torch.randn(3, 7, D_OUT).to(dtype)
    ref = grads(lambda x: plain_lora(x, base, a, b, bb, 2.0, p), x0, g, params)
    got = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, bb, scale=2.0, p=p,
                                      config=LoRAConfig(method=method)), x0, g, params)
    names = ["y", "grad_x"] + [n for n, t in (("grad_a", a), ("grad_b", b), ("grad_b_bias", bb))
                               if t is not None and t.requires_grad]
    for name, r0, r1 in zip(names, ref, got, strict=True):
        if name == "grad_a" and method == "care":
            assert r1.shape == r0.shape and r1.dtype == r0.dtype and torch.isfinite(r1).all()
        else:
            assert torch.equal(r0, r1), name


def plain_conv1d_lora(x, weight_in_out, bias, a, b, scale, p):
    """peft over transformers' Conv1D (GPT-2): the base is ``addmm(bias, x, W)`` with ``W`` stored ``[in, out]``."""
    flat = torch.addmm(bias, x.view(-1, x.size(-1)), weight_in_out)
    result = flat.view(x.size()[:-1] + (weight_in_out.shape[1],))
    xa = x.to(a.dtype)
    h = F.dropout(xa, p, True) if p > 0 else xa
    return (result + F.linear(F.linear(h, a), b) * scale).to(result.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("p", [0.0, 0.1])
@pytest.mark.parametrize("method", ["lora", "fa", "care"])
def test_transposed_base_weight_bit_identical_to_conv1d(dtype, p, method):
    base, a, b, _ = make(dtype)
    w = base.weight.t().contiguous()  # [in, out], as Conv1D keeps it
    base.bias.requires_grad_()  # the base bias gradient goes through addmm too
    if method == "fa":
        a.requires_grad_(False)
    params = [t for t in (base.bias, a, b) if t.requires_grad]
    x0, g = torch.randn(3, 7, D_IN).to(dtype), torch.randn(3, 7, D_OUT).to(dtype)
    ref = grads(lambda x: plain_conv1d_lora(x, w, base.bias, a, b, 2.0, p), x0, g, params)
    got = grads(lambda x: lora_linear(x, w, base.bias, a, b, scale=2.0, p=p, fan_in_fan_out=True,
                                      config=LoRAConfig(method=method)), x0, g, params)
    names = ["y", "grad_x", "grad_bias"] + (["grad_a"] if method != "fa" else []) + ["grad_b"]
    for name, r0, r1 in zip(names, ref, got, strict=True):
        if name == "grad_a" and method == "care":
            assert r1.shape == r0.shape and r1.dtype == r0.dtype and torch.isfinite(r1).all()
        else:
            assert torch.equal(r0, r1), name


def test_care_grad_a_exact_for_a_transposed_base_when_x_is_low_rank():
    torch.manual_seed(1)
    base, a, b, _ = make(torch.float64)
    w = base.weight.t().contiguous()
    x0 = torch.randn(200, R, dtype=torch.float64) @ torch.randn(R, D_IN, dtype=torch.float64)
    g = torch.randn(200, D_OUT, dtype=torch.float64)
    ref = grads(lambda x: plain_conv1d_lora(x, w, base.bias, a, b, 1.0, 0.0), x0, g, [a])
    got = grads(lambda x: lora_linear(x, w, base.bias, a, b, scale=1.0, fan_in_fan_out=True,
                                      config=LoRAConfig(lam=1e-12)), x0, g, [a])
    assert torch.equal(ref[1], got[1])
    assert (got[2] - ref[2]).norm() / ref[2].norm() < 1e-8


def test_frozen_base_bias_gradient_exact():
    base, a, b, _ = make()
    base.bias.requires_grad_()
    x0, g = torch.randn(5, 9, D_IN), torch.randn(5, 9, D_OUT)
    ref = grads(lambda x: plain_lora(x, base, a, b, None, 1.0, 0.0), x0, g, [base.bias])
    got = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0), x0, g, [base.bias])
    assert torch.equal(ref[2], got[2])


@pytest.mark.parametrize("k", [R, R - 2])  # rank(X) = r, and rank(X) < r (ZᵀZ singular)
def test_care_grad_a_exact_when_x_in_a_low_dimensional_row_space(k):
    torch.manual_seed(1)
    base, a, b, _ = make(torch.float64)
    x0 = torch.randn(300, k, dtype=torch.float64) @ torch.randn(k, D_IN, dtype=torch.float64)
    g = torch.randn(300, D_OUT, dtype=torch.float64)
    ref = grads(lambda x: plain_lora(x, base, a, b, None, 1.5, 0.0), x0, g, [a])
    got = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.5,
                                      config=LoRAConfig(lam=1e-12)), x0, g, [a])
    rel = (got[2] - ref[2]).norm() / ref[2].norm()
    assert rel < 1e-8


def test_extra_rank_makes_grad_a_exact_when_x_has_rank_up_to_r_plus_k():
    torch.manual_seed(7)
    base, a, b, _ = make(torch.float64)
    x0 = torch.randn(300, R + 6, dtype=torch.float64) @ torch.randn(R + 6, D_IN, dtype=torch.float64)
    g = torch.randn(300, D_OUT, dtype=torch.float64)
    errors = grad_a_errors(base, a, b, x0, g, {k: LoRAConfig(lam=1e-12, extra_rank=k) for k in (0, 6)})
    assert errors[0] > 0.1 and errors[6] < 1e-8


def test_power_iterations_turn_the_sketch_toward_the_top_singular_directions():
    # X with a decaying spectrum over 30 directions, more than Z (R=4) and the sketch (k=6) can hold: a Gaussian
    # sketch catches a random part of it; power iterations turn it toward the strongest directions, so grad_A's
    # error falls. grad_X and grad_B stay bit-identical.
    torch.manual_seed(8)
    base, a, b, _ = make(torch.float64)
    u = torch.randn(300, 30, dtype=torch.float64) @ torch.diag(torch.logspace(1, -2, 30, dtype=torch.float64))
    x0 = u @ torch.linalg.qr(torch.randn(D_IN, 30, dtype=torch.float64))[0].t()
    g = torch.randn(300, D_OUT, dtype=torch.float64)
    errors = grad_a_errors(base, a, b, x0, g,
                           {q: LoRAConfig(lam=1e-12, extra_rank=6, power_iters=q) for q in (0, 2)})
    assert errors[2] < 0.75 * errors[0], errors  # 18% -> 12% here


@pytest.mark.parametrize("extra", [0, 3])
def test_grouped_fits_make_grad_a_exact_when_each_group_has_its_own_low_rank_space(extra):
    # Rows 0-99, 100-199 and 200-249 lie in three different R-dimensional spaces: one fit over all rows cannot
    # reconstruct them from Z, one fit per 100 rows can (the last group is short; a fourth space would not fit).
    torch.manual_seed(3)
    base, a, b, _ = make(torch.float64)
    parts = [torch.randn(n, R, dtype=torch.float64) @ torch.randn(R, D_IN, dtype=torch.float64)
             for n in (100, 100, 50)]
    x0 = torch.cat(parts)
    g = torch.randn(250, D_OUT, dtype=torch.float64)
    errors = grad_a_errors(base, a, b, x0, g, {group: LoRAConfig(lam=1e-12, fit_group_rows=group, extra_rank=extra)
                                               for group in (0, 100)})
    assert errors[0] > 0.1 and errors[100] < 1e-8


def test_one_group_of_all_rows_is_the_single_fit():
    torch.manual_seed(4)
    base, a, b, _ = make()
    x0, g = torch.randn(96, D_IN), torch.randn(96, D_OUT)
    runs = [grads(lambda x, c=c: lora_linear(x, base.weight, base.bias, a, b, scale=1.0,
                                             config=LoRAConfig(fit_group_rows=c)), x0, g, [a])[2]
            for c in (0, 96, 128)]
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(runs[2], runs[0], rtol=1e-5, atol=1e-6)  # one short group, zero-padded


def test_care_grad_a_is_the_gradient_on_the_reconstruction():
    torch.manual_seed(2)
    base, a, b, _ = make()
    x0, g = torch.randn(64, D_IN), torch.randn(64, D_OUT)
    got = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0), x0, g, [a])
    z = x0 @ a.detach().t()
    m = fit_reconstruction(z, x0, 1e-6)
    dz = g @ b.detach()
    torch.testing.assert_close(got[2], dz.t() @ (z @ m), rtol=1e-4, atol=1e-5)


def test_row_mask_leaves_padding_rows_out_of_the_fit():
    torch.manual_seed(3)
    z, h = torch.randn(40, R), torch.randn(40, D_IN)
    mask = torch.ones(40)
    mask[25:] = 0
    garbage = h.clone()
    garbage[25:] = 1e4
    torch.testing.assert_close(fit_reconstruction(z, garbage, 1e-6, rows=mask), fit_reconstruction(z[:25], h[:25], 1e-6))
    # through the layer: padded rows (whose output gradient is zero) change nothing
    base, a, b, _ = make()
    g = torch.randn(2, 20, D_OUT)
    g[1, 5:] = 0
    x_pad = torch.randn(2, 20, D_IN)
    x_other = x_pad.clone()
    x_other[1, 5:] = 50.0
    attn = torch.ones(2, 20)
    attn[1, 5:] = 0
    out = []
    for x0 in (x_pad, x_other):
        with row_mask(attn):
            out.append(grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0), x0, g, [a])[2])
    torch.testing.assert_close(out[0], out[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["bitmask", "bool", "regenerate"])
def test_dropout_fit_on_the_dropped_input_and_rng_left_as_plain(mode):
    base, a, b, _ = make()
    x0, g = torch.randn(6, 10, D_IN), torch.randn(6, 10, D_OUT)
    cfg = LoRAConfig(dropout_mask=mode)
    got = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0, p=0.3, config=cfg), x0, g, [a])
    after_compressed = torch.rand(3)
    grads(lambda x: plain_lora(x, base, a, b, None, 1.0, 0.3), x0, g, [a])
    after_plain = torch.rand(3)
    assert torch.equal(after_compressed, after_plain)  # same draws consumed; backward put the generator back
    torch.manual_seed(5)
    h = F.dropout(x0, 0.3, True).reshape(-1, D_IN)
    z = h @ a.detach().t()
    m = fit_reconstruction(z, h, 1e-6)
    dz = g.reshape(-1, D_OUT) @ b.detach()
    torch.testing.assert_close(got[2], dz.t() @ z @ m, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["lora", "fa", "care"])
def test_saved_tensors_never_keep_x(method):
    base, a, b, _ = make()
    if method == "fa":
        a.requires_grad_(False)
    x_leaf = torch.randn(8, 16, D_IN, requires_grad=True)
    x = x_leaf * 2  # an intermediate activation: alive only while something keeps it
    alive = StorageWeakRef(x.untyped_storage())
    cfg = LoRAConfig(method=method)
    owner = nn.ParameterList([base.weight, base.bias, a, b])  # parameters are not activations: left out
    inputs = [x]
    del x
    by, y = saved_bytes_by_module(owner, lambda: lora_linear(inputs.pop(), base.weight, base.bias, a, b, scale=1.0,
                                                             config=cfg))
    n = 8 * 16
    z_bytes = n * R * 4
    if method == "lora":
        assert not alive.expired()
        assert by[""] == z_bytes + n * D_IN * 4
    else:
        assert alive.expired()  # nothing saved for backward holds X: neither the branch nor the frozen base
        assert by[""] == z_bytes + (R * R * 4 + R * D_IN * 4 if method == "care" else 0)
    y.sum().backward()
    assert x_leaf.grad is not None


@pytest.mark.parametrize("mode,mask_bytes", [("bitmask", (8 * 15 * D_IN + 7) // 8), ("bool", 8 * 15 * D_IN),
                                             ("regenerate", 0)])
def test_dropout_mask_kept_as_bits_or_not_at_all(mode, mask_bytes):
    base, a, b, _ = make()
    b.requires_grad_(False)
    a.requires_grad_(False)
    x = torch.randn(8, 15, D_IN, requires_grad=True)
    owner = nn.ParameterList([base.weight, base.bias, a, b])
    cfg = LoRAConfig(method="fa", dropout_mask=mode)
    by, y = saved_bytes_by_module(owner, lambda: lora_linear(x * 1, base.weight, base.bias, a, b, scale=1.0, p=0.2,
                                                             config=cfg))
    assert by[""] == 8 * 15 * R * 4 + mask_bytes
    y.sum().backward()


def test_plain_lora_keeps_x_for_comparison():
    base, a, b, _ = make()
    x = torch.randn(8, 16, D_IN, requires_grad=True) * 2
    alive = StorageWeakRef(x.untyped_storage())
    y = plain_lora(x, base, a, b, None, 1.0, 0.0)
    del x
    assert not alive.expired()
    y.sum().backward()


def test_activation_cache_accounts_the_input_not_kept():
    base, a, b, _ = make()
    x = torch.randn(8, 16, D_IN, requires_grad=True)
    cache = CacheContext.count_only()
    with cache:
        y = lora_linear(x * 1, base.weight, base.bias, a, b, scale=1.0)
    y.sum().backward()
    stats = cache.last.by_rule["lora_care:input_not_kept"]
    assert stats.dense_bytes == 8 * 16 * D_IN * 4 and stats.stored_bytes == 0


def test_errors_for_what_the_layer_cannot_take():
    base, a, b, _ = make()
    with pytest.raises(ConfigError, match="base weight requires grad"):
        lora_linear(torch.randn(2, D_IN), base.weight.detach().requires_grad_(), None, a, b, scale=1.0)
    with pytest.raises(ConfigError, match="'fa'"):
        lora_linear(torch.randn(2, D_IN), base.weight, None, a, b, scale=1.0, config=LoRAConfig(method="fa"))
    with pytest.raises(ConfigError, match="nn.Linear"):
        LoRALinear(nn.Conv1d(2, 2, 1), rank=2)
    with pytest.raises(ConfigError, match="rank"):
        LoRALinear(nn.Linear(2, 2), rank=0)
    with pytest.raises(ConfigError, match=r"stored \[in, out\]"):  # an [out, in] weight passed as transposed
        lora_linear(torch.randn(2, D_IN), base.weight, None, a, b, scale=1.0, fan_in_fan_out=True)


def test_use_attention_mask_false_ignores_the_row_mask():
    torch.manual_seed(3)
    base, a, b, _ = make()
    x0, g = torch.randn(2, 20, D_IN), torch.randn(2, 20, D_OUT)
    attn = torch.ones(2, 20)
    attn[1, 5:] = 0
    cfg = LoRAConfig(use_attention_mask=False)
    plain = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0, config=cfg), x0, g, [a])[2]
    with row_mask(attn):
        masked_off = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0, config=cfg), x0, g,
                           [a])[2]
        masked = grads(lambda x: lora_linear(x, base.weight, base.bias, a, b, scale=1.0), x0, g, [a])[2]
    assert torch.equal(plain, masked_off) and not torch.allclose(plain, masked)


def test_the_function_takes_its_earlier_positional_arguments():
    # fan_in_fan_out is an optional last argument: callers of LoRALinearFunction.apply without it keep working
    base, a, b, _ = make()
    x0, g = torch.randn(4, D_IN), torch.randn(4, D_OUT)
    ref = grads(lambda x: plain_lora(x, base, a, b, None, 1.0, 0.0), x0, g, [a, b])
    got = grads(lambda x: LoRALinearFunction.apply(x, x, base.weight, base.bias, a, b, None, 1.0, 0.0, a.dtype,
                                                   LoRAConfig(method="lora"), None, None), x0, g, [a, b])
    assert len(ref) == 4 and all(torch.equal(r, t) for r, t in zip(ref, got, strict=True))  # y, grad_x, grad_a, grad_b
