import pytest
import torch

from actzip.errors import ConfigError
from actzip_bench.gpt_memory import GPTBenchConfig, run_gpt
from actzip_bench.hybrid_memory import HYBRID_STRATEGIES, build_hybrid, mamba_path

pytest.importorskip("transformers")


def test_tiny_hybrid_run_has_every_strategy_exact_gradients_and_a_breakdown():
    assert GPTBenchConfig(model="nemotron-h").strategies == HYBRID_STRATEGIES
    cfg = GPTBenchConfig(model="nemotron-h", preset="nemotron-h-tiny", seq_lens=(32,), tokens_per_step=64,
                         dtype="float32", rounds=1, warmup=0, strategies=("none", "checkpoint", "compress"))
    rec = run_gpt(cfg, torch.device("cpu"))
    assert {r["strategy"] for r in rec["runs"]} == {"none", "checkpoint", "compress"}
    assert all(r["max_grad_abs_diff"] == 0 for r in rec["runs"])
    assert rec["model"]["pattern"] == "M-*-" and rec["model"]["mamba_path"] == mamba_path()
    by = {b["strategy"]: b["saved_bytes_per_token"] for b in rec["saved_by_kind"]}
    # the MLPs keep only their payload, and the norm outputs feeding Mamba and attention are rebuilt
    assert by["compress"]["mlp"] < by["none"]["mlp"] / 2
    assert by["compress"]["mamba"] < by["none"]["mamba"]
    assert by["compress"]["attention"] < by["none"]["attention"]


def test_the_pattern_builds_that_many_layers_of_each_kind():
    model = build_hybrid("nemotron-h-tiny", 32)
    kinds = [type(layer.mixer).__name__ for layer in model.model.layers]
    assert kinds == ["NemotronHMamba2Mixer", "NemotronHMLP", "NemotronHAttention", "NemotronHMLP"]


def test_bad_hybrid_config():
    with pytest.raises(ConfigError, match="unknown strategies"):
        GPTBenchConfig(model="nemotron-h", strategies=("none", "fused-arena"))
    with pytest.raises(ConfigError, match="preset"):
        GPTBenchConfig(model="nemotron-h", preset="gpt2-124m")
    with pytest.raises(ConfigError, match="unknown model"):
        GPTBenchConfig(model="mamba")


def test_the_breakdown_frees_its_forward_graph():
    """A forward whose graph outlived it would keep an arena's payloads open: every later one refused."""
    import gc
    import weakref

    from actzip_bench.hybrid_memory import saved_by_kind

    torch.manual_seed(0)
    model = build_hybrid("nemotron-h-tiny", 16)
    outputs = []
    model.model.layers[1].register_forward_hook(lambda m, a, o: outputs.append(weakref.ref(o)))
    x = torch.randint(0, 256, (1, 16))
    by = saved_by_kind(model, x, x, 8, "M-*-")
    gc.collect()
    assert by["mlp"] > 0 and outputs and outputs[0]() is None
