import dataclasses
import json

import pytest
import torch

from actzip_bench.wire import QUICK, WireBenchConfig, codec_specs, entry_lr, parse_entry, pipeline_config
from actzip_bench.cli import main
from actzip.errors import ConfigError

SCHEMA = {"compressor": str, "ratio": float, "bytes_per_token_fwd": float, "bytes_per_token_bwd": float,
          "tokens": int, "final_loss": float, "step_time_s": float}


def test_wire_bench_cli_writes_the_schema_and_a_plot(tmp_path, monkeypatch):
    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    out = tmp_path / "wire.json"
    rc = main(["bench", "wire", "--model", "tiny", "--n-layer", "2", "--steps", "4", "--batch-size", "4",
               "--block-size", "32", "--microbatches", "2", "--compressors", "dense,bf16,quant:8,delta:16",
               "--dataset-windows", "8", "--bandwidths", "80,200", "--target-steps", "1.5", "--device", "cpu",
               "--corpus-bytes", "200000",
               "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert {r["bandwidth_mbps"] for r in rec["runs"]} == {80.0, 200.0, None}
    assert len(rec["runs"]) == 12
    for r in rec["runs"]:
        for key, typ in SCHEMA.items():
            assert isinstance(r[key], typ), (key, r[key])
        assert r["time_to_target_s"] is None or isinstance(r["time_to_target_s"], float)
    dense = {r["bandwidth_mbps"]: r for r in rec["runs"] if r["compressor"] == "dense"}
    quant = {r["bandwidth_mbps"]: r for r in rec["runs"] if r["compressor"] == "quant"}
    assert dense[200.0]["time_to_target_s"] is not None  # dense reaches its own final loss
    assert dense[200.0]["tokens"] == 4 * 4 * 32
    assert dense[200.0]["bytes_per_token_fwd"] > 256  # 64 float32 values per token, plus headers
    assert quant[200.0]["bytes_per_token_fwd"] < dense[200.0]["bytes_per_token_fwd"] / 6
    bf16 = next(r for r in rec["runs"] if r["compressor"] == "bf16" and r["bandwidth_mbps"] == 200.0)
    assert bf16["bytes_per_token_fwd"] == pytest.approx(dense[200.0]["bytes_per_token_fwd"] / 2, rel=0.02)
    assert dense[80.0]["step_time_s"] > dense[200.0]["step_time_s"] > dense[None]["step_time_s"]
    assert rec["command"].startswith("actzip bench wire") and rec["machine"]["cores"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_entries_and_codecs():
    assert parse_entry("dense") == ("dense", 1.0) and parse_entry("stiefel:16") == ("stiefel", 16.0)
    assert codec_specs("quant", 8) == ("quant:bits=4", "quant:bits=4")
    assert codec_specs("delta", 16) == ("delta:bits=2", "quant:bits=2")
    assert codec_specs("mask", 8, "none") == ("mask:keep=0.125", "none")
    assert codec_specs("subspace", 100) == ("none", "none")
    assert parse_entry("bf16") == ("bf16", 2.0) == parse_entry("bf16:2@1e-4")
    assert codec_specs("bf16", 2) == ("cast:dtype=bfloat16", "cast:dtype=bfloat16")
    for bad in ("zip:4", "quant:3", "quant:x", "mask:0.5", "bf16:4"):
        with pytest.raises(ConfigError):
            parse_entry(bad)
    with pytest.raises(ConfigError, match="stages=2"):
        WireBenchConfig(mode="netns", stages=3)
    with pytest.raises(ConfigError, match="matmul_precision"):
        WireBenchConfig(matmul_precision="tf32")
    assert WireBenchConfig(dataset_windows=0).dataset_windows is None  # 0 on the command line: fresh windows
    with pytest.raises(ConfigError, match="repeats"):
        WireBenchConfig(compressors=("dense", "dense"))


def test_a_byte_codec_may_compress_the_stage_compressors_codes():
    assert codec_specs("stiefel", 4, stage="quant:bits=8") == ("quant:bits=8", "quant:bits=8")
    assert codec_specs("subspace", 25, "none", "quant:bits=8") == ("quant:bits=8", "none")
    assert codec_specs("dense", 1, stage="quant:bits=8") == ("none", "none")  # the baseline stays raw
    assert codec_specs("stiefel-rvq", 100, "quant:bits=8") == ("none", "quant:bits=8")  # its gradient in 8 bits
    assert codec_specs("dense", 1, "quant:bits=8") == ("none", "none")
    assert codec_specs("quant", 8, stage="quant:bits=2") == ("quant:bits=4", "quant:bits=4")  # its own codec
    cfg = WireBenchConfig(model="tiny", compressors=("dense", "stiefel:4"), stage_codec="quant:bits=8")
    assert pipeline_config(cfg, "stiefel:4").fwd_codec == "quant:bits=8"
    with pytest.raises(ConfigError, match="stage_codec: unknown codec 'zip'"):
        WireBenchConfig(stage_codec="zip:bits=8")
    with pytest.raises(ConfigError, match="bwd_codec: codec 'quant' has no option"):
        WireBenchConfig(bwd_codec="quant:bitz=8")


def test_an_entry_may_carry_its_own_learning_rate():
    assert parse_entry("subspace:100@2e-3") == ("subspace", 100.0) and parse_entry("dense@3e-4") == ("dense", 1.0)
    assert entry_lr("subspace:100@2e-3", 1e-3) == 2e-3 and entry_lr("subspace:100", 1e-3) == 1e-3
    cfg = WireBenchConfig(compressors=("dense@3e-4", "dense", "stiefel:16@6e-4"), lr=1e-3)
    assert [pipeline_config(cfg, e).lr for e in cfg.compressors] == [3e-4, 1e-3, 6e-4]
    for bad in ("dense@", "dense@x", "dense@0", "dense@nan", "stiefel:16@2"):
        with pytest.raises(ConfigError, match="learning rate"):
            parse_entry(bad)


def test_each_stage_may_train_at_its_own_factor_of_the_entry_rate(capsys):
    cfg = WireBenchConfig(compressors=("dense", "stiefel:16@6e-4"), lr=1e-3, stage_lr_scale=[0.5, 2])
    assert cfg.stage_lr_scale == (0.5, 2.0)
    assert [pipeline_config(cfg, e).stage_lr(1, 2) for e in cfg.compressors] == [2e-3, pytest.approx(1.2e-3)]
    with pytest.raises(ConfigError, match="3 factors for 2 stages"):
        WireBenchConfig(stage_lr_scale=(1, 1, 1))
    assert main(["bench", "wire", "--stage-lr-scale", "x,1"]) != 0
    assert "--stage-lr-scale takes comma-separated float values" in capsys.readouterr().err


def test_a_learning_rate_sweep_measures_every_entry_against_the_best_dense_run(tmp_path, monkeypatch):
    from actzip_bench.wire import run_wire

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    cfg = WireBenchConfig(model="tiny", n_layer=2, n_embd=32, n_head=2, block_size=16, batch_size=4, microbatches=2,
                          steps=12, dataset_windows=16, corpus_bytes=100_000, eval_batches=1, target_steps=1.5,
                          compressors=("dense@1e-5", "quant:8@3e-3", "dense@3e-3"), bandwidths=(200.0,),
                          matmul_precision="high")
    rec = run_wire(cfg, torch.device("cpu"))
    assert torch.get_float32_matmul_precision() == "highest"  # restored
    runs = {r["entry"]: r for r in rec["runs"] if r["bandwidth_mbps"] == 200.0}
    slow, fast = runs["dense@1e-5"], runs["dense@3e-3"]
    assert fast["final_loss"] < slow["final_loss"]  # 1e-5 barely moves in 12 steps
    assert rec["target_loss"] == fast["final_loss"] and fast["loss_gap"] == 0.0 and slow["loss_gap"] > 0
    assert fast["speedup_to_target"] == 1.0 and slow["time_to_target_s"] is None
    assert slow["steps_run"] == 12  # a dense entry never trains on towards another's loss
    assert (fast["lr"], slow["lr"], runs["quant:8@3e-3"]["lr"]) == (3e-3, 1e-5, 3e-3)
    # a given target replaces dense's: an entry alone trains on towards it (here out of reach: 1.5x the steps)
    alone = run_wire(dataclasses.replace(cfg, compressors=("quant:8@3e-3",), target_loss=0.01), torch.device("cpu"))
    r = alone["runs"][0]
    assert alone["target_loss"] == 0.01 and r["steps_run"] == 18 and r["time_to_target_s"] is None
    assert r["loss_gap"] == pytest.approx(r["final_loss"] / 0.01 - 1) and r["speedup_to_target"] is None
    with pytest.raises(ConfigError, match="target_loss"):
        WireBenchConfig(target_loss=-1.0)
    assert set(QUICK) <= set(WireBenchConfig.__dataclass_fields__)


def test_boundary_options_reach_the_stage_compressors_only():
    from actzip.wire.boundaries import parse_boundary_options
    from actzip_bench.wire import build_stages_for

    assert parse_boundary_options("anchor_rank=256, lr=1e-4,code_dtype=bfloat16,retraction=polar") == {
        "anchor_rank": 256, "lr": 1e-4, "code_dtype": torch.bfloat16, "retraction": "polar"}
    assert parse_boundary_options("") == {}
    with pytest.raises(ConfigError, match="name=value"):
        parse_boundary_options("anchor_rank")
    cfg = WireBenchConfig(model="tiny", compressors=("dense", "quant:8", "stiefel:16"), boundary="anchor_rank=16")
    stiefel = build_stages_for(cfg.gpt_config(), 2, "stiefel", 16.0, 0, cfg.boundary_options())
    assert stiefel[1].receiver.cfg.anchor_rank == 16
    dense = build_stages_for(cfg.gpt_config(), 2, "quant", 8.0, 0, cfg.boundary_options())  # ignored there
    assert dense[1].receiver.cfg.kind == "dense"
    assert pipeline_config(cfg, "stiefel:16").boundary == "stiefel:ratio=16.0"
    assert pipeline_config(cfg, "quant:8").boundary == "dense"
    # a field one of the stage compressors lacks fails when the config is made, naming the field
    with pytest.raises(ConfigError, match="anchor_rank"):
        WireBenchConfig(model="tiny", compressors=("dense", "subspace:100", "stiefel:16"), boundary="anchor_rank=16")


def test_processes_mode_runs_under_torchrun(tmp_path, monkeypatch):
    from actzip_bench.wire_processes import train_entry_processes

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))

    cfg = WireBenchConfig(model="tiny", n_layer=2, block_size=16, batch_size=4, steps=2, microbatches=2,
                          dataset_windows=8, mode="processes", timeout_s=30, corpus_bytes=200_000)
    r = train_entry_processes(cfg, "quant:8", torch.device("cpu"))
    assert len(r["losses"]) == 2 and len(r["wall_step_end_s"]) == 2
    assert r["bytes_per_token_fwd"] == pytest.approx(r["bytes_per_token_bwd"])


def test_processes_mode_trains_on_towards_the_target(tmp_path, monkeypatch):
    """Past --steps the ranks agree each step whether the last stage's smoothed loss reached the target."""
    from actzip_bench.wire_processes import train_entry_processes

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))

    cfg = WireBenchConfig(model="tiny", n_layer=2, block_size=16, batch_size=4, steps=2, microbatches=2,
                          dataset_windows=8, mode="processes", timeout_s=30, corpus_bytes=200_000, target_steps=2.0)
    never = train_entry_processes(cfg, "quant:8", torch.device("cpu"), target=-1.0)
    assert len(never["losses"]) == 4 and len(never["wall_step_end_s"]) == 4
    at_once = train_entry_processes(cfg, "quant:8", torch.device("cpu"), target=1e9)
    assert len(at_once["losses"]) == 2
    # bytes per token count the first `steps` steps only (equal tokens), whatever the run length
    assert never["bytes_per_token_fwd"] == pytest.approx(at_once["bytes_per_token_fwd"], rel=0.01)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_processes_mode_over_nccl_matches_one_process(tmp_path, monkeypatch, schedule):
    """Two GPUs, one process each, NCCL point-to-point both ways: the bytes of every step and the losses are
    those of the same pipeline run in one process (a deadlock would end in the NCCL watchdog's abort)."""
    from actzip_bench.wire import Corpus, train_entry
    from actzip_bench.wire_processes import train_entry_processes

    monkeypatch.setenv("ACTZIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    cfg = WireBenchConfig(model="tiny", n_layer=2, block_size=32, batch_size=8, steps=4, microbatches=4,
                          dataset_windows=16, mode="processes", timeout_s=60, corpus_bytes=200_000,
                          schedule=schedule)
    dev = torch.device("cuda")
    multi = train_entry_processes(cfg, "quant:8", dev)
    single = train_entry(dataclasses.replace(cfg, mode="simulated"), "quant:8", dev,
                         Corpus.from_stdlib(max_bytes=cfg.corpus_bytes))
    assert multi["bytes_per_token_fwd"] == single["bytes_per_token_fwd"]
    assert multi["bytes_per_token_bwd"] == single["bytes_per_token_bwd"]
    # stochastic rounding draws the same hash noise in both; matmuls on two GPUs may round differently
    assert multi["losses"] == pytest.approx(single["losses"], rel=1e-2)
