"""Pictures and tables of an ``actzip bench wire`` record: loss against bytes and time, and a rich table."""

from __future__ import annotations

from actzip.wire import BOUNDARIES
from actzip.wire.boundaries import parse_boundary_options
from actzip_bench.wire import first_reach

STAGE_BOUNDARIES = tuple(c for c in BOUNDARIES if c != "dense")  # built into the stages, not byte codecs


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
    for col in ("entry", "Mbps", "B/tok fwd", "B/tok bwd", "ratio", "final loss", "vs dense",
                *(("val",) if val else ()),
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


def _sweep_rows(records: list[dict]):
    """Group a sweep's runs into table rows: ``(runs, dense_rows, control_rows, best, ref, curve_of)``. ``runs``
    maps a row name to its runs by rate, ``control_rows`` names the dense-plus-anchors rows (boundary option
    ``anchor_whole`` on: the fair reference for a boundary with anchors, since the anchors help dense by
    themselves), ``best`` maps a row to its best run, ``ref`` is the best dense run of any row (None without dense)
    and ``curve_of`` maps ``id(run)`` to the run's recorded loss curve (None when the record has none)."""
    runs: dict[str, dict[float, list[dict]]] = {}
    dense_rows, control_rows = set(), set()
    curve_of: dict[int, dict | None] = {}
    for rec in records:
        seen = set()
        scale = rec["config"].get("stage_lr_scale")
        options = rec["config"].get("boundary")
        for r in rec["runs"]:
            if r["entry"] in seen:
                continue  # one row per entry and record (the runs repeat it per bandwidth)
            seen.add(r["entry"])
            curve_of[id(r)] = rec.get("curves", {}).get(r["entry"])
            name = r["compressor"] if r["compressor"] == "dense" else f"{r['compressor']}:{r['ratio']:g}"
            if scale:  # stages at their own factors of the rate: a row of their own
                name += f" (stage rates x{', x'.join(f'{f:g}' for f in scale)})"
            if options and r["compressor"] != "dense":  # boundary options (e.g. tie=true): a row of their own too
                name += f" [{options}]"
            if r.get("fwd_codec", "none") != "none" and r["compressor"] in STAGE_BOUNDARIES:  # a coded code
                name += f" + {r['fwd_codec']}"
            if r["compressor"] == "dense":
                dense_rows.add(name)
            elif parse_boundary_options(options or "").get("anchor_whole") is True:
                control_rows.add(name)
            runs.setdefault(name, {}).setdefault(r["lr"], []).append(r)
    best = {name: min((min(rs, key=lambda r: r["final_loss"]) for rs in per_lr.values()),
                      key=lambda r: r["final_loss"]) for name, per_lr in runs.items()}
    ref = _best_of(dense_rows, best)
    return runs, dense_rows, control_rows, best, ref, curve_of


def _best_of(rows, best: dict) -> dict | None:
    """The best run among ``rows``, or None without any."""
    return min((best[n] for n in rows), key=lambda r: r["final_loss"], default=None)


def _gap(run: dict, ref: dict | None, key: str) -> str:
    if ref is None or run.get(key) is None or ref.get(key) is None:
        return ""
    return f"{run[key] / ref[key] - 1:+.1%}"


def sweep_markdown(records: list[dict]) -> str:
    """A learning-rate sweep as one markdown table: each entry's training loss at every rate it ran (the
    last-10%-of-steps mean at equal tokens), its best rate in bold, and its gaps to the best dense run in training
    and validation loss. ``records`` are ``actzip bench wire`` records whose entries carry ``@lr``; a repeated
    (entry, rate) shows every run's loss, and the lowest counts. A record whose stages train at their own factors
    of the rate (``stage_lr_scale``) or with boundary options (``--boundary``) gets rows of its own; the best dense run
    of any row is the reference. With a dense-plus-anchors row (``anchor_whole=true``) two more columns give each
    row's gaps to the best such run."""
    runs, dense_rows, control_rows, best, ref, _ = _sweep_rows(records)
    if ref is None:
        return "No dense entry in the sweep: no gaps to show.\n"
    control = _best_of(control_rows, best)
    rates = sorted({lr for per_lr in runs.values() for lr in per_lr})
    extra = " vs dense+anchors | val vs dense+anchors |" if control else ""
    lines = ["| entry | fwd ratio | " + " | ".join(f"{lr:g}" for lr in rates)
             + " | best rate | vs best dense | val vs best dense |" + extra,
             "|---|---:|" + "---:|" * len(rates) + "---:|---:|---:|" + ("---:|---:|" if control else "")]
    for name, per_lr in sorted(runs.items(), key=lambda kv: (kv[0] not in dense_rows, kv[0])):
        b = best[name]
        cells = []
        for lr in rates:
            rs = per_lr.get(lr, [])
            text = " / ".join(f"{r['final_loss']:.4f}" for r in rs)
            cells.append(f"**{text}**" if rs and lr == b["lr"] else text)
        vs_control = f" {_gap(b, control, 'final_loss')} | {_gap(b, control, 'val_loss')} |" if control else ""
        lines.append(f"| {name} | {b['measured_ratio_fwd']:.1f} | " + " | ".join(cells)
                     + f" | {b['lr']:g} | {_gap(b, ref, 'final_loss')} | {_gap(b, ref, 'val_loss')} |" + vs_control)
    return "\n".join(lines) + "\n"


COURSE_POINTS = (0.25, 0.5, 0.75, 1.0)  # fractions of a run at which the report shows the gap to dense


def gap_course(curve: dict, ref: dict, fractions=COURSE_POINTS, window: float = 0.1) -> list | None:
    """Relative gaps of a recorded loss curve to a reference one at ``fractions`` of the run, each point the mean of
    the recorded losses over the ``window`` of the run before it (the final loss's window). None when the two
    curves were not recorded at the same steps."""
    loss, ref_loss = curve["loss"], ref["loss"]
    if curve["every"] != ref["every"] or len(loss) != len(ref_loss) or not loss:
        return None
    n, w = len(loss), max(1, round(window * len(loss)))
    out = []
    for f in fractions:
        end = max(1, round(f * n))
        lo = max(0, end - w)
        out.append(sum(loss[lo:end]) / sum(ref_loss[lo:end]) - 1)
    return out


def steps_to_loss(curve: dict, target: float, window: float = 0.1) -> int | None:
    """The first step at which a recorded loss curve's trailing mean (over ``window`` of the run, as the final
    loss is taken) reaches ``target``, by the benchmark's own rule (:func:`actzip_bench.wire.first_reach`); None if
    it never does. Recorded curves keep every few steps, so this is the step of the first recorded point past the
    crossing."""
    hit = first_reach(curve["loss"], max(1, round(window * len(curve["loss"]))), target)
    return None if hit is None else (hit + 1) * curve["every"]


def gap_course_markdown(records: list[dict]) -> str:
    """One line per compressed row of the sweep table: its best run's gap to the best dense run at a quarter,
    half, three quarters and the end of the run (training loss, from the recorded curves) and the step at which it
    reaches that run's final loss; then the same against the best dense-plus-anchors run, if the sweep has one.
    Empty when no row has a curve to compare."""
    runs, dense_rows, control_rows, best, ref, curve_of = _sweep_rows(records)
    control = _best_of(control_rows, best)
    text = _course_lines(runs, dense_rows, best, ref, curve_of)
    if not text:
        return ""
    text = ("The gap over training (training loss, each point the mean over the tenth of the run before it, from "
            "the recorded curves, which keep every few steps, so the last point can differ a little from the "
            "table), and the first step at which that mean reaches the reference's final loss (the time target's "
            "measure, in steps):\n\n" + text)
    against_control = _course_lines(runs, dense_rows, best, control, curve_of, skip=control_rows.__contains__)
    if against_control:
        text += "\nThe same against the best dense-plus-anchors run:\n\n" + against_control
    return text


def _course_lines(runs, dense_rows, best, ref, curve_of, skip=lambda name: False) -> str:
    """Markdown bullets of each compressed row's gap course to ``ref``, rows named by ``skip`` left out (empty
    without curves to compare)."""
    ref_curve = curve_of.get(id(ref)) if ref is not None else None
    if ref_curve is None:
        return ""
    lines = []
    for name in sorted(n for n in runs if n not in dense_rows and not skip(n)):
        b = best[name]
        course = gap_course(curve_of[id(b)], ref_curve) if curve_of.get(id(b)) else None
        if course is None:
            continue
        steps = len(ref_curve["loss"]) * ref_curve["every"]
        points = ", ".join(f"{g:+.1%} at step {round(f * steps)}" for f, g in zip(COURSE_POINTS, course))
        # the reference's own final loss is its last window's mean over every step; its recorded points may miss
        # it by a hair, and then it reaches it at its end
        hit, ref_hit = steps_to_loss(curve_of[id(b)], ref["final_loss"]), steps_to_loss(ref_curve, ref["final_loss"])
        reach = (f"; reaches the reference's final loss at step {hit} (the reference at {ref_hit or steps})"
                 if hit is not None else "; does not reach the reference's final loss")
        lines.append(f"- {name} at {b['lr']:g}: {points}{reach}")
    return "\n".join(lines) + "\n" if lines else ""
