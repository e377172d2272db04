"""The cache profile's figure: one row per model and strategy, the kernels that cost the most over the plain step,
and a clear error without a plain row or without any record."""

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures
from actzip_bench.figures_cache_host import PROFILES


def _write(root: Path, rel: str, model: str, rows: list[dict]) -> None:
    rec = {"model": model, "machine": {"gpu": "NVIDIA H100 80GB HBM3", "host_cpu": "x"},
           "config": {"batch_size": 32, "seq_len": 1024, "dtype": "bfloat16", "steps": 3}, "rows": rows}
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(json.dumps(rec))


def _row(strategy: str, step: float, busy: float, kernels: dict[str, float]) -> dict:
    return {"strategy": strategy, "step_ms": step, "gpu_busy_ms": busy, "gpu_idle_ms": step - busy,
            "kernels": {k: {"ms": ms, "calls": 1} for k, ms in kernels.items()}}


def test_rows_and_the_costliest_kernels_over_none(tmp_path):
    plain = {"gemm": 80.0, "softmax": 5.0}
    _write(tmp_path, PROFILES[0], "gpt-gelu", [
        _row("none", 100.0, 85.0, plain),
        _row("4bit", 140.0, 100.0, {**plain, "quant_encode_kernel<4>": 9.0, "quant_decode_kernel": 6.0,
                                      "softmax": 5.01})])
    text = figures.render("memory-cache-profile", tmp_path)
    assert "| GELU GPT | none | 100.0 | 85.0 | 15.0 | - |" in text
    assert "| GELU GPT | 4bit | 140.0 | 100.0 | 40.0 | quant_encode_kernel +9.00; quant_decode_kernel +6.00 |" in text
    assert "32 × 1024 tokens, bfloat16, 3 profiled steps" in text and "NVIDIA H100" in text
    assert f"(`{PROFILES[0]}`)" in text  # the one record there is


def test_a_record_without_the_plain_step_or_no_record_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="none of"):
        figures.render("memory-cache-profile", tmp_path)
    _write(tmp_path, PROFILES[1], "llama-swiglu", [_row("4bit", 10.0, 5.0, {})])
    with pytest.raises(ConfigError, match="no 'none' row"):
        figures.render("memory-cache-profile", tmp_path)
