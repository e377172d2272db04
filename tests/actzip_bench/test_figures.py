"""Figures of README.md and docs/*.md are rendered from the committed results, and none is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actzip.errors import ConfigError
from actzip_bench import figures
from actzip_bench.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_every_figure_block_matches_the_committed_results():
    assert figures.stale(REPO) == [], "run `actzip report` to re-render these blocks"


def test_every_marker_names_a_renderer():
    for path in figures.marked_files(REPO):
        for b in figures.blocks(path):
            assert b.name in figures.RENDERERS, f"{path}:{b.line}: no renderer {b.name!r}"


def test_readme_and_every_docs_page_have_no_figure_outside_blocks():
    text = (REPO / "README.md").read_text()
    assert len(figures.blocks(REPO / "README.md")) >= 5
    pages = figures.marked_files(REPO)
    assert {p.name for p in pages} >= {"README.md", "memory.md", "lora.md", "wire.md", "wire-compressors.md"}
    for path in pages:
        assert figures.stray_figures(path.read_text()) == [], f"{path}: figures typed outside figure blocks"
    assert "torch==2.13.0" in text  # a version pin is prose the scan must let through


@pytest.mark.parametrize("line", ["about 42–53% less", "3.5x smaller", "107× fewer", "1.5 GiB", "12 MB", "at 200 Mbit/s",
                                  "80 Mbps", "142 ms", "+0.3% ahead", "4,015,058 B"])
def test_the_scan_finds_typed_figures(line):
    assert figures.stray_figures(f"# t\n\nSome {line} here.\n")


@pytest.mark.parametrize("line", ["`torch==2.13.0`", "torch==2.13.0 and torch>=2.5", "1. a list item", "d=4096, 124M",
                                  "0x1F and 32x256 tokens", "two seeds over 1200 steps", "`3.5x` in code",
                                  "```\n3.5x\n```", "<!-- figure: x -->3.5x<!-- /figure -->", "the 4bit preset"])
def test_the_scan_leaves_what_is_not_a_figure(line):
    assert figures.stray_figures(f"{line}\n") == []


def _tree(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "results" / "h200").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_a_hand_edited_number_is_out_of_date_and_report_renders_it_again(tmp_path, monkeypatch, capsys):
    root = _tree(tmp_path, (REPO / "README.md").read_text())
    for rel in ("results/h200", "results/h100", "results/cpu", "results/demo"):
        (root / rel).rmdir() if (root / rel).exists() else None
        (root / rel).symlink_to(REPO / rel)
    readme = root / "README.md"
    good = readme.read_text()
    assert "| 3,072 |" in good
    readme.write_text(good.replace("| 3,072 |", "| 3,027 |", 1))
    assert [s.split(": ")[1] for s in figures.stale(root)] == ["wire-baselines"]
    assert main(["report", "--root", str(root), "--check"]) == 1
    assert "README.md:" in capsys.readouterr().err and readme.read_text() != good  # --check writes nothing
    monkeypatch.setattr("actzip_bench.commands.report.write", lambda root, out: root / "docs" / "RESULTS.md")
    assert main(["report", "--root", str(root)]) == 0
    assert readme.read_text() == good
    assert main(["report", "--root", str(root), "--check"]) == 0


def test_an_unknown_renderer_is_a_clear_error(tmp_path):
    root = _tree(tmp_path, "x\n\n<!-- figure: no-such-figure -->\n<!-- /figure -->\n")
    with pytest.raises(ConfigError, match="no renderer named 'no-such-figure'.*ffn-stack"):
        figures.stale(root)
    assert main(["report", "--root", str(root), "--check"]) == 2


def test_an_unclosed_marker_is_a_clear_error(tmp_path):
    root = _tree(tmp_path, "<!-- figure: ffn-stack -->\n3.5x\n")
    with pytest.raises(ConfigError, match="without its"):
        figures.blocks(root / "README.md")


def test_a_missing_results_file_is_named(tmp_path):
    root = _tree(tmp_path, "<!-- figure: ffn-stack -->\n<!-- /figure -->\n")
    with pytest.raises(ConfigError, match="results/h200/ffn.json not found"):
        figures.stale(root)


def _ffn_record(rows: int, density: str, arena_peak: float, arena_time: float, d: int = 4096,
                relu_only: float | None = 0.8) -> dict:
    runs = [{"strategy": "none", "time_vs_none": 1.0, "peak_vs_none": 1.0, "max_grad_abs_diff": 0.0},
            {"strategy": "fused-arena", "time_vs_none": arena_time, "peak_vs_none": arena_peak,
             "max_grad_abs_diff": 0.0}]
    if relu_only is not None:
        runs.append({"strategy": "relu-only", "time_vs_none": 1.0, "peak_vs_none": relu_only,
                     "max_grad_abs_diff": 0.0})
    return {"config": {"d": d, "rows": rows, "density": density, "n_blocks": 8, "hidden_ratio": 5.25,
                       "dtype": "bfloat16"},
            "density": 0.5, "runs": runs, "machine": {"gpu": "NVIDIA H200", "date": "2026-11-29T00:00:00+00:00"}}


def _ffn_tree(root: Path, recs: list[dict]) -> None:
    (root / "results" / "h200" / "ffn.json").write_text(json.dumps(recs))


def test_a_headline_gives_its_range_over_every_size_and_names_its_file(tmp_path):
    root = _tree(tmp_path, "<!-- figure: ffn-stack -->\n<!-- /figure -->\n")
    recs = [_ffn_record(16384, "mid", 0.58, 0.999), _ffn_record(4096, "mid", 1.019, 1.011),
            _ffn_record(32768, "low", 0.41, 0.989, relu_only=0.7), _ffn_record(4096, "mid", 0.6, 2.4, d=768,
                                                                               relu_only=None)]
    _ffn_tree(root, recs)
    text = figures.render("ffn-stack", root)
    assert ("| 4096 | fused, arena | -59.0% (32k, low) to +1.9% (4k, mid) | -41.4% (32k, low) to +27.4% (4k, mid) "
            "| -1.1% (32k, low) to +1.1% (4k, mid) |") in text
    assert "| 4096 | hand-written, keeps relu(h) only | -30.0% (32k, low) to -20.0% (4k, mid) | — |" in text
    assert "4k to 32k rows" in text and "(`results/h200/ffn.json`)" in text
    assert "bit-identical to plain PyTorch's in every run" in text
    assert "| 768 | fused, arena | -40.0% | — | +140.0% |" in text  # no hand-written run at that size
    recs[0]["runs"][1]["max_grad_abs_diff"] = 1e-3
    _ffn_tree(root, recs)
    assert "gradients differ from plain PyTorch's in 1 of 7 runs" in figures.render("ffn-stack", root)


def test_an_inline_block_stays_inline(tmp_path):
    root = _tree(tmp_path, "before <!-- figure: ffn-stack -->old<!-- /figure --> after\n")
    _ffn_tree(root, [_ffn_record(4096, "mid", 0.5, 1.0)])
    with pytest.raises(ConfigError, match="several lines"):  # a table cannot sit inside a sentence
        figures.update(root)
