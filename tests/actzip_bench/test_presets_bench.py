import json

import pytest

from actzip_bench.cli import main


def test_presets_bench_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "presets.json"
    rc = main(["bench", "presets", "--steps", "3", "--batch-size", "2", "--presets", "lossless,balanced",
               "--device", "cpu", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    runs = {r["preset"]: r for r in rec["runs"]}
    assert runs["lossless"]["val_loss_gap"] == 0.0
    assert runs["lossless"]["saved_bytes_per_token"] == runs["lossless"]["dense_bytes_per_token"]  # gelu: no zeros
    assert runs["balanced"]["saved_bytes_per_token"] < 0.8 * runs["lossless"]["saved_bytes_per_token"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_presets_bench_on_a_llama_model(tmp_path, monkeypatch):
    """swiglu: a HuggingFace Llama built from a local config; every float activation 4-bit under 4bit."""
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "presets.json"
    rc = main(["bench", "presets", "--activation", "swiglu", "--steps", "3", "--batch-size", "2", "--presets",
               "lossless,4bit", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    runs = {r["preset"]: r for r in json.loads(out.read_text())["runs"]}
    # float32 activations at 4 bits + 64 bits per group of 128 (7.1x smaller), but the loss head's
    # log-probabilities (256 float32 per token at this size) are kept
    assert runs["4bit"]["saved_bytes_per_token"] < runs["lossless"]["saved_bytes_per_token"] / 4.5
    assert abs(runs["4bit"]["val_loss_gap"]) < 0.05


def test_sketch_run_keeps_less_and_puts_the_plain_layers_back(tmp_path, monkeypatch):
    import torch

    from actzip_bench.presets import PresetBenchConfig, run_presets

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    cfg = PresetBenchConfig(presets=("lossless", "sketch-d8", "lossless"), steps=3, batch_size=2, corpus_bytes=200_000,
                            log_every=1)
    runs = run_presets(cfg, torch.device("cpu"))["runs"]
    assert [r["preset"] for r in runs] == ["lossless", "sketch-d8", "lossless"]
    # linear inputs kept as rank-d/8 sketches: less saved, a different (unbiased, noisy) weight gradient
    assert runs[1]["saved_bytes_per_token"] < 0.85 * runs[0]["saved_bytes_per_token"]
    assert runs[1]["train_loss"] != runs[0]["train_loss"]
    # the plain layers are back afterwards: the same run again gives the same losses
    assert runs[2]["train_loss"] == runs[0]["train_loss"]


def test_a_preset_may_replace_roles_treatments(tmp_path, monkeypatch):
    """2bit with attention and norm tensors at 2 bits too keeps less than 2bit, under its whole spec's name;
    a malformed or unknown override fails before any training."""
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "presets.json"
    spec = "2bit/attention=quant2-rn/norm=quant2-rn"
    rc = main(["bench", "presets", "--steps", "3", "--batch-size", "2", "--presets", f"none,2bit,{spec}",
               "--device", "cpu", "--json", str(out)])
    assert rc == 0
    runs = {r["preset"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs[spec]["saved_bytes_per_token"] < 0.95 * runs["2bit"]["saved_bytes_per_token"]
    from actzip.errors import ConfigError
    from actzip_bench.presets import PresetBenchConfig

    for bad, says in (("2bit/attention", "ROLE=TREATMENT"), ("2bit/attn=quant2-rn", "unknown role"),
                      ("2bit/norm=quant3-rn", "norm"), ("none/norm=quant2-rn", "no rules"),
                      ("2bit/nonlinear_input=quant2-rn", "at least 4 bits"), ("none+derivatives", "has none")):
        with pytest.raises(ConfigError, match=says):
            PresetBenchConfig(presets=("none", bad), steps=3)


def test_derivatives_after_a_preset_keep_less_and_put_the_activations_back(tmp_path, monkeypatch):
    """2bit+derivatives: the GELUs keep their derivative as a 2-bit linear input instead of a 4-bit nonlinear one;
    the model's activations are back afterwards (the same run again gives the same losses)."""
    import torch

    from actzip_bench.presets import PresetBenchConfig, run_presets

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    cfg = PresetBenchConfig(presets=("lossless", "2bit", "2bit+derivatives", "2bit"), steps=3, batch_size=2,
                            corpus_bytes=200_000, log_every=1)
    runs = run_presets(cfg, torch.device("cpu"))["runs"]
    assert [r["preset"] for r in runs] == ["lossless", "2bit", "2bit+derivatives", "2bit"]
    assert runs[2]["saved_bytes_per_token"] < 0.97 * runs[1]["saved_bytes_per_token"]
    assert runs[2]["dense_bytes_per_token"] == runs[1]["dense_bytes_per_token"]  # f'(x) is as large as x
    assert runs[3]["train_loss"] == runs[1]["train_loss"] and runs[3]["saved_bytes_per_token"] == \
        runs[1]["saved_bytes_per_token"]


def test_the_seed_changes_weights_and_batches_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    losses = {}
    for seed in (0, 0, 1):
        out = tmp_path / f"presets-{seed}.json"
        assert main(["bench", "presets", "--steps", "2", "--batch-size", "2", "--presets", "lossless",
                     "--seed", str(seed), "--device", "cpu", "--json", str(out)]) == 0
        rec = json.loads(out.read_text())
        assert rec["config"]["seed"] == seed
        losses.setdefault(seed, []).append(rec["runs"][0]["train_loss"])
    assert losses[0][0] == losses[0][1] and losses[1][0] != losses[0][0]


def test_bfloat16_forwards_keep_bfloat16_activations_and_the_sequence_length_is_an_option(tmp_path, monkeypatch):
    """dtype bfloat16: forwards under autocast (other losses, fewer bytes kept: the linear layers' saved inputs in
    bfloat16); block_size shortens the windows."""
    import pytest
    import torch

    from actzip.errors import ConfigError
    from actzip_bench.presets import PresetBenchConfig, run_presets

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    base = dict(presets=("lossless", "4bit"), steps=2, batch_size=2, corpus_bytes=200_000, block_size=32)
    f32 = run_presets(PresetBenchConfig(**base), torch.device("cpu"))
    b16 = run_presets(PresetBenchConfig(**base, dtype="bfloat16"), torch.device("cpu"))
    assert f32["tokens_per_step"] == b16["tokens_per_step"] == 2 * 32
    assert b16["config"]["dtype"] == "bfloat16"
    ratio = b16["runs"][0]["dense_bytes_per_token"] / f32["runs"][0]["dense_bytes_per_token"]
    assert ratio < 0.99  # at this size the loss head's float32 log-probabilities weigh most, and they stay
    assert b16["runs"][0]["train_loss"] != f32["runs"][0]["train_loss"]
    assert b16["runs"][1]["saved_bytes_per_token"] < 0.75 * b16["runs"][0]["saved_bytes_per_token"]
    with pytest.raises(ConfigError, match="dtype"):
        PresetBenchConfig(dtype="float16")
    with pytest.raises(ConfigError, match="block_size"):
        PresetBenchConfig(block_size=0)


def test_none_trains_without_a_cache_and_graphs_take_only_what_a_graph_can_replay(tmp_path, monkeypatch):
    import pytest
    import torch

    from actzip.errors import ConfigError
    from actzip_bench.presets import PresetBenchConfig, run_presets

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    rec = run_presets(PresetBenchConfig(presets=("none", "4bit"), steps=7, batch_size=2, corpus_bytes=200_000,
                                        log_every=1), torch.device("cpu"))
    none, four = rec["runs"]
    assert rec["reference"] == "none" and none["train_loss_gap"] == 0.0
    assert none["saved_bytes_per_token"] == none["dense_bytes_per_token"]  # counted, nothing compressed
    assert four["saved_bytes_per_token"] < 0.75 * none["saved_bytes_per_token"]
    assert none["step_time_s"] > 0 and len(none["train_loss"]) == 7  # 7 steps: the last two timed
    with pytest.raises(ConfigError, match="graph_safe=True, but rule 'sparse'"):  # the cache's own refusal
        PresetBenchConfig(presets=("lossless", "4bit"), graphs=True)
    with pytest.raises(ConfigError, match="cannot replay sketch-d8"):
        PresetBenchConfig(presets=("none", "sketch-d8"), graphs=True)
    with pytest.raises(ConfigError, match="more than 3 steps"):
        PresetBenchConfig(presets=("none",), steps=3, graphs=True)
    with pytest.raises(ConfigError, match="graphs captures CUDA graphs"):  # a CPU device, whatever the machine has
        run_presets(PresetBenchConfig(presets=("none",), steps=5, graphs=True), torch.device("cpu"))


@pytest.mark.cuda
def test_graphed_presets_train_like_eager_ones():
    """The same weights and batches, eager and graphed: none's losses match to float noise (the same kernels),
    4bit's stay close (its noise differs), and the graphed run's curves fall."""
    import torch

    from actzip_bench.presets import PresetBenchConfig, run_presets

    base = dict(presets=("none", "4bit"), steps=60, batch_size=4, corpus_bytes=300_000, log_every=1)
    eager = run_presets(PresetBenchConfig(**base), torch.device("cuda"))
    graphed = run_presets(PresetBenchConfig(**base, graphs=True), torch.device("cuda"))
    for a, b in zip(eager["runs"], graphed["runs"]):
        assert abs(a["final_train_loss"] - b["final_train_loss"]) < 0.05 * a["final_train_loss"]
        assert b["train_loss"][-1] < b["train_loss"][0]
