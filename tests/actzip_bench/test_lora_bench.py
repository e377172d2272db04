"""The LoRA fine-tuning benchmark end to end on a micro configuration, its CLI and its report section."""

import json

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")

import torch

from actzip_bench.lora import LoRABenchConfig, grad_a_error, run_lora
from actzip_bench.report import build
from actzip_bench.cli import main
from actzip.errors import ConfigError
from actzip_bench.data.tasks import SnippetTaskConfig


def micro(**kw):
    return LoRABenchConfig(name="micro", hidden=32, layers=1, heads=2, kv_heads=1, ffn=64, pretrain_steps=3,
                           pretrain_batch=4, pretrain_seq=32, corpus_bytes=200_000, rank=4, steps=4, warmup=1,
                           batch_size=4, eval_batch=32,
                           task=SnippetTaskConfig(min_len=16, max_len=32, train_size=32, test_size=16), **kw)


def test_run_lora_records_every_method(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    rec = run_lora(micro(), torch.device("cpu"))
    runs = {r["method"]: r for r in rec["runs"]}
    assert list(runs) == ["lora", "lora+checkpoint", "fa", "care"]
    assert all(r["rounds"] == 3 and 0 <= r["test_accuracy"] <= 1 for r in runs.values())
    assert runs["lora+checkpoint"]["saved_bytes"] is None and runs["lora"]["saved_vs_lora"] == 1.0
    assert runs["care"]["saved_vs_lora"] < 0.8 and runs["fa"]["saved_vs_lora"] < 0.8  # X no longer kept
    lora_layers = runs["lora"]["saved_bytes"]["block0_lora_layers"]
    care_layers = runs["care"]["saved_bytes"]["block0_lora_layers"]
    assert set(lora_layers) == set(care_layers) and all(care_layers[k] < lora_layers[k] for k in lora_layers)
    # checkpointing changes no number: same weights, batches and dropout masks
    assert runs["lora+checkpoint"]["train_loss"] == runs["lora"]["train_loss"]
    err = runs["care"]["grad_a_rel_error"]
    assert err["grad_b_bit_identical"] and err["grad_b_compared"] == 7
    assert 0 < err["median"] < 2 and len(err["by_layer"]) == 7
    assert runs["fa"]["trainable_params"] < runs["care"]["trainable_params"] == runs["lora"]["trainable_params"]
    assert runs["care"]["layers_compressed"] == 7 and runs["care"]["layers_plain"] == []
    assert rec["targets"]["peak_at_most_0.7x_lora"] is None  # no peak on the CPU
    assert rec["machine"]["torch"] == torch.__version__


def care_llama():
    """A 1-block Llama from a local config with CARE on its 7 peft LoRA layers, and a batch for it."""
    import peft
    import transformers

    from actzip.api import compress_
    from actzip.memory.lora import LoRAConfig

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    pm = peft.get_peft_model(transformers.LlamaForCausalLM(cfg),
                             peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"))
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)  # peft's zero B would make every lora_A gradient zero
    compress_(pm, LoRAConfig(method="care", lam=1e-6))
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    return pm, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def test_grad_a_error_counts_the_lora_b_gradients_it_compares():
    pm, batch = care_llama()
    err = grad_a_error(pm, batch, seed=5)
    assert err["grad_b_bit_identical"] and err["grad_b_compared"] == 7 and len(err["by_layer"]) == 7
    for n, p in pm.named_parameters():  # no lora_B gradient at all: nothing compared, so not "bit-identical"
        if "lora_B" in n:
            p.requires_grad_(False)
    err = grad_a_error(pm, batch, seed=5)
    assert err["grad_b_compared"] == 0 and err["grad_b_bit_identical"] is False
    for n, p in pm.named_parameters():  # no lora_A gradient: no error to measure, said so
        if "lora_" in n:
            p.requires_grad_("lora_B" in n)
    with pytest.raises(ConfigError, match="no non-zero lora_A gradient"):
        grad_a_error(pm, batch, seed=5)


def test_seeds_add_untimed_accuracies(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    rec = run_lora(micro(methods=("lora", "lora+checkpoint", "care"), seeds=3), torch.device("cpu"))
    runs = {r["method"]: r for r in rec["runs"]}
    for r in runs.values():
        accs = r["test_accuracy_seeds"]
        assert len(accs) == 3 and accs[0] == r["test_accuracy"] and r["test_accuracy_std"] >= 0
        assert r["test_accuracy_mean"] == pytest.approx(sum(accs) / 3)
    # the extra runs repeat the timed run's recipe: checkpointing changes no number, whatever the seed
    assert runs["lora+checkpoint"]["test_accuracy_seeds"] == runs["lora"]["test_accuracy_seeds"]
    assert runs["care"]["mean_accuracy_vs_lora_points"] == pytest.approx(
        100 * (runs["care"]["test_accuracy_mean"] - runs["lora"]["test_accuracy_mean"]))


def test_cli_and_report(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "results" / "cpu" / "lora-test.json"
    rc = main(["bench", "lora", "--config", "quick", "--methods", "lora,care", "--steps", "4", "--pretrain-steps", "2",
               "--batch-size", "2", "--rank", "2", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["command"].startswith("actzip bench lora --config quick") and rec["config"]["rank"] == 2
    assert [r["method"] for r in rec["runs"]] == ["lora", "care"]
    (tmp_path / "docs").mkdir()
    text = build(tmp_path)
    assert "## LoRA fine-tuning with compressed activations (quick)" in text and "| care |" in text


def test_config_errors():
    with pytest.raises(ConfigError, match="qlora"):
        LoRABenchConfig(methods=("lora", "qlora"))
    with pytest.raises(ConfigError, match="'lora'"):
        LoRABenchConfig(methods=("care",))
    with pytest.raises(ConfigError, match="unknown"):
        LoRABenchConfig.named("a100")
    with pytest.raises(ConfigError, match="seeds"):
        LoRABenchConfig(seeds=0)
    with pytest.raises(ConfigError, match="lr_schedule"):
        LoRABenchConfig(lr_schedule="linear")
    assert LoRABenchConfig.named("h200").dtype == "bfloat16"


def test_lr_schedule_warms_up_and_decays_to_a_tenth():
    from actzip_bench.lora import lr_schedule

    def rates(schedule):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = lr_schedule(LoRABenchConfig(steps=100, lr_schedule=schedule), opt)
        out = []
        for _ in range(100):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    cos = rates("cosine")
    assert cos[0] == pytest.approx(0.2) and cos[4] == pytest.approx(1.0, abs=0.01)  # 5 warm-up steps
    assert all(a >= b for a, b in zip(cos[4:], cos[5:])) and cos[-1] == pytest.approx(0.1, abs=0.01)
    assert rates("constant") == [1.0] * 100
