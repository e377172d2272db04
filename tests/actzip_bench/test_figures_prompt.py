"""docs/prompt.md's figures and RESULTS section, rendered from the committed records."""

from pathlib import Path

from actzip_bench.figures_prompt import RENDERERS, plot_accuracy, prompt_section

ROOT = Path(__file__).resolve().parents[2]


def test_the_figures_render_the_merged_record():
    table = RENDERERS["prompt-accuracy"](ROOT)
    assert table.splitlines()[0].startswith("| method | prompt positions | seen |")
    assert "| prompt vector | 1.0 |" in table and "(target: within 1)" in table
    sweep = RENDERERS["prompt-sweep"](ROOT)
    assert sweep.splitlines()[0].startswith("| L_e \\ L_i | 0 | 1 | 2 |")
    cost = RENDERERS["prompt-cost"](ROOT)
    assert "fewer prefill FLOPs" in cost and "fitted alone" in cost


def test_a_cut_sweep_says_which_split_it_left_out():
    assert "left out" in RENDERERS["prompt-sweep"](ROOT)  # the committed sweep reached its time limit


def test_results_section_and_plot(tmp_path):
    section = prompt_section(ROOT / "results/cpu/prompt-quick.json", ROOT)
    assert section.startswith("\n## Prompt vectors") and "| full prompt |" in section
    assert prompt_section(ROOT / "results/h200/prompt/sweep.json", ROOT) == ""  # a sweep alone has no table
    import json

    plot_accuracy(json.loads((ROOT / "results/h200/prompt.json").read_text()), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
