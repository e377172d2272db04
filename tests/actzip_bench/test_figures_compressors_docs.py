"""The figures of docs/wire-compressors.md are rendered from the results files they name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures, figures_compressors_docs as fc


def _write(root: Path, rel: str, record: dict) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def _study_run(name, gap, *, ratio, steps_to_target, speedup=None, link=None, compute=0.1):
    return {"run": name, "compressor": name.split("@")[0], "width": 4, "fwd_bytes_per_token": 1024 / ratio,
            "fwd_ratio": ratio, "bwd_ratio": ratio, "final_train_loss": 2.0 * (1 + gap), "train_loss_gap": gap,
            "val_loss_gap": gap / 2, "steps_to_target": steps_to_target, "steps_run": steps_to_target or 2000,
            "speedup_vs_dense": speedup, "link_speedup_vs_dense": link, "step_compute_s": compute,
            "step_link_s": 0.126}


def _study(runs):
    return {"config": {"steps": 1000, "n_stages": 4, "lr": 3e-4, "seed": 0, "bandwidth_mbps": 200.0},
            "tokens_per_step": 512, "runs": runs,
            "machine": {"host_cpu": "Test CPU", "cores": 2, "torch": "2.x", "date": "2026-01-01"}}


def _tree(tmp_path: Path) -> Path:
    dense = _study_run("dense", 0.0, ratio=1.0, steps_to_target=990, speedup=1.0, link=1.0, compute=0.12)
    _write(tmp_path, fc.STUDY, _study([
        dense,
        _study_run("subspace@100", 0.058, ratio=113.0, steps_to_target=1262, speedup=1.87, link=94.1, compute=0.11),
        _study_run("bottleneck@100", 0.21, ratio=102.0, steps_to_target=None, compute=0.19),
    ]))
    _write(tmp_path, fc.STUDY_RVQ, _study([
        dense, _study_run("stiefel-rvq@128", 0.115, ratio=97.9, steps_to_target=1577, speedup=0.92, link=30.3)]))
    return tmp_path


def test_the_study_table_renders_every_run_and_names_its_file(tmp_path):
    text = fc.compressors_study(_tree(tmp_path))
    assert "(`results/cpu/wire-compressors.json`)" in text
    assert "| `subspace@100` |" in text and "+5.80%" in text and "| 1262 of 1262 | 1.87 | 94.1 |" in text
    assert "| `bottleneck@100` |" in text and "| – of 2000 | – | – |" in text  # a run that never reached dense's loss
    assert "on Test CPU, 2 cores" in text and "lr 3e-4" in text


def test_the_first_bullets_give_ranges_over_both_files_and_the_runs_that_missed(tmp_path):
    text = fc.compressors_first(_tree(tmp_path))
    assert "not reached in 1000 steps" in text  # no run at 100x or more is within 2%
    assert text.index("`subspace@100`") < text.index("`stiefel-rvq@128`") < text.index("`bottleneck@100`")
    assert "2 of the 3 compressed runs" in text and "(`bottleneck@100` did not)" in text
    assert "1.26× to 1.58× as many steps" in text
    assert "30.3× to 94.1× less time" in text and "0.92× to 1.87×" in text
    assert "0.10–0.19 s per step" in text  # every run of both files
    assert "`results/cpu/wire-compressors.json`, `results/cpu/wire-compressors-rvq.json`" in text


def _wire(entry, loss, *, ratio=1.0, codec="none", boundary="", steps=1200, seed=0, val=None):
    compressor = entry.split(":")[0].split("@")[0]
    run = {"entry": entry, "compressor": compressor, "ratio": float(entry.split(":")[1].split("@")[0])
           if ":" in entry else 1.0, "bandwidth_mbps": 200.0, "final_loss": loss, "val_loss": val or loss + 0.2,
           "measured_ratio_fwd": ratio, "fwd_codec": codec, "lr": float(entry.split("@")[1]), "loss_gap": None}
    return {"config": {"steps": steps, "boundary": boundary, "seed": seed}, "runs": [run]}


def test_the_one_token_paragraph_gives_every_length_and_seed_range(tmp_path):
    anchors = "anchor_rank=768,lr=1e-4"
    for rel, steps, dense, q8 in zip(fc.ONE_TOKEN_124M, (1200, 1800, 2400), (1.0, 0.8, 0.7), (1.064, 0.832, 0.7259)):
        _write(tmp_path, f"{rel}/dense.json", _wire("dense@1.5e-4", dense, steps=steps))
        _write(tmp_path, f"{rel}/worse-dense.json", _wire("dense@4e-4", dense + 0.1, steps=steps))
        _write(tmp_path, f"{rel}/q8.json", _wire("stiefel:30@1.5e-4", q8, ratio=107.2, codec="quant:bits=8",
                                                  boundary=anchors, steps=steps))
    more = _wire("stiefel:16@1e-4", 1.075, ratio=16.2, boundary=anchors)
    more["runs"][0]["loss_gap"] = 0.075
    _write(tmp_path, fc.LONG_MORE_124M, more)
    for seed, (rel, gap) in enumerate(zip(fc.CODE_BITS_CPU, (0.008, 0.012, 0.017))):
        _write(tmp_path, f"{rel}/dense.json", _wire("dense@6e-4", 1.4, seed=seed))
        _write(tmp_path, f"{rel}/q8.json", _wire("stiefel:28@3e-4", 1.4 * (1 + gap), ratio=105.9,
                                                  codec="quant:bits=8", boundary="anchor_rank=256,lr=1e-4", seed=seed))
    _write(tmp_path, fc.ONE_TOKEN_CONTROL_CPU, _wire("stiefel:1@6e-4", 1.4 * 1.008 / 1.019,
                                                      boundary="width=256,tie=true,anchor_rank=256,anchor_whole=true"))
    text = fc.compressors_one_token(tmp_path)
    assert "+6.4% at 1200 steps, +4.0% at 1800 steps, +3.7% at 2400 steps" in text
    assert "+7.5% at 1200 steps" in text
    assert "met the 100× target" in text and "+0.8% to +1.7% over 3 seeds, mean +1.2%" in text
    assert "+1.9% against dense given one-token anchors" in text
    for rel in (*fc.ONE_TOKEN_124M, fc.LONG_MORE_124M, *fc.CODE_BITS_CPU, fc.ONE_TOKEN_CONTROL_CPU):
        assert f"`{rel}`" in text


@pytest.mark.parametrize("name", sorted(fc.RENDERERS))
def test_a_missing_results_file_is_a_config_error_naming_it(tmp_path, name):
    with pytest.raises(ConfigError, match=r"results (file|folder) results/"):
        figures.render(name, tmp_path)


def test_a_missing_study_file_names_that_file(tmp_path):
    with pytest.raises(ConfigError, match="wire-compressors.json not found"):
        fc.compressors_study(tmp_path)


def test_the_page_has_no_figure_outside_its_blocks():
    root = Path(__file__).resolve().parents[2]
    assert figures.stray_figures((root / "docs" / "wire-compressors.md").read_text()) == []
