"""docs/planner.md figure of the GRPO actor update on the H200 (see :mod:`actzip_bench.figures`): per
completion length, the planner's tokens/s and peak against checkpointing, the best other baseline within
checkpointing's peak and the fastest one at any peak."""

from __future__ import annotations

from pathlib import Path

from actzip_bench.figure_helpers import cite, load, pct, span, times
from actzip_bench.grpo_summary import summarize

RUNS = ("results/h200/grpo-1b-1024.json", "results/h200/grpo-1b-2048.json")


def grpo_h200(root: Path) -> str:
    lines = ["| completions (tokens) | checkpoint tokens/s | planner tokens/s | planner vs checkpoint | "
             "planner peak vs checkpoint's | best baseline within that peak | fastest baseline (its peak vs checkpoint's) | planner vs "
             "fastest | plan alone (zero-advantage sequences kept) |",
             "|---|---:|---:|---:|---:|---|---|---:|---:|"]
    gains, over_fastest, misses = [], [], []
    for rel in RUNS:
        s = summarize(load(root, rel))
        gain, vs_fast = s.gain(s.planner, s.checkpoint), s.gain(s.planner, s.fastest)
        gains.append(gain)
        checks = s.planner.get("plan_checks") or []
        if checks:
            misses.append(checks[0][1] / checks[0][0] - 1)
        over_fastest.append(vs_fast)
        alone = pct(s.gain(s.no_drop, s.checkpoint)) if s.no_drop else (s.no_drop_cell() or "not run")
        lines.append(
            f"| ≤ {s.completion_len} ({s.tokens:,}) | {s.checkpoint['tokens_per_s']:,.0f} | "
            f"{s.planner['tokens_per_s']:,.0f} | {pct(gain)} | {times(s.peak_ratio(s.planner))} | "
            f"{s.fitting['strategy']} ({pct(s.gain(s.fitting, s.checkpoint))}) | {s.fastest['strategy']} "
            f"({times(s.peak_ratio(s.fastest))}) | {pct(vs_fast)} | {alone} |")
    lines += ["", f"Over both lengths the planner's update is {span(gains)} faster than checkpointing's at no more "
              f"than its peak, and {span(over_fastest)} faster than the fastest baseline at any peak {cite(*RUNS)}."]
    if misses:
        lines[-1] += (f" The planner's first plan measured {span(misses)} off its predicted peak on the probe step "
                      "(the check counted the excess in its base and solved again).")
    return "\n".join(lines)


RENDERERS = {"grpo-h200": grpo_h200}
