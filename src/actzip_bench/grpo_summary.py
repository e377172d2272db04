"""What a ``bench grpo`` record says against its targets: the planner's throughput and peak beside
checkpointing's, the best other baseline within checkpointing's peak, and the fastest at any peak."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GRPOSummary", "summarize"]


@dataclass(frozen=True)
class GRPOSummary:
    """The planner against the baselines of one record (None where a row did not run)."""

    completion_len: int  # the record's longest completion
    tokens: int  # completion tokens of the update
    checkpoint: dict  # checkpointing's row
    planner: dict | None  # the planner's row
    no_drop: dict | None  # planner-no-drop's row
    no_drop_skipped: str | None  # why planner-no-drop did not run
    fitting: dict  # the fastest baseline (checkpointing among them) whose peak is at most checkpointing's
    fastest: dict  # the fastest baseline at any peak (checkpointing among them)

    def no_drop_cell(self) -> str | None:
        """What became of planner-no-drop when it has no row: its budget fits no plan, or why it did not run."""
        if self.no_drop is not None or self.no_drop_skipped is None:
            return None
        return "no plan fits" if "smallest feasible peak" in self.no_drop_skipped else "not run"

    def gain(self, row: dict | None, over: dict | None) -> float | None:
        """``row``'s tokens/s over ``over``'s, less one."""
        if row is None or over is None:
            return None
        return row["tokens_per_s"] / over["tokens_per_s"] - 1

    def peak_ratio(self, row: dict | None) -> float | None:
        """``row``'s peak over checkpointing's."""
        if row is None or not row.get("peak_bytes") or not self.checkpoint.get("peak_bytes"):
            return None
        return row["peak_bytes"] / self.checkpoint["peak_bytes"]


def summarize(rec: dict) -> GRPOSummary:
    rows = {r["strategy"]: r for r in rec["runs"]}
    checkpoint = rows["checkpoint"]
    baselines = [r for s, r in rows.items() if not s.startswith("planner") and s != "checkpoint"]
    limit = checkpoint.get("peak_bytes")
    fitting = [r for r in baselines if limit and r.get("peak_bytes") and r["peak_bytes"] <= limit]
    fitting.append(checkpoint)
    return GRPOSummary(rec["config"]["completion_len"], rows[next(iter(rows))]["tokens"], checkpoint,
                       rows.get("planner"), rows.get("planner-no-drop"), rec.get("skipped", {}).get("planner-no-drop"),
                       max(fitting, key=lambda r: r["tokens_per_s"]),
                       max([*baselines, checkpoint], key=lambda r: r["tokens_per_s"]))
