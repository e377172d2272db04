"""compress_(peft_model, LoRAConfig(...)) on peft LoRA models: exact where promised, peft's features intact,
bad layers reported, restore_ giving plain peft back."""

import copy
import warnings

import pytest
import torch
from torch import nn

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

import actzip
from actzip.api import compress_, restore_
from actzip.errors import ConfigError, NothingToCompressError
from actzip.memory.lora import LoRAConfig, saved_bytes_by_module
from actzip.memory.lora.peft import CompressedLoraLinear

import lora_checks

TARGETS = 14  # all-linear: q, k, v, o, gate, up and down in each of the 2 blocks


def named(grads, part):
    return lora_checks.named(grads, part, TARGETS)


def compressed_layers(pm):
    return lora_checks.compressed_layers(pm, TARGETS)


def tiny_llama(dtype=torch.float32, dropout=0.1, adapter_fp32=True, targets="all-linear"):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).to(dtype)
    torch.manual_seed(1)
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=targets)
    pm = peft.get_peft_model(model, lcfg, autocast_adapter_dtype=adapter_fp32)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            nn.init.normal_(p, std=0.05)
    return pm


def batch(pad_id=0):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 64, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, 7:] = 0
    ids[1, 7:] = pad_id
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def step(model, b, seed=7):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(**b)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype,adapter_fp32", [(torch.float32, True), (torch.bfloat16, True), (torch.bfloat16, False)])
@pytest.mark.parametrize("method", ["care", "fa"])
def test_loss_and_every_grad_b_bit_identical_to_peft(dtype, adapter_fp32, method):
    pm = tiny_llama(dtype, adapter_fp32=adapter_fp32)
    loss0, g0 = step(pm, batch())
    report = compress_(pm, LoRAConfig(method=method))
    assert len(report.swapped) == TARGETS and not report.skipped
    loss1, g1 = step(pm, batch())
    assert torch.equal(loss0, loss1)
    for n in named(g0, "lora_B"):
        assert torch.equal(g0[n], g1[n]), n
    if method == "care":
        for n in named(g1, "lora_A"):
            assert torch.isfinite(g1[n]).all() and g1[n].norm() > 0, n
    else:
        assert "froze 14 lora_A" in str(report) and named(g0, "lora_A") and not any("lora_A" in n for n in g1)
    assert all(m.actzip_stats.get("calls") == 1 for m in compressed_layers(pm))


def test_exact_method_matches_peft_everywhere():
    pm = tiny_llama()
    _, g0 = step(pm, batch())
    compress_(pm, LoRAConfig(method="lora"))
    _, g1 = step(pm, batch())
    assert set(g0) == set(g1) and named(g0, "lora_A") and named(g0, "lora_B")
    assert all(torch.equal(g0[n], g1[n]) for n in g0)  # grad_A included


def test_saved_bytes_per_layer_plain_vs_care():
    b = batch()
    n = b["input_ids"].numel()
    by = {}
    for method in ("plain", "care"):
        pm = tiny_llama(dropout=0.1)
        if method == "care":
            compress_(pm, LoRAConfig(method="care"))
        layers = {k: m for k, m in pm.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
        torch.manual_seed(0)
        by[method], out = saved_bytes_by_module(pm, lambda pm=pm: pm(**b).loss, layers)
        out.backward()
        by[method]["in"] = {k: m.in_features for k, m in layers.items()}
    assert len(by["plain"]["in"]) == TARGETS
    for name, d_in in by["plain"]["in"].items():
        # peft keeps the float32 dropout output (and the dropout mask, one byte per element; q/k/v and gate/up share
        # their input, but each layer casts and drops it on its own)
        assert by["plain"][name] >= n * d_in * 4
        # CARE: Z (float32, r=4), ZᵀZ, ZᵀX and the dropout mask packed 8 per byte; nothing of X
        assert by["care"][name] == n * 4 * 4 + 4 * 4 * 4 + 4 * d_in * 4 + (n * d_in + 7) // 8, name


def test_autocast_bit_identical_to_peft_under_autocast():
    pm = tiny_llama(dropout=0.1)  # float32 weights, bfloat16 autocast: what mixed-precision trainers run
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss0, g0 = step(pm, batch())
        compress_(pm, LoRAConfig(method="care"))
        loss1, g1 = step(pm, batch())
    assert torch.equal(loss0, loss1)
    assert all(torch.equal(g0[n], g1[n]) for n in named(g0, "lora_B"))
    assert all(g1[n].dtype == torch.float32 for n in g1)


@pytest.mark.parametrize("method", ["care", "fa"])
def test_restore_gives_back_plain_peft(method):
    pm = tiny_llama()
    b = batch()
    state = {k: v.clone() for k, v in pm.state_dict().items()}
    trainable = {n for n, p in pm.named_parameters() if p.requires_grad}
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in pm.modules()]
    pm.eval()
    with torch.no_grad():
        logits0 = pm(**b).logits
    pm.train()
    loss0, g0 = step(pm, b)
    actzip.compress_(pm, actzip.LoRAConfig(method=method))
    compress_(pm, LoRAConfig(method="care", use_attention_mask=False))  # a second config stacks; restore_ undoes both
    step(pm, b)
    assert actzip.restore_(pm) == ["LoRAConfig", "LoRAConfig"]
    assert not any(isinstance(m, CompressedLoraLinear) or "actzip_config" in m.__dict__ for m in pm.modules())
    assert type(pm.base_model.model.model.layers[0].self_attn.q_proj) is peft.tuners.lora.layer.Linear
    assert {n for n, p in pm.named_parameters() if p.requires_grad} == trainable  # "fa"'s frozen lora_A are back
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in pm.modules()] == hooks
    after = pm.state_dict()
    assert set(after) == set(state) and all(torch.equal(after[k], v) for k, v in state.items())
    pm.eval()
    with torch.no_grad():
        assert torch.equal(pm(**b).logits, logits0)
    pm.train()
    loss1, g1 = step(pm, b)
    assert torch.equal(loss0, loss1) and set(g0) == set(g1) and named(g0, "lora_A") and named(g0, "lora_B")
    assert all(torch.equal(g0[n], g1[n]) for n in g0)


def test_padding_rows_left_out_through_the_attention_mask():
    grads = {}
    for use_mask in (True, False):
        for pad_id in (0, 9):  # what sits in the padding must not matter when the mask is used
            pm = tiny_llama(dropout=0.0)
            compress_(pm, LoRAConfig(method="care", use_attention_mask=use_mask))
            grads[use_mask, pad_id] = step(pm, batch(pad_id))[1]
    name = next(n for n in grads[True, 0] if "layers.1.mlp.down_proj.lora_A" in n)
    torch.testing.assert_close(grads[True, 0][name], grads[True, 9][name], rtol=1e-5, atol=1e-7)
    assert not torch.allclose(grads[False, 0][name], grads[False, 9][name], rtol=1e-5, atol=1e-7)


def test_peft_features_keep_working(tmp_path):
    pm = tiny_llama(dropout=0.0)
    keys = set(pm.state_dict())
    compress_(pm, LoRAConfig(method="care"))
    assert set(pm.state_dict()) == keys
    b = batch()
    pm.eval()
    with torch.no_grad():
        ref = pm(**b).logits
        with pm.disable_adapter():
            base_only = pm(**b).logits
    assert not torch.allclose(ref, base_only)
    layer = next(m for m in pm.modules() if isinstance(m, CompressedLoraLinear))
    assert "plain_calls" not in layer.actzip_stats  # no-grad calls are peft's own forward, not counted
    pm.train()
    pm.add_adapter("second", peft.LoraConfig(r=2, target_modules="all-linear"))
    pm.base_model.set_adapter(["default", "second"])
    pm(**b).loss.backward()
    assert layer.actzip_stats["plain_calls"] == 1  # two active adapters: peft's own forward, counted
    pm.base_model.set_adapter("default")
    pm.delete_adapter("second")
    pm.save_pretrained(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").exists()
    clone = copy.deepcopy(pm)
    assert isinstance(next(m for m in clone.modules() if isinstance(m, peft.tuners.lora.LoraLayer)), CompressedLoraLinear)
    merged = pm.merge_and_unload()
    merged.eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(**b).logits, ref, rtol=1e-4, atol=1e-4)


def test_layers_it_cannot_take_stay_plain_with_a_report():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 8)
            self.conv = nn.Conv1d(8, 8, 1)
            self.lin = nn.Linear(8, 8)

        def forward(self, ids):
            h = self.emb(ids)
            return self.lin(self.conv(h.transpose(1, 2)).transpose(1, 2))

    pm = peft.get_peft_model(Mixed(), peft.LoraConfig(r=2, target_modules=["emb", "conv", "lin"]))
    report = compress_(pm, LoRAConfig(method="care"))
    assert [n for n, _ in report.swapped] == ["base_model.model.lin"]
    reasons = dict(report.skipped)
    assert set(reasons) == {"base_model.model.emb", "base_model.model.conv"}
    assert reasons["base_model.model.emb"].startswith("plain LoRA: ") and "Embedding" in reasons["base_model.model.emb"]
    assert "Conv1d" in reasons["base_model.model.conv"]
    assert any("base_model.model.emb" in line and "plain LoRA: " in line for line in str(report).splitlines())
    pm(torch.randint(0, 10, (2, 5))).sum().backward()  # the plain layers still train
    assert pm.base_model.model.emb.lora_embedding_A["default"].grad is not None


def test_dora_and_trainable_base_weights_stay_plain():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = tiny_llama(targets=["q_proj"])
        pm.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.requires_grad_(True)
        report = compress_(pm, LoRAConfig(method="care"))
    assert dict(report.skipped) == {"base_model.model.model.layers.0.self_attn.q_proj":
                                    "plain LoRA: base weight requires grad (its gradient needs X)"}
    dora = peft.get_peft_model(nn.Sequential(nn.Linear(8, 8)), peft.LoraConfig(r=2, target_modules=["0"], use_dora=True))
    with pytest.raises(NothingToCompressError, match="variant"):  # nothing it can take: nothing changes
        compress_(dora, LoRAConfig(method="care"))
    assert type(dora.base_model.model[0]) is peft.tuners.lora.layer.Linear


def test_no_lora_layers_is_an_error():
    with pytest.raises(ConfigError, match="no peft LoRA layers"):
        compress_(nn.Sequential(nn.Linear(2, 2)), LoRAConfig())
    with pytest.raises(ConfigError, match="qlora"):
        LoRAConfig(method="qlora")


def test_filter_fn_limits_the_layers_and_is_reported():
    pm = tiny_llama()
    report = compress_(pm, LoRAConfig(method="care"), filter_fn=lambda module, fqn: "layers.1." in fqn)
    assert len(report.swapped) == 7 and all("layers.1." in n for n, _ in report.swapped)
    assert len(report.skipped) == 7 and all(why == "excluded by filter_fn" for _, why in report.skipped)
    assert type(pm.base_model.model.model.layers[0].mlp.up_proj) is peft.tuners.lora.layer.Linear
    with pytest.raises(NothingToCompressError, match="filter_fn"):
        compress_(tiny_llama(), LoRAConfig(), filter_fn=lambda module, fqn: False)
