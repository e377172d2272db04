"""The README's wire figure against the baselines a user would pick: it reads every seed's run of every entry,
takes step times from the runs alone, names the best baseline, and refuses an incomplete folder."""

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures
from actzip_bench.figures_wire_baselines import ENTRIES, FOLDER

STEPS = 20
# entry file name -> (run entry, stage codec, boundary, final loss at seed 0, alone step time, bytes per token)
SPECS = {
    "dense": ("dense@1.5e-4", None, "", 2.0, 2.0, 3072.0),
    "bf16": ("bf16@1.5e-4", None, "", 2.0, 1.0, 1536.0),
    "quant-4": ("quant:4@1.5e-4", None, "", 2.0, 0.6, 816.0),
    "quant-8": ("quant:8@1.5e-4", None, "", 2.04, 0.4, 432.0),
    "delta-8": ("delta:8@1.5e-4", None, "", 2.06, 0.4, 432.0),
    "subspace-100": ("subspace:100@1.5e-4", None, "", 2.2, 0.2, 30.0),
    "anchored30": ("stiefel:30@1.5e-4", "quant:bits=8", "anchor_context=2", 1.7, 0.2, 29.0),
    "control": ("stiefel:1@1.5e-4", None, "anchor_context=2,anchor_whole=true", 1.6, 2.2, 3361.0),
}


def _curve(final: float, target: float, reach_at: int | None) -> list[float]:
    """STEPS losses whose last 2 (the smoothing window) average ``final``, reaching ``target`` at ``reach_at``."""
    if reach_at is None:  # trained on to twice the steps, always above the target
        return [max(final, target) + 0.5] * (2 * STEPS)
    if reach_at <= STEPS:
        return [target + 0.5] * (reach_at - 2) + [min(final, target - 0.01)] * (STEPS - reach_at + 2)
    return [final + 0.5] * (STEPS - 2) + [final, final] + [target + 0.5] * (reach_at - STEPS - 2) + [target - 0.01] * 2


def _record(name: str, seed: int, final: float, target: float, reach_at: int | None, date="2026-12-01") -> dict:
    entry, codec, boundary, _, _, bpt = SPECS[name]
    run = {"entry": entry, "compressor": entry.split(":")[0].split("@")[0], "bandwidth_mbps": 200.0,
           "latency_ms": 50.0, "final_loss": final, "bytes_per_token_fwd": bpt, "step_time_s": 9.0}
    return {"config": {"stages": 2, "steps": STEPS, "batch_size": 32, "dataset_windows": 4096, "smooth": 0.1,
                       "boundary": boundary, "stage_codec": codec, "seed": seed},
            "gpt": {"n_layer": 12, "n_embd": 768, "block_size": 256},
            "runs": [run, {**run, "bandwidth_mbps": None}],
            "curves": {entry: {"every": 1, "loss": _curve(final, target, reach_at)}},
            "machine": {"gpu": "NVIDIA H200", "date": date, "code_version": "abc1234567890"}}


def _folder(root: Path, seeds=(0, 1, 2), reach=None) -> Path:
    folder = root / FOLDER
    folder.mkdir(parents=True)
    reach = reach or {}
    for seed in seeds:
        dense_final = 2.0 + 0.01 * seed
        for name, (_, _, _, final, _, _) in SPECS.items():
            f = dense_final if name == "dense" else final + 0.01 * seed
            at = reach.get(name, STEPS if f >= dense_final - 1e-9 else 10)
            (folder / f"seed{seed}-{name}.json").write_text(json.dumps(_record(name, seed, f, dense_final, at)))
    for i, (name, (entry, codec, boundary, _, step_s, _)) in enumerate(SPECS.items()):
        run = {"entry": entry, "bandwidth_mbps": 200.0, "step_time_s": step_s}
        rec = {"config": {"boundary": boundary, "stage_codec": codec}, "runs": [run, {**run, "bandwidth_mbps": None}]}
        (folder / f"time-{i}.json").write_text(json.dumps(rec))
    (root / "README.md").write_text("<!-- figure: wire-baselines -->\n<!-- /figure -->\n")
    return folder


def test_the_table_has_every_entry_over_every_seed_and_names_the_best_baseline(tmp_path):
    _folder(tmp_path, reach={"quant-8": 22, "delta-8": 24})
    text = figures.render("wire-baselines", tmp_path)
    assert "3 seeds, every run of code version abc1234567" in text
    for label in ENTRIES.values():
        assert f"| {label} |" in text
    # dense: 20 steps x 2.0 s; bf16 the same steps at 1.0 s; 4-bit: 22 steps x 0.4 s; anchored: 10 steps x 0.2 s
    assert "| bf16 dense | 1,536 | 2.010 (2.000 to 2.020) | +0.0% | — | 2.0× |" in text
    assert "| 4-bit quantized dense | 432 |" in text and "| 4.5× |" in text
    assert "| Stiefel with anchors (8-bit codes) | 29 |" in text and "| 20.0× |" in text
    assert "reaches dense's loss 4.4× sooner than the best of them (4-bit quantized dense)" in text
    assert "(`results/h200/wire-baselines`)" in text


def test_a_run_that_never_reaches_dense_is_said_so_and_not_counted_as_best(tmp_path):
    _folder(tmp_path, reach={"bf16": None, "quant-4": None, "quant-8": 22, "delta-8": 24})
    text = figures.render("wire-baselines", tmp_path)
    assert "| bf16 dense |" in text and "not reached in every seed" in text
    assert "than the best of them (4-bit quantized dense)" in text
    assert "| 8-bit quantized dense | 816 | 2.010 (2.000 to 2.020) | +0.0% | — | not reached in every seed |" in text


def test_no_baseline_reaching_dense_is_said_so(tmp_path):
    _folder(tmp_path, reach={b: None for b in ("bf16", "quant-4", "quant-8", "delta-8")})
    assert "reaches dense's loss in every seed, and none of them does" in figures.render("wire-baselines", tmp_path)


def test_a_missing_seed_or_step_time_is_a_clear_error(tmp_path):
    folder = _folder(tmp_path)
    (folder / "seed2-delta-8.json").unlink()
    with pytest.raises(ConfigError, match=r"lacks delta-8 for seeds \[2\]"):
        figures.render("wire-baselines", tmp_path)
    (folder / "seed2-dense.json").rename(folder / "x.json")
    for p in folder.glob("seed2-*.json"):
        p.unlink()
    (folder / "time-0.json").unlink()
    with pytest.raises(ConfigError, match="no time-.*dense@1.5e-4 alone"):
        figures.render("wire-baselines", tmp_path)
