"""The one-liner's whole-model figure: read from its results files, every gradient check honoured."""

import json
import shutil
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench.figures_one_liner import GPT_RUNS, HYBRID_RUNS, KERNEL_RUN, KERNEL_RUNS_BEFORE, one_liner

REPO = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path) -> Path:
    for rel in (*GPT_RUNS, *HYBRID_RUNS):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    return tmp_path


def test_renders_both_models_from_the_files():
    text = one_liner(REPO)
    assert "`compress_(model, SparseMLPConfig())`" in text and "Nemotron-H-style hybrid" in text
    assert all(f"`{rel}`" in text for rel in (*GPT_RUNS, *HYBRID_RUNS, KERNEL_RUN, *KERNEL_RUNS_BEFORE))


def test_a_gradient_change_where_plain_pytorch_repeats_itself_is_refused(tmp_path):
    root = _tree(tmp_path)
    path = root / HYBRID_RUNS[0]
    rec = json.loads(path.read_text())
    assert next(r for r in rec["runs"] if r["strategy"] == "none")["max_grad_abs_diff"] == 0
    next(r for r in rec["runs"] if r["strategy"] == "compress")["max_grad_abs_diff"] = 1e-3
    path.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="changes the gradients"):
        one_liner(root)


def test_a_run_without_a_gradient_check_is_refused(tmp_path):
    root = _tree(tmp_path)
    path = root / GPT_RUNS[1]
    rec = json.loads(path.read_text())
    for r in rec["runs"]:
        r.pop("max_grad_abs_diff")
    path.write_text(json.dumps(rec))
    with pytest.raises(ConfigError, match="no gradient check"):
        one_liner(root)
