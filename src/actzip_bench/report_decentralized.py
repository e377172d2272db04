"""Markdown of ``bench decentralized`` records: docs/RESULTS.md's section and docs/wire.md's figures (see
:mod:`actzip_bench.figures`)."""

from __future__ import annotations

import json
from pathlib import Path

from actzip_bench.figure_helpers import cite, pct
from actzip_bench.report_provenance import provenance

__all__ = ["RENDERERS", "decentralized_markdown", "decentralized_section"]

CPU_RUN = "results/cpu/decentralized.json"
H200_SPEED = "results/h200/decentralized-h200-speed.json"
H200_SPEED_GPIPE = "results/h200/decentralized-h200-speed-gpipe.json"


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _describe(rec: dict) -> str:
    c = rec["config"]
    seeds = len(c["seeds"])
    return (f"GPT of {c['n_layer']} blocks, width {c['n_embd']}, {c['block_size']}-token windows; {c['stages']} stages "
            f"x {c['replicas']} replicas (one process each, gloo), {c['batch_size']} sequences per replica per step in "
            f"{c['microbatches']} microbatches ({c.get('schedule', '1f1b')}); {c['pretrain_steps']} dense pretraining "
            f"steps on standard-library code, then {c['steps']} steps per task; {seeds} seed{'s' * (seeds > 1)}. "
            "Final loss: the replicas' mean training loss over the last tenth of the steps; step times from the "
            "link model replaying each run's measured schedule, with each stage's data-parallel sync before its "
            "update; `pipeline alone` leaves the sync out.")


def decentralized_markdown(rec: dict, path_note: str) -> str:
    """Per task, a table of every method: bytes per step on each axis, loss against dense, step-time ratios to
    the bf16 wire (the whole step and the pipeline axis alone) and time to dense's final loss on every link."""
    c = rec["config"]
    links = [f"{bw:g}mbps-{lat:g}ms" for bw, lat in c["links"]]
    out = [_describe(rec), ""]
    for task in c["tasks"]:
        rows = [a for a in rec["aggregate"] if a["task"] == task]
        head = ["method", "pipeline MB/step", "data-parallel MB/step", "loss vs dense (range)"]
        for name in links:
            head += [f"{name}: step vs bf16", "pipeline alone vs bf16", "time to dense's loss"]
        out += [f"**{task}**", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        dense = next(a for a in rows if a["method"] == "dense")["final_loss"]
        for a in rows:
            lo, hi = a["final_loss_range"]
            # a loss claim needs seeds: a one-seed run's loss is left out
            loss = (f"{pct(a['loss_vs_dense'])} ({pct(lo / dense - 1)} to {pct(hi / dense - 1)})" if a["seeds"] > 1
                    else "one seed: not a loss figure")
            cells = [a["method"], f"{a['pp_bytes_per_step'] / 1e6:,.3f}", f"{a['dp_bytes_per_step'] / 1e6:,.3f}", loss]
            for name in links:
                link = a["links"][name]
                t = link["time_to_target_s"]
                cells += [_x(link.get("throughput_vs_bf16")), _x(link.get("pp_throughput_vs_bf16")),
                          "not reached" if t is None else f"{t:,.1f} s"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append(path_note)
    return "\n".join(out)


def decentralized_section(path: Path, root: Path) -> str:
    rec = json.loads(path.read_text())
    return ("\n## Decentralized two-circuit training: every method on the same mesh\n\n"
            + decentralized_markdown(rec, provenance(rec, path, root)) + "\n")


def _figure(rel: str):
    def render(root: Path) -> str:
        rec = json.loads((Path(root) / rel).read_text())
        return decentralized_markdown(rec, cite(rel))
    return render


RENDERERS = {"wire-decentralized-cpu": _figure(CPU_RUN), "wire-decentralized-h200-speed": _figure(H200_SPEED),
             "wire-decentralized-h200-speed-gpipe": _figure(H200_SPEED_GPIPE)}
