"""docs/wire.md's figures are rendered from the results files they name, with ranges over every seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "results" / "h200").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("")
    return tmp_path


def _write(root: Path, rel: str, rec: dict) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def _run(entry, loss, val, ratio=1.0, bw=200.0, step=1.0, codec="none", to=300):
    return {"entry": entry, "compressor": entry.split(":")[0].split("@")[0], "final_loss": loss, "val_loss": val,
            "measured_ratio_fwd": ratio, "bandwidth_mbps": bw, "step_time_s": step, "fwd_codec": codec,
            "steps_to_target": to, "steps_run": 300, "time_to_target_s": 10.0 * step, "lr": 1.5e-4}


def _rec(seed, *runs, steps=1200, date="2026-11-30T10:00:00+00:00", code=None):
    machine = {"date": date, **({"code_version": code} if code else {})}
    return {"config": {"seed": seed, "steps": steps, "batch_size": 32, "block_size": 256, "stages": 2},
            "machine": machine, "runs": list(runs)}


def _context_tree(root: Path, s30=(0.98, 0.99)) -> None:
    dense = (1.0, 1.02)
    for seed, folder in enumerate(("results/h200/wire-long-context", "results/h200/wire-long-context-seed1")):
        name = "wire-long-124m" if seed == 0 else "dense-1.5e-4-seed1"
        _write(root, f"{folder}/{name}.json", _rec(seed, _run("dense@1.5e-4", dense[seed], 1.0)))
        _write(root, f"{folder}/control-dense-plus-context2-anchors-1.5e-4.json",
               _rec(seed, _run("stiefel:1@1.5e-4", 0.96 * dense[seed], 0.95, 0.9)))
        _write(root, f"{folder}/stiefel30-q8-context2-1.5e-4.json",
               _rec(seed, _run("stiefel:30@1.5e-4", s30[seed], 0.97, 107.2, codec="quant:bits=8")))
    for name, entry in (("stiefel16-context2-1.5e-4", "stiefel:16@1.5e-4"), ("stiefel5-q8-context2-1.5e-4", "stiefel:5@1.5e-4"),
                        ("stiefel4-q8-context2-1e-4", "stiefel:4@1e-4"), ("stiefel16-context2-2.5e-4", "stiefel:16@2.5e-4")):
        _write(root, f"results/h200/wire-long-context/{name}.json", _rec(0, _run(entry, 1.01, 1.0, 16.2)))


def test_the_anchors_table_gives_every_seed_its_gaps_and_says_the_code_was_older(tmp_path):
    root = _tree(tmp_path)
    _context_tree(root)
    text = figures.render("wire-doc-context", root)
    assert "2 seeds (0, 1); run 2026-11-30 with older code than the current (no code version recorded)" in text
    assert "(`results/h200/wire-long-context`, `results/h200/wire-long-context-seed1`)" in text
    assert "| dense plus anchors over two tokens (the control) | 0.9 | -4.0%, -4.0% | -4.0% |" in text
    # stiefel:30 against dense (0.98/1.0, 0.99/1.02) and against the control (0.98/0.96, 0.99/0.9792)
    assert "| stiefel:30, 8-bit codes | 107.2 | -2.0%, -2.9% | -2.5% | +2.1%, +1.1% | +1.6% |" in text
    assert "| stiefel:16 at 2.5e-4 (seed 0) | 16.2 | +1.0% | +1.0% | +5.2% | +5.2% |" in text  # one seed, named
    (root / "results/h200/wire-long-context/stiefel5-q8-context2-1.5e-4.json").unlink()
    with pytest.raises(ConfigError, match="stiefel:5, 8-bit codes"):  # a row no file holds is an error, not typed
        figures.render("wire-doc-context", root)


def _baselines_tree(root: Path, anchored=(1.62, 1.63, 1.60)) -> None:
    base = "results/h200/wire-baselines"
    specs = {"dense": ("dense@1.5e-4", "none", 1.0, 2.0, 0.1), "bf16": ("bf16@1.5e-4", "cast:dtype=bfloat16", 2.0, 1.1, 0.1),
             "quant-4": ("quant:4@1.5e-4", "quant:bits=8", 3.8, 0.7, 0.1),
             "quant-8": ("quant:8@1.5e-4", "quant:bits=4", 7.1, 0.4, 0.1),
             "delta-8": ("delta:8@1.5e-4", "delta:bits=4", 7.1, 0.4, 0.1),
             "subspace-100": ("subspace:100@1.5e-4", "none", 102.1, 0.25, 0.1),
             "anchored30": ("stiefel:30@1.5e-4", "quant:bits=8", 107.2, 0.2, 0.1),
             "control": ("stiefel:1@1.5e-4", "none", 0.9, 2.2, 0.1)}
    dense = (1.8, 1.9, 2.0)
    for seed in range(3):
        for key, (entry, codec, ratio, _, _) in specs.items():
            loss = {"dense": dense[seed], "anchored30": anchored[seed], "control": 1.5}.get(key, 1.05 * dense[seed])
            to = {"anchored30": 200 + 10 * seed, "subspace-100": None}.get(key, 300)
            _write(root, f"{base}/seed{seed}-{key}.json", _rec(seed, _run(entry, loss, loss, ratio, codec=codec, to=to),
                                                              steps=300, code="abc123456789"))
    for i, keys in enumerate((list(specs)[:6], ["anchored30"], ["control"]), 1):
        runs = [_run(specs[k][0], 4.0, 4.0, specs[k][2], bw, t, specs[k][1])
                for k in keys for bw, t in ((200.0, specs[k][3]), (None, specs[k][4]))]
        _write(root, f"{base}/time-{i}.json", _rec(0, *runs, steps=30, code="abc123456789"))
    _write(root, "results/h200/wire-best-124m.json", _rec(0, _run("dense@1.5e-4", 1.8, 1.8), steps=300))
    for s in (1, 2):
        _write(root, f"results/h200/wire-seed{s}-124m.json", _rec(s, _run("dense@1.5e-4", dense[s], 1.8), steps=300))


def test_the_baselines_table_gives_each_seed_its_gap_and_the_time_range(tmp_path):
    root = _tree(tmp_path)
    _baselines_tree(root)
    text = figures.render("wire-doc-baselines", root)
    assert "| dense, float32 | 1.0 | loss 1.8000, 1.9000, 2.0000 |" in text
    assert "| quantized, 4-bit (`quant:8`) | 7.1 | +5.0%, +5.0%, +5.0% |" in text
    # time to dense's loss: 300 steps x 2.0 s over 200..220 steps x 0.2 s
    assert ("| stiefel:30, 8-bit codes, anchors over two tokens | 107.2 | -10.0%, -14.2%, -20.0% | -20.0% to -10.0% "
            "| 200 to 220 | 0.200 s / 0.100 s | 13.6× to 15.0× |") in text
    assert "| subspace | 102.1 |" in text and "not in 300 steps in 3 seed(s)" in text
    assert "Against its control the anchored boundary is +8.0%, +8.7%, +6.7%" in text
    assert "code version `abc12345`" in text and "equals the earlier runs' to the bit" in text
    assert "(`results/h200/wire-baselines`, `results/h200/wire-best-124m.json`" in text


def test_a_missing_results_file_is_a_clear_error_naming_it(tmp_path):
    root = _tree(tmp_path)
    _baselines_tree(root)
    (root / "results/h200/wire-baselines/seed1-control.json").unlink()
    with pytest.raises(ConfigError, match="results/h200/wire-baselines/seed1-control.json"):
        figures.render("wire-doc-baselines", root)
    with pytest.raises(ConfigError, match="results/h200/wire-long-context"):
        figures.render("wire-doc-context", root)


def test_the_page_has_no_figure_outside_its_blocks():
    page = Path(__file__).resolve().parents[2] / "docs" / "wire.md"
    assert figures.stray_figures(page.read_text()) == []
