"""The public-workload FFN figure: read from its results folder, every row checked, the targets set against the
public code's file."""

import json
import shutil
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench.figures_ffn_public import FOLDER, ffn_public

REPO = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    shutil.copytree(REPO / FOLDER, tmp_path / FOLDER)
    return tmp_path


def test_renders_both_densities_and_the_targets_from_the_files():
    text = ffn_public(REPO)
    assert "**mid density**" in text and "**low density**" in text and "16,000 rows" in text
    assert f"(`{FOLDER}`)" in text


def test_a_gradient_difference_is_refused(tmp_path):
    root = _tree(tmp_path)
    path = root / FOLDER / "public-mid-16000.json"
    rec = json.loads(path.read_text())
    rec["runs"][-1]["max_grad_abs_diff"] = 1e-3
    path.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="gradient differences"):
        ffn_public(root)


def test_a_run_of_the_other_harness_is_refused(tmp_path):
    root = _tree(tmp_path)
    path = root / FOLDER / "public-mid-4000.json"
    rec = json.loads(path.read_text())
    rec["config"]["harness"] = "actzip"
    path.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="not a --harness public run"):
        ffn_public(root)
