import json

from actzip_bench.report import build
from actzip_bench.cli import main


def test_report_renders_every_demo_json(tmp_path, capsys):
    run = {"strategy": "none", "lossless": True, "saved_bytes_per_token": 100.0, "peak_bytes": 2**20,
           "step_time_s": 0.01, "final_loss": 2.5, "max_grad_abs_diff": 0.0}
    sparse = {**run, "strategy": "sparse", "saved_bytes_per_token": 75.0, "peak_bytes": 2**19, "step_time_s": 0.02}
    doc = {"device": "NVIDIA H200", "date": "2026-01-01", "torch": "2.11", "dtype": "bfloat16",
           "model": {"preset": "small", "activation": "relu2", "params": 3_000_000, "block_size": 128},
           "tokens_per_step": 1024, "steps": 10, "command": "actzip demo", "runs": [run, sparse]}
    (tmp_path / "results" / "demo").mkdir(parents=True)
    (tmp_path / "results" / "demo" / "h200.json").write_text(json.dumps(doc))
    text = build(tmp_path)
    assert "| sparse | 75 | -25.0% | 0.5 MiB | -50.0% | 20.0 | +100.0% | 2.5000 | 0 |" in text
    assert "NVIDIA H200" in text and "`actzip demo`" in text
    (tmp_path / "docs").mkdir()
    assert main(["report", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "RESULTS.md").read_text() == text


def test_bench_kernels_needs_cuda(capsys):
    import torch

    if torch.cuda.is_available():
        import pytest

        pytest.skip("checks the message shown without a GPU")
    assert main(["bench", "kernels", "--numel", "4096"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_report_renders_the_quant_kernels_json(tmp_path):
    cfg = {"numel": 1 << 20, "check_numel": 4096, "group_size": 128, "sweep_dtype": "bfloat16"}
    run = {"dtype": "bfloat16", "variant": "quant4-sr", "ratio": 3.56, "exact": True, "dense_bytes": 2 << 20,
           "payload_bytes": 600_000, "encode_s": 1e-4, "decode_s": 2e-4, "encode_frac_copy": 0.8,
           "decode_frac_copy": 0.4, "torch_encode_bw": 1e9, "torch_decode_bw": 1e10}
    shape = {"variant": "quant4-sr", "tile": 2048, "warps": 1, "group_threads": 32, "same_bytes": True,
             "encode_frac_copy": 0.82, "decode_frac_copy": 0.84}
    rec = {"config": cfg, "copy_bandwidth": 4e12, "runs": [run], "sweep": [shape], "command": "actzip bench quant",
           "machine": {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date": "2026-01-01"}}
    (tmp_path / "results" / "h200").mkdir(parents=True)
    (tmp_path / "results" / "h200" / "quant.json").write_text(json.dumps(rec))
    text = build(tmp_path)
    assert "| bfloat16 | quant4-sr | 3.56 | True | 0.100 | 80% | 0.200 | 40% | 27x / 1x |" in text
    assert "| quant4-sr | 2048, 1, 32 | 82% | 84% | True |" in text and "4.00 TB/s" in text
