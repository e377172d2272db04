"""The figures of docs/memory.md: rendered from fake results trees, ranges and cited files checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures, figures_memory_docs

MACHINE = {"gpu": "NVIDIA H200", "date": "2026-11-29T00:00:00+00:00"}


def _tree(tmp_path: Path) -> Path:
    for rel in ("results/h200/recheck", "results/cpu", "docs"):
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
    return tmp_path


def _write(root: Path, rel: str, rec: dict) -> None:
    (root / rel).write_text(json.dumps(rec))


def _gpt_record(times: dict[str, tuple[float, float]], peaks: dict[str, float]) -> dict:
    """A gpt-bench record at seq 4096 / 8192: ``times[strategy]`` its time_vs_none at each length."""
    runs = []
    for i, seq in enumerate((4096, 8192)):
        runs.append({"seq_len": seq, "strategy": "none", "median_ms": 100.0, "min_ms": 99.5, "max_ms": 100.5,
                     "time_vs_none": 1.0, "peak_vs_none": 1.0})
        for s, t in times.items():
            runs.append({"seq_len": seq, "strategy": s, "median_ms": 100.0 * t[i], "min_ms": 100.0 * t[i] - 1,
                         "max_ms": 100.0 * t[i] + (20 if s == "fused-arena-rebuild" and seq == 4096 else 2),
                         "time_vs_none": t[i], "peak_vs_none": peaks[s]})
    return {"config": {"preset": "gpt2-124m", "seq_lens": [4096, 8192], "tokens_per_step": 32768, "loss_chunk": 1024,
                       "dtype": "bfloat16", "rounds": 10, "strategies": ["none", *times]},
            "runs": runs, "machine": MACHINE}


PEAKS = {"fused-arena": 0.72, "fused-arena-rebuild-ln2": 0.668, "fused-arena-rebuild": 0.616,
         "fused-arena-signpack": 0.712}


def test_the_gpt_table_gives_every_length_the_rerun_and_names_both_files(tmp_path):
    root = _tree(tmp_path)
    first = {"fused-arena": (0.994, 0.995), "fused-arena-rebuild-ln2": (1.002, 1.010),
             "fused-arena-rebuild": (1.006, 1.038), "fused-arena-signpack": (1.016, 1.010)}
    again = {**first, "fused-arena-rebuild": (1.035, 1.004)}
    _write(root, figures_memory_docs.GPT_CHUNKED, _gpt_record(first, PEAKS))
    _write(root, figures_memory_docs.GPT_RERUN, _gpt_record(again, PEAKS))
    text = figures.render("memory-gpt-table", root)
    assert "| fused arena + all three rebuilt | -38.4% / -38.4% | +0.6% / +3.8% | +3.5% / +0.4% |" in text
    assert "| fused arena, sign packed | -28.8% / -28.8% | +1.6% / +1.0% | +1.6% / +1.0% |" in text
    assert "`results/h200/gpt-chunk1024.json`" in text and "`results/h200/recheck/recheck-gpt-chunk1024.json`" in text
    assert "moved by up to 3.4 points" in text  # +3.8% then +0.4% at 8192
    assert "fused arena + all three rebuilt at sequence length 4096: 99.6–120.6 ms" in text
    assert "sequence length 4096 / 8192" in text and "loss over chunks of 1024 tokens" in text


def _preset_record(activation: str, gaps: dict[str, tuple[float, float]]) -> dict:
    """A presets-bench record: lossless, then each preset with its (train, val) loss gap."""
    runs = [{"preset": "lossless", "final_train_loss": 1.0, "val_loss": 1.7, "train_loss_gap": 0.0,
             "val_loss_gap": 0.0, "saved_bytes_per_token": 100.0, "dense_bytes_per_token": 100.0}]
    for p, (t, v) in gaps.items():
        runs.append({"preset": p, "final_train_loss": 1.0 + t, "val_loss": 1.7 * (1 + v), "train_loss_gap": t,
                     "val_loss_gap": v, "saved_bytes_per_token": 25.0, "dense_bytes_per_token": 100.0})
    return {"config": {"model": "tiny", "activation": activation, "presets": ["lossless", *gaps], "steps": 2000},
            "runs": runs, "machine": {"host_cpu": "a CPU"}}


def test_the_presets_table_lists_every_run_and_gives_the_ranges_it_concludes(tmp_path):
    root = _tree(tmp_path)
    files = dict(zip(figures_memory_docs.PRESETS, (
        _preset_record("gelu", {"conservative": (0.0006, 0.001), "4bit": (0.006, 0.024), "aggressive": (0.029, 0.028)}),
        _preset_record("gelu", {"4bit": (0.0063, 0.016), "2bit": (0.028, 0.012)}),
        _preset_record("relu2", {"4bit": (0.0021, 0.011), "2bit": (0.0143, 0.025)}),
        _preset_record("swiglu", {"4bit": (0.0097, 0.018)}),
        _preset_record("swiglu", {"2bit": (0.0419, 0.008)}),
    )))
    for rel, rec in files.items():
        _write(root, rel, rec)
    text = figures.render("memory-presets", root)
    assert "| 4bit | +0.60%, +0.63% (+2.4%, +1.6%) | +0.21% (+1.1%) | +0.97% (+1.8%) |" in text
    assert "| balanced | — | — | — |" in text  # measured nowhere: no figure
    assert "(4bit on the GELU GPT: +2.4%, then +1.6%)" in text and "one run of one seed" in text
    assert "at most +0.97% on all three models" in text and "cost +1.43% to +4.19%." in text
    assert all(f"`{rel}`" in text for rel in figures_memory_docs.PRESETS)


def _kernel_run(dtype: str, density: float, packed: bool, frac: float) -> dict:
    keys = ("encode", "decode", "encode_single_pass", "encode_relu2", "encode_relu2_single_pass")
    run = {"dtype": dtype, "density": density, "sign_pack": packed}
    for k in keys:
        run[f"{k}_s"] = 1e-3 * (1 + density)
        run[f"{k}_frac_copy"] = frac if k == "decode" else 0.3
    return run


def test_the_kernel_table_checks_the_copy_target_at_every_density(tmp_path):
    root = _tree(tmp_path)
    runs = [_kernel_run(d, x, p, {"bfloat16": 0.63, "float32": 0.85}[d] - (0.1 if x == 0.2 else 0))
            for d in ("bfloat16", "float32") for x in (0.5, 0.2) for p in (False, True)]
    rec = {"config": {"numel": 1 << 28, "dtypes": ["bfloat16", "float32"], "densities": [0.5, 0.2]},
           "runs": runs, "machine": MACHINE}
    _write(root, figures_memory_docs.KERNELS, rec)
    text = figures.render("memory-kernels", root)
    assert "256M bfloat16 elements, densities 0.5 / 0.2" in text
    assert "| decode (gather decoder) | 1.500 / 1.200 | 63% / 53% |" in text
    assert "reached by the float32 decode (85% / 75%) only" in text and "(`results/h200/kernels.json`)" in text
    for r in rec["runs"]:
        r["decode_frac_copy"] = 0.5
    _write(root, figures_memory_docs.KERNELS, rec)
    assert "reached by none of them" in figures.render("memory-kernels", root)


@pytest.mark.parametrize("name, missing", [
    ("memory-gpt-table", "results/h200/gpt-chunk1024.json"),
    ("memory-cache-floor", "results/h200/quant.json"),
    ("memory-sketch-loss", "results/cpu/presets-tiny-gelu-sketch.json"),
])
def test_a_missing_results_file_is_a_config_error_naming_it(tmp_path, name, missing):
    root = _tree(tmp_path)
    with pytest.raises(ConfigError, match=f"results file {missing} not found"):
        figures.render(name, root)


def test_a_record_without_the_strategy_named_is_a_config_error_naming_the_file(tmp_path):
    root = _tree(tmp_path)
    rec = _gpt_record({"fused-arena": (0.99, 0.99)}, PEAKS)
    _write(root, figures_memory_docs.GPT_CHUNKED, rec)
    with pytest.raises(ConfigError, match="gpt-chunk1024.json has no 'fused-arena-signpack' run"):
        figures.render("memory-signpack", root)


def test_every_renderer_is_prefixed_documented_and_registered():
    for name, fn in figures_memory_docs.RENDERERS.items():
        assert name.startswith("memory-") and fn.__doc__
        assert figures.RENDERERS[name] is fn
