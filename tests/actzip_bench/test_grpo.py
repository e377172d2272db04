import dataclasses

import pytest
import torch

from actzip.errors import ConfigError

pytest.importorskip("trl")
pytest.importorskip("scipy")

from actzip_bench.grpo import GRPOBenchConfig, run_grpo, synthetic_batch  # noqa: E402


def test_quick_run_has_every_row_with_throughput_reward_and_a_plan():
    cfg = dataclasses.replace(GRPOBenchConfig.quick(), strategies=("none", "checkpoint", "planner"), rounds=1,
                              warmup=0, reward_steps=1, sft_steps=2)
    rec = run_grpo(cfg, torch.device("cpu"))
    rows = {r["strategy"]: r for r in rec["runs"]}
    assert set(rows) == {"none", "checkpoint", "planner"}
    assert all(r["tokens_per_s"] > 0 and "peak_bytes" in r and 0.0 <= r["reward"] <= 1.0 for r in rows.values())
    assert "predicted peak" in rows["planner"]["plan"] and rec["planner_budget_bytes"] > 0
    assert rec["planner_timing"]["units"] == 300 and rec["planner_timing"]["lookup_ms"] > 0
    assert all(len(r["reward_curves"]) == 1 and len(r["reward_curves"][0]) == 1 for r in rows.values())


def test_offload_is_skipped_off_cuda_and_the_curves_plot(tmp_path):
    from actzip_bench.grpo import plot

    cfg = dataclasses.replace(GRPOBenchConfig.quick(), strategies=("none", "offload"), rounds=1, warmup=0,
                              reward_steps=2, sft_steps=1)
    rec = run_grpo(cfg, torch.device("cpu"))
    assert "CUDA" in rec["skipped"]["offload"] and [r["strategy"] for r in rec["runs"]] == ["none"]
    plot(rec, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_synthetic_batches_carry_a_zero_advantage_group():
    cfg = GRPOBenchConfig.quick()
    b = synthetic_batch(cfg, torch.device("cpu"))
    adv = b["advantages"].view(cfg.prompts, cfg.group_size)
    assert torch.all(adv[0] == 0) and b["completion_mask"].sum() == b["num_items_in_batch"]


def test_bad_config():
    with pytest.raises(ConfigError, match="preset"):
        GRPOBenchConfig(preset="70b")
    with pytest.raises(ConfigError, match="strategies"):
        GRPOBenchConfig(strategies=("planner",))
