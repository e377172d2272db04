"""docs/split.md figure of ModalShare's keep-ratios against equal ones (see :mod:`actzip_bench.figures`): one
``actzip bench split`` record per compression."""

from __future__ import annotations

from pathlib import Path

from actzip_bench.figure_helpers import cite, load

RUNS = ("results/cpu/split-sim-5.json", "results/cpu/split-sim-10.json")


def modalshare(root: Path) -> str:
    recs = [load(root, rel) for rel in RUNS]
    lines = ["| uplink compression | equal keep-ratios | ModalShare | gain | ModalShare's ratios (image, sensor, "
             "distractor; seed 0) |", "|---:|---:|---:|---:|---|"]
    for rec in recs:
        c, m = rec["config"], rec["mean_accuracy"]
        span = {p: (min(r["accuracy"] for r in rec["rows"] if r["policy"] == p),
                    max(r["accuracy"] for r in rec["rows"] if r["policy"] == p)) for p in m}
        ratios = next(r["ratios"] for r in rec["rows"] if r["policy"] == "modalshare")
        cell = {p: f"{m[p]:.1%} ({span[p][0]:.1%} to {span[p][1]:.1%})" for p in m}
        lines.append(f"| {c['compression']:g}x | {cell['equal']} | {cell['modalshare']} | "
                     f"{(m['modalshare'] - m['equal']) * 100:+.1f} points | "
                     f"{', '.join(f'{v:.2f}' for v in ratios)} |")
    c = recs[0]["config"]
    lines += ["", f"Test accuracy, mean of {len(c['seeds'])} seeds (their range in brackets), {c['steps']} steps, "
              f"client widths {', '.join(map(str, c['widths']))} features, random-mask uplink, ModalShare refreshed "
              f"every {c['refresh']} steps with {c['explore']:g} of the equal allocation mixed in "
              f"{cite(*RUNS)}."]
    return "\n".join(lines)


RENDERERS = {"split-modalshare": modalshare}
