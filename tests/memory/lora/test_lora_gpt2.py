"""GPT-2's Conv1D bases (weight stored [in, out], peft's fan_in_fan_out): compressed like nn.Linear ones."""

import pytest
import torch
from torch import nn

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from actzip.api import compress_, restore_
from actzip.memory.lora import LoRAConfig, saved_bytes_by_module
from actzip.memory.lora.peft import CompressedLoraLinear

import lora_checks

N_LAYERS = 2
TARGETS = 3 * N_LAYERS  # attn.c_attn, attn.c_proj and mlp.c_proj in every block


def tiny_gpt2(dropout=0.1):
    """A 2-block GPT-2 built from a local config (nothing downloaded), LoRA on every c_attn and c_proj."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=N_LAYERS, n_head=4)
    model = transformers.GPT2LMHeadModel(cfg)
    torch.manual_seed(1)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["c_attn", "c_proj"],
                           fan_in_fan_out=True)
    pm = peft.get_peft_model(model, lcfg)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            nn.init.normal_(p, std=0.05)
    return pm


def batch():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def step(model, b, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # GPT-2's own dropouts and LoRA's draw the same numbers in both runs
    out = model(**b)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def lora_layers(pm):
    return {n: m for n, m in pm.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}


def named(grads, part):
    return lora_checks.named(grads, part, TARGETS)


def compressed_layers(pm):
    return lora_checks.compressed_layers(pm, TARGETS)


def test_the_bases_are_transposed_conv1d():
    layers = lora_layers(tiny_gpt2())
    assert len(layers) == TARGETS
    for m in layers.values():
        assert type(m.get_base_layer()) is transformers.pytorch_utils.Conv1D and m.fan_in_fan_out


def test_exact_method_bit_identical_to_peft_lora_a_and_b_included():
    pm = tiny_gpt2()
    loss0, g0 = step(pm, batch())
    report = compress_(pm, LoRAConfig(method="lora"))
    assert len(report.swapped) == TARGETS and not report.skipped
    assert all("Conv1D base" in what for _, what in report.swapped)
    loss1, g1 = step(pm, batch())
    assert torch.equal(loss0, loss1) and set(g0) == set(g1) and named(g0, "lora_A") and named(g0, "lora_B")
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    assert all(m.actzip_stats.get("calls") == 1 for m in compressed_layers(pm))


@pytest.mark.parametrize("method", ["care", "fa"])
def test_care_and_fa_keep_every_grad_b_exact(method):
    pm = tiny_gpt2()
    loss0, g0 = step(pm, batch())
    report = compress_(pm, LoRAConfig(method=method))
    assert len(report.swapped) == TARGETS
    loss1, g1 = step(pm, batch())
    assert torch.equal(loss0, loss1)
    for n in named(g0, "lora_B"):
        assert torch.equal(g0[n], g1[n]), n
    if method == "care":
        for n in named(g1, "lora_A"):
            assert torch.isfinite(g1[n]).all() and g1[n].norm() > 0, n
    else:
        assert named(g0, "lora_A") and not any("lora_A" in n for n in g1)
    assert all(m.actzip_stats.get("calls") == 1 for m in compressed_layers(pm))


@pytest.mark.parametrize("method", ["care", "fa"])
def test_what_care_and_fa_keep_instead_of_x(method):
    b = batch()
    n, r = b["input_ids"].numel(), 4
    pm = tiny_gpt2(dropout=0.1)
    compress_(pm, LoRAConfig(method=method))
    layers = lora_layers(pm)
    torch.manual_seed(0)
    by, out = saved_bytes_by_module(pm, lambda: pm(**b).loss, layers)
    out.backward()
    assert len(layers) == TARGETS
    for name, m in layers.items():
        d_in = m.in_features
        fit = r * r * 4 + r * d_in * 4 if method == "care" else 0  # ZᵀZ and ZᵀX, float32
        # Z (float32), the fit's moments and the dropout mask packed 8 per byte: nothing of X
        assert by[name] == n * r * 4 + fit + (n * d_in + 7) // 8, name


def test_care_fit_leaves_padding_out_and_restore_gives_plain_peft_back():
    pm = tiny_gpt2()
    b = batch()
    state = {k: v.clone() for k, v in pm.state_dict().items()}
    _, g0 = step(pm, b)
    compress_(pm, LoRAConfig(method="care"))
    step(pm, b)
    mismatches = [m.actzip_stats.get("mask_mismatch", 0) for m in pm.modules() if isinstance(m, CompressedLoraLinear)]
    assert mismatches == [0] * TARGETS  # every layer saw the [batch, seq] rows of the attention mask
    restore_(pm)
    assert not any(isinstance(m, CompressedLoraLinear) for m in pm.modules())
    assert all(torch.equal(pm.state_dict()[k], v) for k, v in state.items())
    _, g1 = step(pm, b)
    assert set(g0) == set(g1) and named(g0, "lora_A") and named(g0, "lora_B")
    assert all(torch.equal(g0[n], g1[n]) for n in g0)
