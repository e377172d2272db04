"""Reading committed results and writing their figures as prose: shared by the README figure renderers."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from actzip.errors import ConfigError


def load(root: Path, rel: str):
    """The JSON record at ``root/rel``; a ConfigError naming the file when it is missing or unreadable, so a
    renderer never falls back to a figure it did not read."""
    path = Path(root) / rel
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"figure: results file {rel} not found under {root}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"figure: results file {rel} is not JSON ({e})") from None


def load_folder(root: Path, rel: str) -> list[tuple[str, dict]]:
    """Every JSON record of the folder ``root/rel`` as (path relative to root, record), sorted by name."""
    folder = Path(root) / rel
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise ConfigError(f"figure: results folder {rel} has no JSON files under {root}")
    return [(f"{rel}/{p.name}", json.loads(p.read_text())) for p in paths]


def cite(*rels: str) -> str:
    """The trailing source note of a figure: every file or folder it was read from."""
    return "(" + ", ".join(f"`{r}`" for r in rels) + ")"


def pct(v: float) -> str:
    """A relative change as a signed percentage (one decimal)."""
    return f"{v:+.1%}"


def times(v: float, digits: int = 2) -> str:
    """A ratio as ``N×``."""
    return f"{v:.{digits}f}×"


def span(values, fmt=pct) -> str:
    """``values`` as one figure when they print the same, else ``lowest to highest``."""
    values = list(values)
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo} to {hi}"


def mean_range(values, fmt=pct) -> str:
    """``values`` as their mean with their range: ``+0.6% (+0.4% to +0.8%)``."""
    values = list(values)
    return f"{fmt(statistics.fmean(values))} ({fmt(min(values))} to {fmt(max(values))})"


def span_where(pairs, fmt=pct) -> str:
    """(value, where) pairs as their range, each end naming where it was measured: ``-59.0% (32k rows, low) to
    +1.9% (4k rows, mid)``."""
    pairs = sorted(pairs, key=lambda p: p[0])
    (lo, lo_at), (hi, hi_at) = pairs[0], pairs[-1]
    if fmt(lo) == fmt(hi):
        return fmt(lo)
    return f"{fmt(lo)} ({lo_at}) to {fmt(hi)} ({hi_at})"


def rows_k(rows: int) -> str:
    """A row count in thousands of 1024 (16384 -> 16k), as the benchmarks are sized."""
    return f"{rows // 1024}k" if rows % 1024 == 0 else f"{rows:,}"


def gpu(rec: dict) -> str:
    """The machine a record ran on, as it recorded it."""
    m = rec.get("machine", {})
    return m.get("gpu") or m.get("host_cpu", "an unrecorded machine")
