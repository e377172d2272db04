"""Where a results file came from, as one line of a report: command, machine, versions, date, link."""

from pathlib import Path

__all__ = ["provenance"]


def provenance(rec: dict, path: Path, root: Path) -> str:
    """``rec``'s command, machine, torch and Triton versions and date, with a link to ``path`` (from docs/)."""
    m = rec.get("machine", {})
    where = m.get("gpu") or m.get("host_cpu", "?")
    if m.get("gpu") and m.get("gpus", 1) > 1:
        where = f"{m['gpus']}x {where}"
    return (f"`{rec.get('command', '?')}` on {where}, torch {m.get('torch', '?')}, "
            f"Triton {m.get('triton', '?')}, {m.get('date', '?')} ([{path.name}]({Path('..') / path.relative_to(root)}))")
