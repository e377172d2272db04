"""The bench grpo figures draw from a record's rows."""

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from actzip_bench.grpo_plots import plot_throughput  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_throughput_plots_every_strategy_with_a_peak(tmp_path):
    rec = json.loads((ROOT / "results/h200/grpo-1b-1024.json").read_text())
    plot_throughput(rec, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000


def test_a_record_without_peaks_still_plots(tmp_path):
    rec = {"config": {"preset": "tiny", "prompts": 1, "group_size": 2, "completion_len": 4, "loss_type": "grpo"},
           "runs": [{"strategy": "none", "peak_bytes": None, "tokens_per_s": 10.0}]}
    plot_throughput(rec, tmp_path / "t.png")
    assert (tmp_path / "t.png").exists()
