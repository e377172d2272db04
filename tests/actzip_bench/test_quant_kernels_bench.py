"""The quant/fp8 kernel benchmark: options, the CLI without a GPU, and a small run on CUDA."""

import json

import pytest
import torch

from actzip_bench.quant_kernels import (
    VARIANTS,
    QuantKernelBenchConfig,
    run_quant_kernels,
)
from actzip_bench.cli import main
from actzip.errors import ConfigError


def test_bad_options():
    with pytest.raises(ConfigError, match=r"unknown variant\(s\) quant3; variants: quant4-sr"):
        QuantKernelBenchConfig(variants=("quant3",))
    with pytest.raises(ConfigError, match="numel"):
        QuantKernelBenchConfig(numel=0)
    with pytest.raises(ConfigError, match="sweep_variants must be quant variants, got fp8-e4m3-tensor"):
        QuantKernelBenchConfig(sweep_variants=("quant4-sr", "fp8-e4m3-tensor"))
    with pytest.raises(ConfigError, match=r"sweep entries are \(tile, warps, group_threads\), powers of two"):
        QuantKernelBenchConfig(sweep=((4096, 3, 4),))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_bench_quant_needs_cuda(capsys):
    assert main(["bench", "quant", "--numel", "4096"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.cuda
def test_small_run_is_exact(tmp_path):
    shapes = ((2048, 2, 4), (8192, 8, 2))
    cfg = QuantKernelBenchConfig(numel=1 << 16, check_numel=1 << 12, dtypes=("bfloat16",), sweep=shapes)
    rec = run_quant_kernels(cfg, torch.device("cuda"))
    assert [r["variant"] for r in rec["runs"]] == list(VARIANTS)
    assert all(r["exact"] and r["encode_s"] > 0 and r["ratio"] > 1 for r in rec["runs"])
    assert len(rec["sweep"]) == len(cfg.sweep_variants) * len(shapes)
    assert all(r["same_bytes"] and r["encode_frac_copy"] > 0 for r in rec["sweep"])
    out = tmp_path / "quant.json"
    assert main(["bench", "quant", "--numel", str(1 << 16), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["command"].startswith("actzip bench quant")
