import json

from actzip_bench.report import build
from actzip_bench.wire_render import sweep_markdown


def _record(runs, compressors):
    cfg = {"stages": 2, "steps": 300, "batch_size": 32, "smooth": 0.1, "compressors": compressors}
    return {"config": cfg, "gpt": {"n_layer": 12, "n_embd": 768, "block_size": 256}, "runs": runs,
            "machine": {"gpu": "NVIDIA H200", "date": "2026-01-01"}, "command": "actzip bench wire"}


def _run(entry, name, ratio, lr, loss, val, bw=200.0):
    return {"entry": entry, "compressor": name, "ratio": ratio, "lr": lr, "final_loss": loss, "val_loss": val,
            "measured_ratio_fwd": ratio, "bandwidth_mbps": bw}


def test_the_sweep_table_shows_each_entry_at_its_best_rate_against_the_best_dense_run():
    dense = _run("dense@1e-4", "dense", 1.0, 1e-4, 2.0, 1.5)
    a = _record([dense, dense | {"bandwidth_mbps": None},  # one run per bandwidth: one row
                 _run("subspace:100@1e-4", "subspace", 100.0, 1e-4, 2.2, 1.8)], ["dense@1e-4", "subspace:100@1e-4"])
    b = _record([_run("dense@3e-4", "dense", 1.0, 3e-4, 2.5, 1.9), _run("subspace:100@3e-4", "subspace", 100.0,
                 3e-4, 2.1, 1.65), _run("subspace:100@1e-4", "subspace", 100.0, 1e-4, 2.3, 1.8)],
                ["dense@3e-4", "subspace:100@3e-4", "subspace:100@1e-4"])
    text = sweep_markdown([a, b])
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert rows["dense"] == "| dense | 1.0 | **2.0000** | 2.5000 | 0.0001 | +0.0% | +0.0% |"
    # the repeated (entry, rate) shows both runs; the best rate is 3e-4; gaps against dense at 1e-4
    assert rows["subspace:100"] == "| subspace:100 | 100.0 | 2.2000 / 2.3000 | **2.1000** | 0.0003 | +5.0% | +10.0% |"
    assert "No dense" in sweep_markdown([_record([_run("x@1e-4", "quant", 8.0, 1e-4, 2.0, None)], ["quant:8@1e-4"])])


def test_runs_with_stage_rate_factors_get_rows_of_their_own_and_the_best_dense_run_is_the_reference():
    plain = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 2.0, 1.5),
                     _run("stiefel:16@1e-4", "stiefel", 16.0, 1e-4, 2.2, 1.8)], ["dense@1e-4", "stiefel:16@1e-4"])
    scaled = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 1.6, 1.2)], ["dense@1e-4"])
    scaled["config"]["stage_lr_scale"] = [1.0, 0.3]
    rows = {line.split(" | ")[0].strip("| "): line for line in sweep_markdown([plain, scaled]).splitlines()[2:]}
    assert list(rows) == ["dense", "dense (stage rates x1, x0.3)", "stiefel:16"]
    assert rows["dense"].endswith("| +25.0% | +25.0% |") and rows["stiefel:16"].endswith("| +37.5% | +50.0% |")
    only_scaled = sweep_markdown([scaled])
    assert "No dense" not in only_scaled and "dense (stage rates x1, x0.3)" in only_scaled


def test_runs_with_boundary_options_get_rows_of_their_own():
    plain = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 2.0, 1.5),
                     _run("stiefel:1@1e-4", "stiefel", 1.0, 1e-4, 2.1, 1.6)], ["dense@1e-4", "stiefel:1@1e-4"])
    tied = _record([_run("stiefel:1@1e-4", "stiefel", 1.0, 1e-4, 2.0, 1.5)], ["stiefel:1@1e-4"])
    tied["config"]["boundary"] = "tie=true"
    rows = [line.split(" | ")[0].strip("| ") for line in sweep_markdown([plain, tied]).splitlines()[2:]]
    assert rows == ["dense", "stiefel:1", "stiefel:1 [tie=true]"]
    coded = _record([_run("stiefel:4@1e-4", "stiefel", 4.0, 1e-4, 2.0, 1.5) | {"fwd_codec": "quant:bits=8"}],
                    ["stiefel:4@1e-4"])
    assert "| stiefel:4 + quant:bits=8 |" in sweep_markdown([plain, coded])


def test_the_report_renders_a_sweep_folder(tmp_path):
    folder = tmp_path / "results" / "h200" / "wire-lr"
    folder.mkdir(parents=True)
    (folder.parent / "wire-empty").mkdir()  # a folder with no runs yet adds nothing
    rec = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 2.0, 1.5)], ["dense@1e-4"])
    (folder / "a.json").write_text(json.dumps(rec | {"note": "Copied from a table."}))
    text = build(tmp_path)
    assert "wire-lr, runs at several learning rates in one table" in text and "| dense | 1.0 | **2.0000** |" in text
    assert "Copied from a table." in text and "(../results/h200/wire-lr/a.json)" in text


def test_steps_to_a_loss_use_the_trailing_mean_of_the_recorded_points():
    from actzip_bench.wire_render import steps_to_loss

    curve = {"every": 3, "loss": [4.0, 3.0, 2.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5]}  # window: 1 point of 10
    assert steps_to_loss(curve, 1.0) == 12 and steps_to_loss(curve, 0.5) == 18 and steps_to_loss(curve, 0.1) is None
    assert steps_to_loss(curve, 2.5, window=0.2) == 9  # (3 + 2) / 2 at the third point


def test_the_gap_over_training_compares_window_means_of_the_recorded_curves():
    from actzip_bench.wire_render import gap_course, gap_course_markdown

    ref = {"every": 2, "loss": [4.0] * 10 + [2.0] * 10 + [1.0] * 20}
    run = {"every": 2, "loss": [5.0] * 10 + [3.0] * 10 + [1.1] * 20}
    # 40 points, a window of 4: means over points 6-9, 16-19, 26-29, 36-39
    assert [round(g, 6) for g in gap_course(run, ref)] == [0.25, 0.5, 0.1, 0.1]
    assert gap_course(run | {"every": 3}, ref) is None and gap_course({"every": 2, "loss": [1.0]}, ref) is None
    dense = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 1.0, 1.5)], ["dense@1e-4"]) | {
        "curves": {"dense@1e-4": ref}}
    coded = _record([_run("stiefel:4@1e-4", "stiefel", 4.0, 1e-4, 1.1, 1.6)], ["stiefel:4@1e-4"]) | {
        "curves": {"stiefel:4@1e-4": run}}
    text = gap_course_markdown([dense, coded])
    assert ("- stiefel:4 at 0.0001: +25.0% at step 20, +50.0% at step 40, +10.0% at step 60, +10.0% at step 80; "
            "does not reach the reference's final loss") in text
    faster = _record(coded["runs"], ["stiefel:4@1e-4"]) | {"curves": {"stiefel:4@1e-4": {
        "every": 2, "loss": [3.0] * 10 + [1.0] * 30}}}
    # trailing means over 4 points: the reference first reaches 1.0 at point 24 (step 48), this run at point 14
    assert "; reaches the reference's final loss at step 28 (the reference at 48)" in gap_course_markdown(
        [dense, faster])
    assert gap_course_markdown([dense, _record(coded["runs"], ["stiefel:4@1e-4"])]) == ""  # no curve, no line


def test_a_dense_plus_anchors_run_adds_gaps_against_it_in_the_table_and_over_training():
    from actzip_bench.wire_render import gap_course_markdown

    flat = {"every": 1, "loss": [2.0] * 10}
    dense = _record([_run("dense@1e-4", "dense", 1.0, 1e-4, 2.0, 2.0)], ["dense@1e-4"]) | {
        "curves": {"dense@1e-4": flat}}
    control = _record([_run("stiefel:1@1e-4", "stiefel", 1.0, 1e-4, 1.6, 1.8)], ["stiefel:1@1e-4"]) | {
        "curves": {"stiefel:1@1e-4": {"every": 1, "loss": [1.6] * 10}}}
    control["config"]["boundary"] = "anchor_rank=8,width=8,tie=true,anchor_whole=true"
    coded = _record([_run("stiefel:30@1e-4", "stiefel", 107.0, 1e-4, 1.68, 1.8)], ["stiefel:30@1e-4"]) | {
        "curves": {"stiefel:30@1e-4": {"every": 1, "loss": [1.68] * 10}}}
    coded["config"]["boundary"] = "anchor_rank=8"
    lines = sweep_markdown([dense, control, coded]).splitlines()
    assert lines[0].endswith("| vs best dense | val vs best dense | vs dense+anchors | val vs dense+anchors |")
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert rows["stiefel:107 [anchor_rank=8]"].endswith("| -16.0% | -10.0% | +5.0% | +0.0% |")
    assert rows["dense"].endswith("| +0.0% | +0.0% | +25.0% | +11.1% |")
    text = gap_course_markdown([dense, control, coded])
    head, tail = text.split("The same against the best dense-plus-anchors run:")
    assert "- stiefel:107 [anchor_rank=8] at 0.0001: -16.0% at step 2" in head
    assert "- stiefel:107 [anchor_rank=8] at 0.0001: +5.0% at step 2" in tail and "anchor_whole" not in tail
    # the option is read as the benchmark reads it, whatever its spelling
    control["config"]["boundary"] = "anchor_rank=8,width=8,tie=true,anchor_whole=True"
    respelled = sweep_markdown([dense, control, coded]).splitlines()
    assert respelled[0] == lines[0] and [ln for ln in respelled if ln.startswith("| stiefel:107")] == [
        rows["stiefel:107 [anchor_rank=8]"]]
    # without such a run the table keeps its columns
    assert "dense+anchors" not in sweep_markdown([dense, coded]) + gap_course_markdown([dense, coded])
