import json
import math

import pytest
import torch
import torch.nn.functional as F

from actzip_bench.ffn import FFNBenchConfig, build_stack, check_gradients, make_input, measured_density, run_ffn
from actzip_bench.cli import main
from actzip.errors import ConfigError


@pytest.mark.parametrize("density,expected", [("mid", 0.5), ("low", 0.2)])
def test_density_settings(density, expected):
    cfg = FFNBenchConfig(d=256, rows=256, n_blocks=2, density=density, dtype="float32")
    got = measured_density(build_stack(cfg, torch.device("cpu")), make_input(cfg, torch.device("cpu")))
    assert abs(got - expected) < 0.03


def test_run_ffn_every_strategy_exact():
    cfg = FFNBenchConfig(d=64, rows=128, n_blocks=2, dtype="float32", rounds=2, warmup=1)
    rec = run_ffn(cfg, torch.device("cpu"))
    ran = [s for s in cfg.strategies if s not in rec["skipped"]]
    assert [r["strategy"] for r in rec["runs"]] == ran and "fused" in ran
    assert all("arena" in s for s in rec["skipped"])
    for r in rec["runs"]:
        assert r["max_grad_abs_diff"] == 0.0 and r["rounds"] == 2 and r["median_ms"] > 0
    assert rec["machine"]["torch"] == torch.__version__


def test_run_ffn_fp8_matmuls_exact_and_fused_keeps_no_fp8_copy():
    from actzip.memory import Fp8Linear

    cfg = FFNBenchConfig(d=64, rows=128, n_blocks=2, rounds=1, warmup=0, matmul="fp8",
                         strategies=("none", "checkpoint", "cache", "fused"))
    blocks = build_stack(cfg, torch.device("cpu"))
    assert all(isinstance(b.up, Fp8Linear) and isinstance(b.down, Fp8Linear) for b in blocks)
    rec = run_ffn(cfg, torch.device("cpu"))
    assert rec["config"]["matmul"] == "fp8"
    for r in rec["runs"]:  # the fused MLP and the cache change no bit of the fp8 model's gradients
        assert r["max_grad_abs_diff"] == 0.0


@pytest.mark.parametrize("value,check", [(math.nan, math.isnan), (math.inf, math.isinf)], ids=["nan", "inf"])
def test_check_gradients_reports_nan_and_inf(monkeypatch, value, check):
    # The checkpoint strategy's norm-weight gradients become `value`; the other gradients, which backward
    # reaches first, stay exact, so a NaN that comes after them must not be lost.
    import actzip_bench.ffn as ffn

    real = ffn.checkpoint

    def wrapped(block, *args, **kwargs):
        fired = []

        def once(g):  # the blocks are shared by every strategy: poison only this backward
            if fired:
                return None
            fired.append(True)
            return torch.full_like(g, value)

        block.norm.weight.register_hook(once)
        return real(block, *args, **kwargs)

    monkeypatch.setattr(ffn, "checkpoint", wrapped)
    cfg = FFNBenchConfig(d=32, rows=64, n_blocks=2, dtype="float32", strategies=("none", "checkpoint", "cache"))
    cpu = torch.device("cpu")
    diff = check_gradients(cfg, build_stack(cfg, cpu), make_input(cfg, cpu))
    assert check(diff["checkpoint"])
    assert diff["none"] == 0.0 and diff["cache"] == 0.0


def test_cli_bench_ffn_json(tmp_path):
    out = tmp_path / "ffn.json"
    rc = main(["bench", "ffn", "--d", "32", "--rows", "64", "--n-blocks", "1", "--dtype", "float32", "--rounds", "1",
               "--warmup", "0", "--strategies", "none,fused", "--device", "cpu", "--json", str(out)])
    assert rc == 0
    rec = json.loads(out.read_text())
    assert rec["command"].startswith("actzip bench ffn") and len(rec["runs"]) == 2


def test_bad_options():
    with pytest.raises(ConfigError, match="density"):
        FFNBenchConfig(density="high")
    with pytest.raises(ConfigError, match="matmul"):
        FFNBenchConfig(matmul="int8")
    with pytest.raises(ConfigError, match="unknown strategies"):
        FFNBenchConfig(strategies=("none", "magic"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_relu_only_function_keeps_one_hidden_tensor_and_its_gradients_are_plain_pytorchs(dtype):
    from actzip_bench.ffn_relu_only import relu_squared_mlp_keeping_relu

    g = torch.Generator().manual_seed(0)
    n = torch.randn(96, 32, generator=g).to(dtype).requires_grad_()
    w_up = (torch.randn(80, 32, generator=g) * 0.2).to(dtype).requires_grad_()
    w_down = (torch.randn(32, 80, generator=g) * 0.2).to(dtype).requires_grad_()
    upstream = torch.randn(96, 32, generator=g).to(dtype)

    def grads(fn):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn(n, w_up, w_down)
        got = torch.autograd.grad(out, (n, w_up, w_down), upstream)
        hidden = sum(t.numel() for t in {t.data_ptr(): t for t in saved if t.shape == (96, 80)}.values())  # distinct
        return out, got, hidden

    plain_out, plain, plain_hidden = grads(lambda n, u, d: F.linear(F.relu(F.linear(n, u)).square(), d))
    out, mine, hidden = grads(relu_squared_mlp_keeping_relu)
    assert torch.equal(out, plain_out)
    for a, b in zip(mine, plain):
        assert torch.equal(a, b)
    assert hidden == 96 * 80 and plain_hidden == 2 * 96 * 80  # relu(h) alone, where plain keeps it and its square


def test_the_relu_only_strategy_runs_beside_the_others_and_is_skipped_for_fp8():
    cfg = FFNBenchConfig(d=64, rows=128, n_blocks=2, dtype="float32", rounds=1, warmup=0,
                         strategies=("none", "relu-only"))
    rec = run_ffn(cfg, torch.device("cpu"))
    assert [r["strategy"] for r in rec["runs"]] == ["none", "relu-only"]
    assert rec["runs"][1]["max_grad_abs_diff"] == 0.0
    fp8 = run_ffn(FFNBenchConfig(d=64, rows=128, n_blocks=2, rounds=1, warmup=0, matmul="fp8",
                                 strategies=("none", "relu-only")), torch.device("cpu"))
    assert "relu-only" in fp8["skipped"] and [r["strategy"] for r in fp8["runs"]] == ["none"]
    with pytest.raises(ConfigError, match="2-D"):
        from actzip_bench.ffn_relu_only import relu_squared_mlp_keeping_relu
        relu_squared_mlp_keeping_relu(torch.ones(2, 3, 4), torch.ones(5, 4), torch.ones(4, 5))


def test_public_harness_runs_every_cpu_strategy_with_identical_gradients():
    from actzip_bench.ffn import FFNBenchConfig, run_ffn

    cfg = FFNBenchConfig(d=32, rows=64, n_blocks=2, density="low", rounds=1, warmup=0, kernel="torch",
                         harness="public", strategies=("none", "checkpoint", "relu-only", "fused", "fused-arena"))
    rec = run_ffn(cfg, torch.device("cpu"))
    assert rec["config"]["harness"] == "public" and rec["config"]["hidden"] == 168
    assert {r["strategy"] for r in rec["runs"]} == {"none", "checkpoint", "relu-only", "fused"}
    assert "fused-arena" in rec["skipped"] and all(r["max_grad_abs_diff"] == 0 for r in rec["runs"])
    assert 0.1 < rec["density"] < 0.35
