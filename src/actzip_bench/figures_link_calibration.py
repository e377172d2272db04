"""docs/wire.md figure of the link model against a real shaped link (see :mod:`actzip_bench.figures`): a
``bench wire --mode netns`` record, each entry trained through two network namespaces at each bandwidth, its
measured wall-clock step beside the link model's replay of the same run's recorded schedule."""

from __future__ import annotations

import json
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, pct, span

RUN = "results/cpu/wire-netns-tbf.json"
RERUNS = "results/cpu/wire-netns-tbf-reruns"  # the same command run again, three times on an idle machine


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


def link_calibration_reruns(root: Path) -> str:
    """The same protocol run again (each record as it came): the gap per entry and bandwidth in every run, and
    the range over all of them."""
    paths = sorted((Path(root) / RERUNS).glob("run-*.json"))
    if not paths:
        raise ConfigError(f"figure: no records under {RERUNS}")
    recs = [json.loads(p.read_text()) for p in paths]
    names = [p.stem for p in paths]
    lines = ["| entry | link | " + " | ".join(f"{n}: model vs measured" for n in names) + " |",
             "|---|---|" + "---:|" * len(names)]
    gaps: dict[tuple, list[float]] = {}
    for rec in recs:
        for r in rec["runs"]:
            key = (r["entry"], r["bandwidth_mbps"], r["latency_ms"])
            gaps.setdefault(key, []).append(r["simulated_step_time_s"] / r["step_time_s"] - 1)
    for (entry, bw, lat), g in gaps.items():
        lines.append(f"| {entry} | {bw:g} Mbps, {lat:g} ms | " + " | ".join(pct(x) for x in g) + " |")
    every = [x for g in gaps.values() for x in g]
    lines += ["", f"Over {len(recs)} runs of the same command ({len(every)} entries in all) the model's median step is "
              f"{span(every)} off the shaped link's (at most {max(abs(x) for x in every):.1%} either way) "
              f"{cite(RERUNS)}."]
    return "\n".join(lines)


RENDERERS = {"wire-link-calibration": link_calibration, "wire-link-calibration-reruns": link_calibration_reruns}
