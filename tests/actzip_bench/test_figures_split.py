"""The split-learning figures: read from their records; the grid's tables have every compressor and policy."""

import json
import shutil
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench.figures_split import (GRID, HELDOUT, HELDOUT_OTHERS, RUNS, SWITCH, codec_grid, heldout_ablation,
                                       heldout_on_equal_terms, modalshare, policy_grid, switch_table)

REPO = Path(__file__).resolve().parents[2]


def test_the_first_measurement_renders_from_its_records():
    assert all(f"`{rel}`" in modalshare(REPO) for rel in RUNS)


def test_the_grid_tables_render_a_row_per_record_and_the_margins(tmp_path):
    (tmp_path / GRID).mkdir(parents=True)
    for path in (REPO / GRID).glob("*.json"):
        shutil.copy(path, tmp_path / GRID / path.name)
    one = next((tmp_path / GRID).glob("random-*.json"))
    rec = json.loads(one.read_text())
    text = policy_grid(tmp_path)
    assert f"| random | {rec['config']['compression']:g}x |" in text and "ModalShare − best other" in text
    assert "| quant |" not in text  # quant is in the codec comparison only
    assert "quant" in codec_grid(tmp_path).splitlines()[0]


def test_an_empty_grid_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no records"):
        policy_grid(tmp_path)


def _grid_at_5x(root):
    """The synthetic grid's records at 5x, copied under ``root``."""
    (root / GRID).mkdir(parents=True)
    for path in (REPO / GRID).glob("*-5.json"):
        shutil.copy(path, root / GRID / path.name)


def test_modalshare_alone_with_one_setting_changed_is_set_against_its_grid_cell(tmp_path):
    _grid_at_5x(tmp_path)
    (tmp_path / HELDOUT).mkdir(parents=True)
    cell = json.loads((REPO / GRID / "topk-5.json").read_text())
    mine = {**cell, "config": {**cell["config"], "dataset": "synthetic"},
            "rows": [r for r in cell["rows"] if r["policy"] == "modalshare"],
            "mean_accuracy": {"modalshare": cell["mean_accuracy"]["modalshare"] + 0.01}}
    (tmp_path / HELDOUT / "synthetic-topk-5.json").write_text(json.dumps(mine))
    text = heldout_ablation(tmp_path)
    assert "| synthetic | topk | 5x |" in text and "| +1.0 |" in text  # one point above the grid's own ModalShare
    assert "over 1 cells" in text and f"`{HELDOUT}/`" in text
    (tmp_path / HELDOUT / "synthetic-topk-5.json").unlink()
    with pytest.raises(ConfigError, match="no records"):
        heldout_ablation(tmp_path)


def test_modalshare_held_out_is_set_against_the_other_policies_held_out(tmp_path):
    _grid_at_5x(tmp_path)
    cell = json.loads((REPO / GRID / "topk-5.json").read_text())
    config = {**cell["config"], "dataset": "synthetic"}
    acc = cell["mean_accuracy"]
    for folder, mean in ((HELDOUT, {"modalshare": 0.9}), (HELDOUT_OTHERS, {"gradient-norm": 0.95, "std": 0.5})):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "synthetic-topk-5.json").write_text(json.dumps({"config": config, "mean_accuracy": mean}))
    text = heldout_on_equal_terms(tmp_path)
    assert f"| {(0.9 - acc['equal']) * 100:+.1f} | -5.0 |" in text  # 5 points below gradient norm held out
    (tmp_path / HELDOUT / "synthetic-topk-5.json").unlink()
    with pytest.raises(ConfigError):  # ModalShare's own held-out record is needed beside the others'
        heldout_on_equal_terms(tmp_path)


def test_the_switch_table_shows_where_each_policy_moved_its_budget(tmp_path):
    (tmp_path / SWITCH).mkdir(parents=True)
    config = {"compression": 5.0, "compressor": "random", "steps": 400, "refresh": 50, "switch_step": 200,
              "seeds": [0], "policies": ["equal", "modalshare"]}
    rows = [{"policy": "equal", "accuracy": 0.5, "ratios": [0.2, 0.2, 0.2], "history": []},
            {"policy": "modalshare", "accuracy": 0.75, "ratios": [0.4, 0.05, 0.01],
             "history": [{"step": 200, "ratios": [0.1, 1.0, 0.01]}, {"step": 250, "ratios": [0.4, 0.05, 0.01]}]}]
    (tmp_path / SWITCH / "random-5.json").write_text(json.dumps({"config": config, "rows": rows}))
    text = switch_table(tmp_path)
    assert "| 5x | ModalShare | 75.0% (75.0%–75.0%) | 0.100, 1.000 | 0.400, 0.050 |" in text
    assert "| 5x | equal | 50.0% (50.0%–50.0%) | 0.200, 0.200 | 0.200, 0.200 |" in text


def test_the_uncompressed_bound_reads_one_record_a_data_set(tmp_path):
    from actzip_bench.figures_split import UNCOMPRESSED, against_uncompressed

    text = against_uncompressed(REPO)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    assert {line.split(" | ")[0][2:] for line in rows} == {"digits", "spoken-digits", "synthetic"}
    for line in rows:  # the uncompressed accuracy is its record's mean
        dataset = line.split(" | ")[0][2:]
        whole = json.loads((REPO / UNCOMPRESSED / f"{dataset}.json").read_text())["mean_accuracy"]["equal"]
        assert f"| {whole:.1%} (" in line
    assert "of 45 cells" in text
    for folder in ("split-heldout-others", "split-heldout-raised-share", "split-grid", "split-digits",
                   "split-spoken-digits"):  # everything it reads but the bound's records
        shutil.copytree(REPO / "results/cpu" / folder, tmp_path / "results/cpu" / folder)
    with pytest.raises(ConfigError, match="split-uncompressed"):  # no records of the bound: an error, not a table
        against_uncompressed(tmp_path)


def test_the_rounding_table_has_a_row_per_record_in_order_and_compares_with_the_grids(tmp_path):
    from actzip_bench.figures_split import DCT_NEAREST, dct_rounding

    text = dct_rounding(REPO)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    assert len(rows) == len(list((REPO / DCT_NEAREST).glob("*.json")))
    keys = [(line.split(" | ")[0][2:], float(line.split(" | ")[1][:-1])) for line in rows]
    assert keys == sorted(keys)  # by data set, then compression as a number
    rec = json.loads((REPO / DCT_NEAREST / "digits-dct-32.json").read_text())
    assert rec["config"]["rounding"] == "nearest" and rec["config"]["policies"] == ["equal"]
    grid = json.loads((REPO / "results/cpu/split-digits/dct-32.json").read_text())["mean_accuracy"]["equal"]
    moved = (rec["mean_accuracy"]["equal"] - grid) * 100
    assert any(line.startswith("| digits | 32x |") and f"| {moved:+.1f} |" in line for line in rows)
    (tmp_path / DCT_NEAREST).mkdir(parents=True)
    with pytest.raises(ConfigError, match="no records"):
        dct_rounding(tmp_path)


def test_the_levels_table_sets_each_fitted_record_against_nearest_and_topk(tmp_path):
    from actzip_bench.figures_split import DCT_FITTED, dct_levels

    text = dct_levels(REPO)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "%" in line]
    assert len(rows) == len(list((REPO / DCT_FITTED).glob("*.json")))
    rec = json.loads((REPO / DCT_FITTED / "digits-dct-32.json").read_text())
    assert rec["config"]["levels"] == "fitted" and rec["config"]["rounding"] == "nearest"
    topk = json.loads((REPO / "results/cpu/split-digits/topk-32.json").read_text())["mean_accuracy"]["equal"]
    lead = (rec["mean_accuracy"]["equal"] - topk) * 100
    assert any(line.startswith("| digits | 32x |") and line.endswith(f"| {lead:+.1f} |") for line in rows)
    folder = tmp_path / DCT_FITTED
    folder.mkdir(parents=True)
    with pytest.raises(ConfigError, match="no records"):
        dct_levels(tmp_path)
    rec["config"]["levels"] = "uniform"  # a record of another setting is not read as this one
    (folder / "digits-dct-32.json").write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="not fitted levels"):
        dct_levels(tmp_path)
