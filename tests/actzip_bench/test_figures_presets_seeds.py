"""The presets' loss over several seeds: means and ranges per model, the seed count and the shared code version,
and a clear error for a folder that lacks a model or a preset."""

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures
from actzip_bench.figures_presets_seeds import FOLDER


def _write(root: Path, act: str, seed: int, gap4: float, gap2: float, version="abc1234567890", presets=None):
    runs = [{"preset": "lossless", "train_loss_gap": 0.0, "val_loss_gap": 0.0},
            {"preset": "4bit", "train_loss_gap": gap4, "val_loss_gap": 2 * gap4},
            {"preset": "2bit", "train_loss_gap": gap2, "val_loss_gap": 2 * gap2}]
    if presets is not None:
        runs = [r for r in runs if r["preset"] in presets]
    rec = {"config": {"activation": act, "seed": seed, "steps": 2000}, "runs": runs,
           "machine": {"code_version": version}}
    folder = root / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{act}-seed{seed}.json").write_text(json.dumps(rec))


def _tree(root: Path) -> None:
    for act in ("gelu", "relu2", "swiglu"):
        for seed, g in enumerate((0.004, 0.006, 0.008)):
            _write(root, act, seed, g, 5 * g)


def test_means_ranges_seeds_and_version(tmp_path):
    _tree(tmp_path)
    text = figures.render("memory-presets-seeds", tmp_path)
    assert "Over 3 seeds" in text and "code version abc1234567" in text
    assert "| 4bit | +0.6% (+0.4% to +0.8%); validation +1.2% (+0.8% to +1.6%) |" in text
    assert "| 2bit | +3.0% (+2.0% to +4.0%);" in text
    assert "at most +0.8% in every run (`results/cpu/presets-seeds`)" in text


def test_mixed_code_versions_are_said(tmp_path):
    _tree(tmp_path)
    _write(tmp_path, "gelu", 2, 0.008, 0.04, version="other")
    assert "2 code versions" in figures.render("memory-presets-seeds", tmp_path)


def test_a_missing_model_or_preset_is_a_clear_error(tmp_path):
    _write(tmp_path, "gelu", 0, 0.004, 0.02)
    with pytest.raises(ConfigError, match="no run of relu2, swiglu"):
        figures.render("memory-presets-seeds", tmp_path)
    _tree(tmp_path)
    _write(tmp_path, "relu2", 1, 0.004, 0.02, presets=("lossless", "4bit"))
    with pytest.raises(ConfigError, match="lacks the '2bit' preset"):
        figures.render("memory-presets-seeds", tmp_path)


def test_the_124m_figure_reads_its_own_folder_and_says_the_runs_shape(tmp_path):
    from actzip_bench.figures_presets_seeds import FOLDER_124M

    for seed, g in enumerate((0.002, 0.004, 0.009)):
        rec = {"config": {"activation": "gelu", "seed": seed, "steps": 2000, "model": "gpt2-124m",
                          "dtype": "bfloat16", "graphs": True}, "tokens_per_step": 4096, "reference": "none",
               "runs": [{"preset": "none", "train_loss_gap": 0.0, "val_loss_gap": 0.0},
                        {"preset": "4bit", "train_loss_gap": g, "val_loss_gap": g},
                        {"preset": "2bit", "train_loss_gap": 3 * g, "val_loss_gap": 3 * g}],
               "machine": {"code_version": "abc1234567890"}}
        (tmp_path / FOLDER_124M).mkdir(parents=True, exist_ok=True)
        (tmp_path / FOLDER_124M / f"gelu-seed{seed}.json").write_text(json.dumps(rec))
    text = figures.render("memory-presets-124m", tmp_path)
    assert "gpt2-124m size, 4,096 tokens a step, forwards under bfloat16 autocast, so `none` is the bfloat16 " \
           "step, every step after the third a CUDA graph's replay;" in text and "gap to `none`" in text
    assert "| preset | GELU GPT, 124M |" in text
    assert "| 4bit | +0.5% (+0.2% to +0.9%);" in text
    assert f"(`{FOLDER_124M}`)" in text
