"""The ``bench grpo`` figures: reward per step when training, and tokens/s against peak per strategy."""

from __future__ import annotations

__all__ = ["plot_rewards", "plot_throughput"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_rewards(record: dict, path) -> None:
    """Reward per GRPO step, mean over seeds, one line per strategy (one PNG)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in record["runs"]:
        curves = r.get("reward_curves") or []
        if not curves or not curves[0]:
            continue
        steps = min(len(c) for c in curves)
        mean = [sum(c[i] for c in curves) / len(curves) for i in range(steps)]
        ax.plot(range(1, steps + 1), mean, label=f"{r['strategy']} ({len(curves)} seeds)", linewidth=1)
    c = record["config"]
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    policy = c.get("reward_preset", c["preset"])
    ax.set_title(f"{policy} policy, addition task ({c.get('task_digits', 2)}-digit operands), {c['loss_type']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_throughput(record: dict, path) -> None:
    """Actor-update tokens/s against the update's peak, one point per strategy, checkpointing's peak marked (one
    PNG; strategies without a peak, as on the CPU, are left out)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    runs = [r for r in record["runs"] if r.get("peak_bytes")]
    for r in runs:
        x, y = r["peak_bytes"] / 2**30, r["tokens_per_s"]
        ax.scatter([x], [y], s=36, marker="*" if r["strategy"].startswith("planner") else "o")
        ax.annotate(r["strategy"], (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    checkpoint = next((r for r in runs if r["strategy"] == "checkpoint"), None)
    if checkpoint is not None:
        ax.axvline(checkpoint["peak_bytes"] / 2**30, color="gray", linestyle="--", linewidth=1,
                   label="checkpointing's peak")
        ax.legend(loc="lower right")
    ax.set_xscale("log")
    ax.set_xlabel("update peak above resident (GiB, log)")
    ax.set_ylabel("actor-update tokens/s")
    c = record["config"]
    ax.set_title(f"{c['preset']} policy, {c['prompts']}x{c['group_size']} completions of <= {c['completion_len']} "
                 f"tokens, {c['loss_type']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
