"""Tables and plots of ``actzip bench decentralized`` records."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

__all__ = ["plot", "table"]


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.3f}"


def table(record: dict, task: str) -> Table:
    """Per method on ``task``: bytes per step on each axis, final loss against dense (mean and range over seeds),
    throughput against the bf16 wire and time to dense's final loss on every link."""
    cfg = record["config"]
    rows = [a for a in record["aggregate"] if a["task"] == task]
    links = list(rows[0]["links"]) if rows else []
    t = Table(title=f"{task}: {cfg['stages']} stages x {cfg['replicas']} replicas, {cfg['steps']} steps, "
                    f"{len(cfg['seeds'])} seed(s)")
    for col in ("method", "PP MB/step", "DP MB/step", "final loss", "vs dense", "seeds range"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for name in links:
        t.add_column(f"{name} step s", justify="right")
        t.add_column("vs bf16", justify="right")
        t.add_column("to target s", justify="right")
    for a in rows:
        lo, hi = a["final_loss_range"]
        cells = [a["method"], _mb(a["pp_bytes_per_step"]), _mb(a["dp_bytes_per_step"]), f"{a['final_loss']:.4f}",
                 f"{a['loss_vs_dense']:+.2%}", f"{lo:.4f}-{hi:.4f}"]
        for name in links:
            link = a["links"][name]
            ttt = link["time_to_target_s"]
            cells += [f"{link['step_s']:.3f}", f"{link.get('throughput_vs_bf16', float('nan')):.2f}x",
                      "not reached" if ttt is None else f"{ttt:.1f}"]
        t.add_row(*cells)
    return t


def plot(record: dict, path: Path) -> None:
    """Per task: training loss against simulated time on the first link (first seed), every method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = record["config"]
    tasks = list(cfg["tasks"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.5), squeeze=False)
    seed = cfg["seeds"][0]
    for ax, task in zip(axes[0], tasks):
        for row in record["rows"]:
            if row["task"] != task or row["seed"] != seed:
                continue
            link_name, link = next(iter(row["links"].items()))
            ax.plot(link["cumulative_s"], row["losses"], label=row["method"], linewidth=1)
        ax.set_title(f"{task} (seed {seed}), {link_name}")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("training loss")
        ax.set_xscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
