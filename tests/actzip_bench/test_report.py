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


def _demo_tree(root):
    """The smallest project tree the report reads: one demo JSON under results/, an empty docs/."""
    run = {"strategy": "none", "saved_bytes_per_token": 100.0, "peak_bytes": None, "step_time_s": 0.01,
           "final_loss": 2.5, "max_grad_abs_diff": 0.0}
    doc = {"device": "cpu", "host": {"cpu": "x86", "cores": 2}, "date": "2026-01-01", "torch": "2.11",
           "dtype": "float32", "model": {"preset": "tiny", "activation": "relu2", "params": 1_000_000},
           "tokens_per_step": 64, "steps": 2, "command": "actzip demo", "runs": [run]}
    (root / "results" / "demo").mkdir(parents=True)
    (root / "results" / "demo" / "cpu.json").write_text(json.dumps(doc))
    (root / "docs").mkdir()
    return root


def test_report_finds_the_project_root_from_a_subfolder(tmp_path, monkeypatch, capsys):
    root = _demo_tree(tmp_path / "project")
    monkeypatch.chdir(root / "results" / "demo")
    assert main(["report"]) == 0
    assert (root / "docs" / "RESULTS.md").read_text() == build(root)
    assert str(root / "docs" / "RESULTS.md") in capsys.readouterr().out


def test_report_outside_a_project_says_what_it_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 2
    err = capsys.readouterr().err
    assert "results/ and docs/" in err and str(tmp_path) in err and "--root" in err
    assert not (tmp_path / "docs").exists()
    (tmp_path / "results").mkdir()  # --root must hold both folders
    assert main(["report", "--root", str(tmp_path)]) == 2
    assert "has no docs/" in capsys.readouterr().err


def test_report_of_the_real_tree_from_anywhere(tmp_path, monkeypatch):
    """The repository's own results, from an unrelated directory, to a temp file: docs/RESULTS.md is what the
    report makes of results/ (it is never edited by hand)."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "RESULTS.md"
    assert main(["report", "--root", str(repo), "--out", str(out)]) == 0
    assert out.read_text() == (repo / "docs" / "RESULTS.md").read_text()
