"""docs/wire.md figure of the link model against a real shaped link (see :mod:`actzip_bench.figures`): a
``bench wire --mode netns`` record, each entry trained through two network namespaces at each bandwidth, its
measured wall-clock step beside the link model's replay of the same run's recorded schedule."""

from __future__ import annotations

import json
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, pct, span

RUN = "results/cpu/wire-netns-tbf.json"


def link_calibration(root: Path) -> str:
    """Per entry and bandwidth: measured and modelled median step time and their gap; the range of the gaps."""
    rec = json.loads((Path(root) / RUN).read_text())
    if rec.get("mode") != "netns":
        raise ConfigError(f"figure: {RUN} is not a --mode netns run")
    c = rec["config"]
    lines = ["| entry | link | measured step ms | model step ms | model vs measured |", "|---|---|---:|---:|---:|"]
    gaps = []
    for r in rec["runs"]:
        measured, model = r["step_time_s"], r["simulated_step_time_s"]
        gap = model / measured - 1
        gaps.append(gap)
        lines.append(f"| {r['entry']} | {r['bandwidth_mbps']:g} Mbps, {r['latency_ms']:g} ms | {measured * 1e3:,.1f} | "
                     f"{model * 1e3:,.1f} | {pct(gap)} |")
    worst = max(abs(g) for g in gaps)
    lines += ["", f"Over {len(gaps)} runs ({c['steps']} steps each, {c['stages']} stages) the model's median step is "
              f"{span(gaps)} off the shaped link's (at most {worst:.1%} either way) {cite(RUN)}."]
    return "\n".join(lines)


RENDERERS = {"wire-link-calibration": link_calibration}
