"""The mask-keep figure reads every keep's run and names the closest setting to dense."""

from pathlib import Path

from actzip_bench.figures_mask_keep import KEEPS, MASKED, RUNS, SPLIT_RUNS, mask_keep

ROOT = Path(__file__).resolve().parents[2]


def test_every_task_method_and_keep_has_a_cell_and_the_sources_are_cited():
    text = mask_keep(ROOT)
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "loss vs dense" not in ln]
    assert len(rows) == 2 * len(MASKED)  # two tasks
    assert all(ln.count("fewer") == len(KEEPS) for ln in rows)
    assert all(f"`{rel}`" in text for rel in (*RUNS, *SPLIT_RUNS)) and "closest to dense" in text
