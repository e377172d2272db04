import pytest
import torch

from actzip_bench.gpt_memory import GPTBenchConfig, run_gpt
from actzip.errors import ConfigError


def test_tiny_run_has_every_strategy_and_length():
    cfg = GPTBenchConfig(preset="tiny", seq_lens=(32,), tokens_per_step=64, dtype="float32", rounds=1, warmup=0)
    rec = run_gpt(cfg, torch.device("cpu"))
    got = {(r["seq_len"], r["strategy"]) for r in rec["runs"]}
    # On the CPU the arena strategies need compiled kernels: they are listed as skipped, with the reason.
    assert set(rec["skipped"]) == {"fused-arena", "fused-arena-signpack", "fused-arena-rebuild", "fused-arena-rebuild-ln2"}
    ran = [k for k in cfg.strategies if k not in rec["skipped"]]
    assert got == {(32, k) for k in ran}
    assert all(r["batch"] * r["seq_len"] == 64 for r in rec["runs"])
    assert all(r["max_grad_abs_diff"] == 0 for r in rec["runs"])  # the CPU's kernels repeat themselves exactly


def test_bad_config():
    with pytest.raises(ConfigError, match="multiple"):
        GPTBenchConfig(seq_lens=(1000,), tokens_per_step=4096)
    with pytest.raises(ConfigError, match="unknown strategies"):
        GPTBenchConfig(strategies=("none", "x"))
