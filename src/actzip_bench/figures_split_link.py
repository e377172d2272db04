"""docs/split.md figure of the split-learning runtime over a real shaped link (see :mod:`actzip_bench.figures`):
``bench split-link`` records, each cell's measured step beside the link model's, and its speed against the dense
bf16 wire."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load, pct, span

RUNS = ("results/cpu/split-link/one-client.json", "results/cpu/split-link/two-clients.json",
        "results/cpu/split-link/two-clients-fast-server.json")  # the last: the server's uplink ten times as fast


def split_link(root: Path) -> str:
    """Per record and cell: bytes each way, the unshaped, measured and modelled step, the model's gap and the
    speedup over the dense wire; the gaps' range for one client and for several."""
    lines = ["| clients | server Mbit/s | cell | up kB a step | up, times less than dense | down kB | unshaped ms | "
             "measured ms | model ms | model vs measured | speedup over dense |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    one, several, fast, best, c, shaping = [], [], [], None, None, None
    for rel in RUNS:
        rec = load(root, rel)
        c, shaping = rec["config"], rec.get("shaping")
        dense = next((r for r in rec["rows"] if r["cell"] == "dense"), None)
        if dense is None:
            raise ConfigError(f"figure: {rel} has no dense cell to compare with")
        server = c.get("server_mbps") or c["bandwidth_mbps"]
        for r in rec["rows"]:
            (one if c["clients"] == 1 else several if server == c["bandwidth_mbps"] else fast).append(r["model_error"])
            if c["clients"] == 1 and (best is None or r["speedup_vs_dense"] > best["speedup_vs_dense"]):
                best = r
            lines.append(f"| {c['clients']} | {server:g} | `{r['cell']}` | {r['up_bytes'] / 1e3:.1f} | "
                         f"{dense['up_bytes'] / r['up_bytes']:.1f}× | {r['down_bytes'] / 1e3:.1f} | "
                         f"{1e3 * r['unshaped_step_s']:.1f} | {1e3 * r['measured_step_s']:.1f} | "
                         f"{1e3 * r['model_step_s']:.1f} | {pct(r['model_error'])} | {r['speedup_vs_dense']:.2f}× |")
    if not one:
        raise ConfigError(f"figure: none of {', '.join(RUNS)} has one client")
    text = (f"Each client's uplink {c['bandwidth_mbps']:g} Mbit/s ({shaping}), the server's as the column says, "
            f"{c['latency_ms']:g} ms one way, "
            f"{c['batch']} samples a client step, {c['policy']} keep-ratios, the median of {c['steps']} steps after "
            f"{c['warmup']} of warm-up; bytes are the transport's metered ones, headers included. With one client "
            f"the model is {span(one)} off the measured step")
    if several:
        text += f"; with two, served in turn, {span(several)}"
    if fast:
        text += f", and with the server's uplink ten times as fast {span(fast)}"
    if several and fast:
        text += (": in these records the model holds for two clients when the server's uplink is fast, and is off "
                 "most for the largest messages when the replies share a slow one (what the replies' queue there "
                 "does to the uploads is not in the model)")
    text += (f". The fastest cell with one client, `{best['cell']}`, steps {best['speedup_vs_dense']:.2f}× as fast "
             f"as the dense bf16 wire {cite(*RUNS)}.")
    return "\n".join(lines + ["", text])


MODALSHARE = "results/cpu/split-link/modalshare.json"  # one client, ModalShare's keep-ratios


def split_link_modalshare(root: Path) -> str:
    """Per cell under ModalShare: the share of the server's work its scoring took, the measured and modelled
    step and the speedup over the dense wire."""
    rec = load(root, MODALSHARE)
    c = rec["config"]
    if c["policy"] != "modalshare":
        raise ConfigError(f"figure: {MODALSHARE} is not a ModalShare run")
    lines = ["| cell | scoring, share of the server's work | measured ms | model ms | model vs measured | "
             "speedup over dense |", "|---|---:|---:|---:|---:|---:|"]
    for r in rec["rows"]:
        lines.append(f"| `{r['cell']}` | {r['scoring_share']:.1%} | {1e3 * r['measured_step_s']:.1f} | "
                     f"{1e3 * r['model_step_s']:.1f} | {pct(r['model_error'])} | {r['speedup_vs_dense']:.2f}× |")
    shares = [r["scoring_share"] for r in rec["rows"]]
    return "\n".join(lines + ["", f"{c['clients']} client, ModalShare's Shapley scores of the batch just received "
                              f"every {c['refresh']} steps, the link and steps of the table above; the scoring's "
                              f"share is that of the unshaped run's server work (each refresh step's work over the "
                              f"median of the others): {span(shares, lambda v: f'{v:.1%}')} {cite(MODALSHARE)}."])


RENDERERS = {"split-link": split_link, "split-link-modalshare": split_link_modalshare}
