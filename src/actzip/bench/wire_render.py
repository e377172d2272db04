"""Pictures and tables of an ``actzip bench wire`` record: loss against bytes and time, and a rich table."""

from __future__ import annotations


def plot(record: dict, path) -> None:
    """Training loss vs bytes sent per boundary, and vs simulated time at 200 Mbps (or the last bandwidth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bws = list(record["config"]["bandwidths"])
    bw = 200.0 if 200.0 in bws else (bws[-1] if bws else None)
    key = "inf" if bw is None else f"{bw:g}"
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    for entry, c in record["curves"].items():
        run = next(r for r in record["runs"] if r["entry"] == entry and r["bandwidth_mbps"] == bw)
        label = f"{entry} ({run['bytes_per_token_fwd']:.3g}+{run['bytes_per_token_bwd']:.3g} B/tok)"
        a.plot([max(v, 1) for v in c["bytes_per_boundary"]], c["loss"], linewidth=1, label=label)
        b.plot(c["time_s"][key], c["loss"], linewidth=1, label=entry)
    for ax in (a, b):
        if record.get("target_loss") is not None:
            ax.axhline(record["target_loss"], color="k", linewidth=0.6, linestyle="--")
        ax.set_ylabel("training loss")
    a.set_xscale("log")
    a.set_xlabel("bytes sent per boundary, both ways, cumulative (headers included)")
    a.set_title("loss vs bytes")
    a.legend(fontsize=7)
    lat = record["config"]["latency_ms"]
    b.set_xlabel(f"simulated time (s), {bw:g} Mbps, {lat:g} ms links, compute measured" if bw else "time (s)")
    b.set_title("loss vs time (dashed: dense final loss)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render(record: dict):
    """A rich table of the runs."""
    from rich.table import Table

    c = record["config"]
    t = Table(title=f"{c['stages']} stages of a {record['gpt']['n_layer']}-block d={record['gpt']['n_embd']} GPT, "
                    f"{c['schedule']}, {c['steps']} steps x {c['batch_size']}x{record['gpt']['block_size']} tokens; "
                    f"links {', '.join(f'{b:g}' for b in c['bandwidths'])} Mbps, {c['latency_ms']:g} ms")
    wall = any(r.get("wall_step_time_s") is not None for r in record["runs"])
    val = any(r.get("val_loss") is not None for r in record["runs"])
    for col in ("entry", "Mbps", "B/tok fwd", "B/tok bwd", "ratio", "final loss", "vs dense", *(("val",) if val else ()),
                "step ms", "to target s", "speedup", *(("wall ms",) if wall else ())):
        t.add_column(col, justify="left" if col == "entry" else "right")
    for r in record["runs"]:
        bw = "inf" if r["bandwidth_mbps"] is None else f"{r['bandwidth_mbps']:g}"
        ttt = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        sp = "-" if r["speedup_to_target"] is None else f"{r['speedup_to_target']:.2f}x"
        gap = "" if r["loss_gap"] is None else f"{r['loss_gap']:+.2%}"
        t.add_row(r["entry"], bw, f"{r['bytes_per_token_fwd']:.1f}", f"{r['bytes_per_token_bwd']:.1f}",
                  f"{r['measured_ratio_fwd']:.1f}", f"{r['final_loss']:.4f}", gap,
                  *((f"{r['val_loss']:.4f}" if r.get("val_loss") is not None else "-",) if val else ()),
                  f"{r['step_time_s'] * 1e3:.0f}",
                  ttt, sp, *((f"{r['wall_step_time_s'] * 1e3:.0f}",) if wall else ()))
    return t
