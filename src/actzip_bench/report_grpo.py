"""docs/RESULTS.md's section for a ``bench grpo`` results file."""

import json
from pathlib import Path

from actzip_bench.grpo_compile import describe_tried
from actzip_bench.grpo_summary import summarize
from actzip_bench.report_provenance import provenance

__all__ = ["grpo_section"]


def grpo_section(path: Path, root: Path) -> str:
    rec = json.loads(path.read_text())
    c, pt = rec["config"], rec["planner_timing"]
    zero = rec.get("zero_advantage_rows")
    lines = [
        "\n## GRPO actor update: tokens/s per memory strategy\n",
        (f"{c['preset']} Llama-style policy, {c['dtype']}, {c['prompts']} groups of {c['group_size']} completions of at "
         f"most {c['completion_len']} tokens, TRL's {c['loss_type']} loss; one update = forward and backward, "
         f"strategies interleaved (median)"
         + (f"; {zero} of {rec['rows']} sequences have zero advantage (`planner` leaves them out, "
            "`planner-no-drop` keeps them)" if zero is not None else "")
         + f". Planner budget {rec['planner_budget_bytes']:,} bytes. A fresh plan for "
         f"{pt['units']} synthetic units took {pt['solve_s']:.2f} s, a cached lookup {pt['lookup_ms']:.4f} ms.\n"),
    ]
    if c.get("reward_steps"):
        lines.append(f"Reward: the {c.get('reward_preset', c['preset'])} policy after {c['sft_steps']} supervised "
                     f"steps, {c['reward_steps']} GRPO steps per strategy and seed from the same warmed policy; the "
                     f"mean reward of the last half of the steps, mean over {c['seeds']} seeds (min–max).\n")
    lines += [provenance(rec, path, root) + "\n",
              "| strategy | update ms | tokens/s | time vs none | tokens/s vs checkpoint | peak MiB | peak vs checkpoint | "
              "reward (min–max) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    summary = summarize(rec) if any(r["strategy"] == "checkpoint" for r in rec["runs"]) else None
    for r in rec["runs"]:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.1f}"
        seeds = r.get("reward_per_seed") or []
        reward = "" if r.get("reward") is None else f"{r['reward']:.3f}"
        if len(seeds) > 1:
            reward += f" ({min(seeds):.3f}–{max(seeds):.3f})"
        gain = "" if summary is None else f"{summary.gain(r, summary.checkpoint):+.1%}"
        ratio = None if summary is None else summary.peak_ratio(r)
        lines.append(f"| {r['strategy']} | {r['median_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                     f"{r['time_vs_none'] - 1:+.1%} | {gain} | {peak} | {'' if ratio is None else f'{ratio:.3f}×'} | "
                     f"{reward} |")
    for r in rec["runs"]:
        if r.get("compile_budgets"):
            lines.append(f"\n`compile` ran at activation_memory_budget {r['compile_budget']} (peaks tried: "
                         f"{describe_tried(r['compile_budgets'])}).")
        if r.get("reward_skipped"):
            lines.append(f"\n`{r['strategy']}` reward {r['reward_skipped']}.")
    for r in rec["runs"]:
        if r.get("plan_checks"):
            checks = ", ".join(f"{p / 2**20:,.1f} / {m / 2**20:,.1f}" for p, m in r["plan_checks"])
            lines.append(f"\n`{r['strategy']}` plan checked on its probe (predicted / measured MiB, with gradients): "
                         f"{checks}.")
    for s, why in rec.get("skipped", {}).items():
        lines.append(f"\n`{s}` not run: {why}")
    png = path.with_suffix(".png")
    if png.exists():
        what = "reward curves" if c.get("reward_steps") else "tokens/s against peak"
        lines.append(f"\n![{what}](../{png.relative_to(root).as_posix()})")
    return "\n".join(lines) + "\n"
