"""summarize(record): the planner against checkpointing, the best baseline within its peak, the fastest one."""

from actzip_bench.grpo_summary import summarize


def _rec(rows, skipped=None):
    runs = [{"strategy": s, "tokens_per_s": t, "peak_bytes": p, "tokens": 100} for s, t, p in rows]
    return {"config": {"completion_len": 64}, "runs": runs, "skipped": skipped or {}}


def test_the_best_baseline_within_checkpointings_peak_and_the_fastest_at_any():
    s = summarize(_rec([("none", 30, 1000), ("checkpoint", 20, 100), ("offload", 25, 90), ("compile", 40, 180),
                        ("planner", 50, 95), ("planner-no-drop", 21, 100)]))
    assert s.fitting["strategy"] == "offload" and s.fastest["strategy"] == "compile"
    assert s.gain(s.planner, s.checkpoint) == 50 / 20 - 1 and s.peak_ratio(s.planner) == 0.95
    assert s.no_drop["tokens_per_s"] == 21 and s.no_drop_skipped is None


def test_checkpointing_is_the_best_within_its_peak_when_nothing_else_fits_and_a_skipped_plan_says_why():
    s = summarize(_rec([("none", 30, 1000), ("checkpoint", 20, 100), ("offload", 10, 90), ("planner", 50, 95)],
                       {"planner-no-drop": "no plan fits"}))
    assert s.fitting["strategy"] == "checkpoint" and s.fastest["strategy"] == "none"
    assert s.no_drop is None and s.no_drop_skipped == "no plan fits"
    assert s.no_drop_cell() == "not run"  # a reason other than the budget
    s = summarize(_rec([("checkpoint", 20, 100), ("planner", 50, 95)],
                       {"planner-no-drop": "planner: budget_bytes=1 is below the smallest feasible peak 2 bytes"}))
    assert s.no_drop_cell() == "no plan fits"
    s = summarize(_rec([("checkpoint", 20, 100), ("planner", 50, 95), ("planner-no-drop", 21, 100)]))
    assert s.no_drop_cell() is None
    assert s.gain(None, s.checkpoint) is None
