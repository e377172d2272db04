"""Figures of docs/wire.md rendered from committed results and naming them (see :mod:`actzip_bench.figures`).

Gaps are training-loss gaps at equal tokens (``loss / reference - 1``); ``val`` is the held-out loss. Records
without ``machine.code_version`` ran code older than the current layout: every table of them says so, with the
dates its records carry and how many seeds it rests on.
"""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load, load_folder, pct, span, times

QUICK = "results/cpu/wire-quick.json"
NCCL = ("results/h200x2/wire-nccl.json", "results/h200x2/wire-nccl-2.json", "results/h200x2/wire-nccl-3.json")
NO_TF32, TF32 = "results/h200/wire-anchors-124m.json", "results/h200/wire-best-124m.json"
BASE = "results/h200/wire-baselines"
BASE_ROWS = (("dense", "dense, float32"), ("bf16", "dense, bf16"), ("quant-4", "quantized"),
             ("quant-8", "quantized"), ("delta-8", "AQ-SGD delta"), ("subspace-100", "subspace"),
             ("anchored30", "stiefel:30, 8-bit codes, anchors over two tokens"),
             ("control", "dense plus the same anchors (the control)"))
LR = "results/h200/wire-lr"
BEST = "results/h200/wire-best-124m.json"
SEEDS = ("results/h200/wire-seed1-124m.json", "results/h200/wire-seed2-124m.json")
LONG, LONG_MORE = "results/h200/wire-long-124m.json", "results/h200/wire-long-124m-more.json"
STAGE, LONG_STAGE, VSTEP = "results/h200/wire-stage-lr", "results/h200/wire-long-stage-lr", "results/h200/wire-vstep"
BITS_CPU = tuple(f"results/cpu/wire-small-fresh-code-bits{s}" for s in ("", "-seed1", "-seed2"))
BITS = ("results/h200/wire-long-code-bits", "results/h200/wire-longer-code-bits", "results/h200/wire-longest-code-bits")
CTX_CPU = ("results/cpu/wire-small-anchor-context", *(f"results/cpu/wire-small-anchor-context-seed{s}" for s in range(1, 5)))
CPU_2400 = "results/cpu/wire-small-2400"
CTX = ("results/h200/wire-long-context", "results/h200/wire-long-context-seed1")


def _run(root: Path, rel: str, entry: str | None = None, bandwidth=None, any_bw=True) -> tuple[dict, dict]:
    """(record, run) of ``entry`` (the first run when None) in the file ``rel``; a ConfigError naming both when the
    file lacks it."""
    rec = load(root, rel)
    runs = [r for r in rec["runs"] if (entry is None or r["entry"] == entry)
            and (any_bw or r["bandwidth_mbps"] == bandwidth)]
    if not runs:
        raise ConfigError(f"figure: results file {rel} has no run {entry!r}")
    return rec, runs[0]


def _gap(a: dict, b: dict, key="final_loss") -> float:
    return a[key] / b[key] - 1


def _older(recs) -> str:
    """How many seeds the records hold, when they ran and whether with the current code."""
    seeds = sorted({r["config"]["seed"] for r in recs})
    dates = sorted({r["machine"]["date"][:10] for r in recs})
    n = "one seed" if len(seeds) == 1 else f"{len(seeds)} seeds ({', '.join(map(str, seeds))})"
    old = [r for r in recs if not r["machine"].get("code_version")]
    code = ("older code than the current (no code version recorded)" if len(old) == len(recs)
            else f"older code in {len(old)} of {len(recs)} records" if old else "the current code")
    return f"{n}; run {' and '.join(dates)} with {code}"


def _label(run: dict) -> str:
    codec = run.get("fwd_codec", "none")
    bits = f" ({codec.split('bits=')[1]} bit)" if "bits=" in codec else ""
    return f"{run['entry'].split('@')[0]}{bits}"


def _to(run: dict, dense: dict | None = None) -> str:
    """Time to dense's loss, and how many times sooner than ``dense`` (the record's own speedup without it)."""
    t = run.get("time_to_target_s")
    if t is None:
        return f"not in {run['steps_run']} steps"
    x = dense["time_to_target_s"] / t if dense else run["speedup_to_target"]
    return f"{t:.1f} s ({times(x)})" if t < 100 else f"{t:.0f} s ({times(x)})"


def wire_doc_tf32(root: Path) -> str:
    """One line: the 124M GPT's dense step without a link, float32 matmuls against TF32."""
    a = _run(root, NO_TF32, "dense", None, False)[1]
    b = _run(root, TF32, "dense@1.5e-4", None, False)[1]
    return (f"{a['step_time_s'] * 1e3:.0f} ms to {b['step_time_s'] * 1e3:.0f} ms per dense step of the 124M GPT "
            f"without a link {cite(NO_TF32, TF32)}")


def wire_doc_quick(root: Path) -> str:
    """The quick CPU benchmark: bytes, ratio, loss gap, step times and time to dense's loss per entry, and what
    dense's transfer costs against latency and compute."""
    rec = load(root, QUICK)
    c, g, m = rec["config"], rec["gpt"], rec["machine"]
    at = {(r["entry"], r["bandwidth_mbps"]): r for r in rec["runs"]}
    lines = [f"CPU ({m['cores']}-core {m['host_cpu']}, {m['date'][:10]}, one seed; `{rec['command']}`): "
             f"{c['stages']} stages of a {g['n_layer']}-block d={g['n_embd']} GPT, {c['steps']} steps of "
             f"{c['batch_size']}x{c['block_size']} tokens, {c['schedule']}, {c['microbatches']} microbatches, "
             f"{c['latency_ms']:g} ms links, AdamW at {c['lr']:g}; other jobs loaded the machine, so compute times "
             f"are noisy. Time to target is the time to dense's final loss ({rec['target_loss']:.3f}); the speedup "
             "is dense's time over the entry's, at the same bandwidth:", "",
             "| entry | B/token fwd | B/token bwd | fwd ratio | loss vs dense | step, 80 / 200 Mbps | "
             "to target, 80 Mbps | to target, 200 Mbps |", "|---|---|---|---|---|---|---|---|"]
    for entry in c["compressors"]:
        r80, r200 = at[(entry, 80.0)], at[(entry, 200.0)]
        loss = f"{r80['final_loss']:.3f}" if entry == "dense" else pct(r80["loss_gap"])
        lines.append(f"| {_label(r80)} | {r80['bytes_per_token_fwd']:.1f} | {r80['bytes_per_token_bwd']:.1f} | "
                     f"{r80['measured_ratio_fwd']:.1f} | {loss} | {r80['step_time_s'] * 1e3:.0f} / "
                     f"{r200['step_time_s'] * 1e3:.0f} ms | {_to(r80)} | {_to(r200)} |")
    d = at[("dense", 80.0)]
    per_step = d["bytes_per_token_fwd"] * c["batch_size"] * c["block_size"]
    lines += ["", f"Dense sends {per_step / 1e6:.2f} MB per step each way: {8 * per_step / 200e6 * 1e3:.0f} ms at "
              f"200 Mbps ({8 * per_step / 80e6 * 1e3:.0f} ms at 80), against the link's {c['latency_ms']:g} ms "
              f"latency each way and {at[('dense', None)]['step_time_s'] * 1e3:.0f} ms of compute per step "
              f"{cite(QUICK)}."]
    return "\n".join(lines)


def wire_doc_nccl(root: Path) -> str:
    """Two H200s, one process per stage over NCCL: bytes, loss gap, measured wall step and time to dense's loss
    over each link, and what dense's transfer costs against compute."""
    recs = [load(root, rel) for rel in NCCL]
    runs, order = {}, []
    for rec in recs:
        for r in rec["runs"]:
            runs.setdefault((r["entry"], r["bandwidth_mbps"]), r)
            order += [r["entry"]] if r["entry"] not in order else []
    c, m = recs[0]["config"], recs[0]["machine"]
    dense = runs[("dense", None)]
    dense_losses = {rec["target_loss"] for rec in recs}
    lines = [f"2 {gpu(recs[0])}s of one host ({m['kind'].split('(')[1].split(')')[0]}), the 124M reference GPT in "
             f"{c['stages']} stages, {c['batch_size']}x{c['block_size']} tokens per step in {c['microbatches']} "
             f"microbatches, {c['schedule']}, {c['steps']} steps (on up to {int(c['steps'] * c['target_steps'])} "
             f"towards dense's loss), AdamW at {c['lr']:g}, links of 80 and 200 Mbps with {c['latency_ms']:g} ms "
             f"latency and none; {_older(recs)}. Dense's loss is "
             f"{'the same in all three runs' if len(dense_losses) == 1 else 'not the same in the three runs'}:", "",
             "| entry | B/token fwd / bwd | loss vs dense at 300 steps | wall step (NCCL), vs dense | "
             "to dense's loss at 80 Mbps | at 200 Mbps | no link limit |", "|---|---|---|---|---|---|---|"]
    for entry in order:
        r = runs[(entry, None)]
        if entry == "dense":
            loss, wall = f"{r['final_loss']:.4f}", f"{r['wall_step_time_s'] * 1e3:.0f} ms"
        else:
            reach = (f"dense's loss at step {r['steps_to_target']}" if r["steps_to_target"]
                     else f"not in {r['steps_run']} steps")
            loss = f"{pct(r['loss_gap'])} ({reach})"
            wall = f"{r['wall_step_time_s'] * 1e3:.0f} ms ({pct(_gap(r, dense, 'wall_step_time_s'))})"
        cells = [_to(runs[(entry, bw)]).replace(f"not in {r['steps_run']} steps", "not reached")
                 if entry != "dense" else f"{runs[(entry, bw)]['time_to_target_s']:.0f} s" for bw in (80.0, 200.0, None)]
        lines.append(f"| {_label(r)} | {r['bytes_per_token_fwd']:.0f} / {r['bytes_per_token_bwd']:.0f} | {loss} | "
                     f"{wall} | {' | '.join(cells)} |")
    per_step = dense["bytes_per_token_fwd"] * c["batch_size"] * c["block_size"]
    lines += ["", f"Dense moves {per_step / 1e6:.1f} MB per boundary each way per step: "
              f"{runs[('dense', 80.0)]['step_time_s']:.2f} s a step at 80 Mbps against "
              f"{dense['step_time_s'] * 1e3:.0f} ms of compute {cite(*NCCL)}."]
    return "\n".join(lines)


def wire_doc_baselines(root: Path) -> str:
    """The 3-seed comparison with the baselines a user would pick: per entry its forward ratio, its loss gap to
    dense per seed, steps to dense's loss, step times measured alone, and the time to dense's loss they give."""
    files = dict(load_folder(root, BASE))
    alone = [r for i in (1, 2, 3) for r in load(root, f"{BASE}/time-{i}.json")["runs"]]
    seeds = sorted({int(p.split("/seed")[1].split("-")[0]) for p in files if "/seed" in p})
    rec_of = {}
    for key, _ in BASE_ROWS:
        for s in seeds:
            rel = f"{BASE}/seed{s}-{key}.json"
            if rel not in files:
                raise ConfigError(f"figure: results file {rel} not found under {root}")
            rec_of[key, s] = files[rel]
    run = {k: rec["runs"][0] for k, rec in rec_of.items()}
    times_of = {}
    for key, _ in BASE_ROWS:
        r = run[key, seeds[0]]
        times_of[key] = {x["bandwidth_mbps"]: x["step_time_s"] for x in alone
                         if (x["entry"], x.get("fwd_codec")) == (r["entry"], r.get("fwd_codec"))}
        if set(times_of[key]) != {200.0, None}:
            raise ConfigError(f"figure: {BASE}/time-*.json lack {r['entry']}'s step times alone")
    c0 = rec_of["dense", seeds[0]]["config"]
    dense_t = c0["steps"] * times_of["dense"][200.0]
    lines = ["| entry | fwd ratio | loss vs dense, seeds " + ", ".join(map(str, seeds)) + " | val vs dense | steps to "
             "dense's loss | step alone, 200 Mbit/s / no link | time to dense's loss at 200 Mbit/s, vs dense |",
             "|---|---:|---|---|---|---|---|"]
    for key, name in BASE_ROWS:
        rs = [run[key, s] for s in seeds]
        ds = [run["dense", s] for s in seeds]
        codec = rs[0].get("fwd_codec") or "none"
        label = (f"{name}, {codec.split('bits=')[1]}-bit (`{rs[0]['entry'].split('@')[0]}`)"
                 if key.startswith(("quant", "delta")) else name)
        gaps = "" if key == "dense" else ", ".join(pct(_gap(r, d)) for r, d in zip(rs, ds))
        if key == "dense":
            gaps = "loss " + ", ".join(f"{r['final_loss']:.4f}" for r in rs)
        val = "" if key == "dense" else span(_gap(r, d, "val_loss") for r, d in zip(rs, ds))
        reached = [r["steps_to_target"] for r in rs]
        steps = (span(reached, str) if None not in reached
                 else f"not in {rs[0]['steps_run']} steps in {reached.count(None)} seed(s)")
        t = times_of[key]
        est = "" if None in reached else span((dense_t / (n * t[200.0]) for n in reached), lambda v: times(v, 1))
        lines.append(f"| {label} | {rs[0]['measured_ratio_fwd']:.1f} | {gaps} | {val} | {steps} | "
                     f"{t[200.0]:.3f} s / {t[None]:.3f} s | {est} |")
    q8 = [_gap(run["anchored30", s], run["control", s]) for s in seeds]
    q8v = [_gap(run["anchored30", s], run["control", s], "val_loss") for s in seeds]
    old = [load(root, BEST)] + [load(root, rel) for rel in SEEDS]
    old_dense = sorted(r["final_loss"] for rec in old for r in rec["runs"] if r["entry"] == "dense@1.5e-4")
    new_dense = sorted(run["dense", s]["final_loss"] for s in seeds)
    same = "equals the earlier runs' to the bit" if sorted(set(old_dense)) == new_dense else "differs from the earlier runs'"
    m = rec_of["dense", seeds[0]]["machine"]
    return "\n".join(lines + [
        "", f"Against its control the anchored boundary is {', '.join(pct(g) for g in q8)} (validation "
        f"{span(q8v)}). Every entry at {_rate(run['dense', seeds[0]])}, {c0['steps']} steps of "
        f"{c0['batch_size']}x{c0['block_size']} tokens, {len(seeds)} seeds, one entry per run on an {gpu(rec_of['dense', seeds[0]])} "
        f"(code version `{m.get('code_version', 'unrecorded')[:8]}`, {m['date'][:10]}); the seed runs shared the GPU, so "
        f"step times come from {c0['stages']}-stage runs of {load(root, BASE + '/time-1.json')['config']['steps']} steps "
        "with one run at a time, and the time to dense's loss is the steps to it times that step time (the "
        f"arithmetic of two measurements, not one run). Dense's loss in each seed {same} {cite(BASE, BEST, *SEEDS)}."])


def _rate(run: dict) -> str:
    return run["entry"].split("@", 1)[1] if "@" in run["entry"] else f"{run['lr']:g}"


def _sweep(root: Path):
    recs = [rec for rel, rec in load_folder(root, LR) if "/wire-lr" in rel]
    runs = {}
    for rec in recs:
        for r in rec["runs"]:
            runs.setdefault(r["entry"], r)
    return recs, runs


def wire_doc_lr(root: Path) -> str:
    """The learning-rate sweep on the 124M GPT at 300 steps: each entry's best rate, its loss and gaps to the best
    dense run, the rates tried, and how far reruns of the same entry and rate moved."""
    recs, runs = _sweep(root)
    by = {}
    for r in runs.values():
        by.setdefault(r["entry"].split("@")[0], []).append(r)
    best_dense = min(by["dense"], key=lambda r: r["final_loss"])
    lines = [f"AdamW per entry at {len(runs)} (entry, rate) pairs, {_older(recs)}:", "",
             "| entry | fwd ratio | best rate | loss | vs best dense | val vs best dense | rates tried |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name in ("dense", "subspace:100", "stiefel:16", "stiefel-rvq:100", "bottleneck:100"):
        rs = sorted(by[name], key=lambda r: r["lr"])
        b = min(rs, key=lambda r: r["final_loss"])
        gaps = ("", "") if name == "dense" else (pct(_gap(b, best_dense)), pct(_gap(b, best_dense, "val_loss")))
        lines.append(f"| {name} | {b['measured_ratio_fwd']:.0f} | {_rate(b)} | {b['final_loss']:.4f} | {gaps[0]} | "
                     f"{gaps[1]} | {_rate(rs[0])} to {_rate(rs[-1])} ({len(rs)}) |")
    best = load(root, BEST)
    moved = [abs(_gap(r, runs[r["entry"]])) for r in best["runs"] if r["entry"] in runs and r["compressor"] != "dense"]
    same_dense = _run(root, BEST, "dense@1.5e-4")[1]["final_loss"] == runs["dense@1.5e-4"]["final_loss"]
    return "\n".join(lines + ["", f"Dense at 1e-3 is {pct(_gap(runs['dense@1e-3'], best_dense))} above dense at its best "
                              f"rate {cite(LR)}. Rerun alone at the same rate, dense repeats "
                              f"{'to the bit' if same_dense else 'differently'} and the learned boundaries moved by up to "
                              f"{max(moved):.1%} {cite(BEST)}."])


def wire_doc_best(root: Path) -> str:
    """Dense and the learned boundaries at 1.5e-4, one run at a time: loss, steps and time to dense's loss over
    80 and 200 Mbit/s links and without one."""
    rec = load(root, BEST)
    at = {(r["entry"], r["bandwidth_mbps"]): r for r in rec["runs"]}
    d = at["dense@1.5e-4", None]
    lines = [f"Time to the best dense run's final loss ({rec['target_loss']:.4f}), simulated from each run's measured "
             f"compute; {_older([rec])} {cite(BEST)}:", "",
             "| entry | fwd / bwd ratio | loss at 300 steps | steps to dense's loss | to target, 80 Mbps | "
             "to target, 200 Mbps | no link limit |", "|---|---|---:|---:|---:|---:|---:|"]
    for entry in rec["config"]["compressors"]:
        r = at[entry, None]
        loss = f"{r['final_loss']:.4f}" if r["compressor"] == "dense" else pct(r["loss_gap"])
        cells = [f"{at[entry, bw]['time_to_target_s']:.0f} s" if r["compressor"] == "dense" else _to(at[entry, bw])
                 for bw in (80.0, 200.0, None)]
        lines.append(f"| {entry.split('@')[0]} | {r['measured_ratio_fwd']:.0f} / "
                     f"{d['bytes_per_token_bwd'] / r['bytes_per_token_bwd']:.0f} | {loss} | {r['steps_to_target']} | "
                     f"{' | '.join(cells)} |")
    return "\n".join(lines)


def wire_doc_seeds(root: Path) -> str:
    """Seeds 1 and 2 of the sweep's best rates beside seed 0, and stiefel at 4x and 8x at stiefel:16's best rate."""
    recs, runs = _sweep(root)
    seeds = [load(root, rel) for rel in SEEDS]
    rows = ("dense@1.5e-4", "subspace:100@1e-4", "stiefel:16@7e-5")
    lines = [f"{_older(recs + seeds)} {cite(LR, *SEEDS)}:", "", "| entry | seed 0 (sweep) | seed 1 | seed 2 | mean gap |",
             "|---|---:|---:|---:|---:|"]
    for entry in rows:
        per = [runs[entry]] + [_run(root, rel, entry)[1] for rel in SEEDS]
        dense = [runs["dense@1.5e-4"]] + [_run(root, rel, "dense@1.5e-4")[1] for rel in SEEDS]
        if entry.startswith("dense"):
            lines.append(f"| {entry} | " + " | ".join(f"{r['final_loss']:.4f}" for r in per) + " | |")
            continue
        g = [_gap(r, dd) for r, dd in zip(per, dense)]
        lines.append(f"| {entry} | " + " | ".join(pct(x) for x in g) + f" | {pct(sum(g) / len(g))} |")
    ratios = [_run(root, f"{LR}/wire-ratios-{k}.json")[1] for k in (4, 8)] + [runs["stiefel:16@7e-5"]]
    d7 = runs["dense@7e-5"]
    return "\n".join(lines + [
        "", "Stiefel at lower ratios at stiefel:16's best rate, against the best dense run: " +
        ", ".join(f"{r['entry'].split('@')[0]} {pct(_gap(r, runs['dense@1.5e-4']))}" for r in ratios) +
        f"; against dense at the same rate ({d7['final_loss']:.4f}): " +
        ", ".join(f"{r['entry'].split('@')[0]} {pct(_gap(r, d7))}" for r in (ratios[0], ratios[2])) +
        f"; at 1.5e-4 stiefel:16 is {pct(_gap(runs['stiefel:16@1.5e-4'], runs['dense@1.5e-4']))} behind dense at "
        f"1.5e-4 {cite(f'{LR}/wire-ratios-4.json', f'{LR}/wire-ratios-8.json', LR)}."])


def _table(rows, head: str) -> list[str]:
    """Rows of (label, run, reference run, extra cells) as a gap table."""
    lines = [head, "|---|---:|---:|---:|---:|" + "---:|" * len(rows[0][3])]
    for label, r, ref, extra in rows:
        gaps = ("", "") if r is ref else (pct(_gap(r, ref)), pct(_gap(r, ref, "val_loss")))
        lines.append(f"| {label} | {r['measured_ratio_fwd']:.0f} | {r['final_loss']:.4f} | {gaps[0]} | {gaps[1]} | "
                     + " | ".join(extra) + " |")
    return lines


def wire_doc_long(root: Path) -> str:
    """1200 fresh-window steps on the 124M GPT: loss and gaps to dense, steps and time to dense's loss."""
    rec, d = _run(root, LONG, "dense@1.5e-4", 200.0, False)
    more = load(root, LONG_MORE)
    runs = [d, _run(root, LONG, "subspace:100@1e-4", 200.0, False)[1]]
    runs += [_run(root, LONG_MORE, e, 200.0, False)[1] for e in ("stiefel:16@1e-4", "stiefel-rvq:100@1.5e-4")]
    at80 = {r["entry"]: r for x in (rec, more) for r in x["runs"] if r["bandwidth_mbps"] == 80.0}
    d80 = at80[d["entry"]]
    rows = [(r["entry"], r, d, [str(r["steps_to_target"]),
                                _to(r, d) if r is not d else f"{r['time_to_target_s']:.0f} s",
                                _to(at80[r["entry"]], d80) if r is not d else f"{d80['time_to_target_s']:.0f} s"])
            for r in runs]
    lines = [f"{_older([rec, more])} {cite(LONG, LONG_MORE)}:", ""]
    lines += _table(rows, "| entry | fwd ratio | loss | vs dense | val vs dense | steps to dense's loss | "
                          "to target, 200 Mbps | 80 Mbps |")
    steps = [r["steps_to_target"] / d["steps_to_target"] for r in runs[1:]]
    return "\n".join(lines + ["", f"The compressed runs need {span(steps, lambda v: times(v, 2))} dense's steps to "
                              f"reach its loss (dense's own smoothed loss gets there at step {d['steps_to_target']})."])


def wire_doc_stage_lr(root: Path) -> str:
    """A learning-rate factor per stage at 300 and 1200 steps, and one Stiefel projection shared by both ends."""
    files = dict(load_folder(root, STAGE))
    sweep = _sweep(root)[1]
    pick = [("stage-lr-more-3", "dense"), ("stage-lr-0", "dense"), ("stage-lr-more-0", "dense"), (None, "dense"),
            ("stage-lr-more-6", "stiefel:16"), ("stage-lr-2", "stiefel:16"), ("stage-lr-4", "stiefel-rvq:100"),
            ("stage-lr-5", "subspace:100")]
    got = []
    for key, name in pick:
        rel = f"{STAGE}/wire-{key}.json"
        if key is not None and rel not in files:
            raise ConfigError(f"figure: results file {rel} not found under {root}")
        rec = files[rel] if key else load(root, f"{LR}/wire-lr-low-0.json")
        r = rec["runs"][0] if key else sweep["dense@1.5e-4"]
        f = rec["config"].get("stage_lr_scale")
        got.append((f"{name} ({r['measured_ratio_fwd']:.0f}x)" if "rvq" in name else name,
                    f"{_rate(r)}, " + (f"({', '.join(f'{v:g}' for v in f)})" if f else "uniform"), r))
    ref = got[0][2]
    lines = [f"{_older([files[f'{STAGE}/wire-{k}.json'] for k, _ in pick if k])} {cite(STAGE, LR)}:", "",
             "| entry | rate, stage factors | loss | vs best dense | val vs best dense |", "|---|---|---:|---:|---:|"]
    for label, rate, r in got:
        g = ("", "") if r is ref else (pct(_gap(r, ref)), pct(_gap(r, ref, "val_loss")))
        lines.append(f"| {label} | {rate} | {r['final_loss']:.4f} | {g[0]} | {g[1]} |")
    d = _run(root, LONG)[1]
    ld = _run(root, f"{LONG_STAGE}/wire-long-stage-lr-dense.json")[1]
    ls = _run(root, f"{LONG_STAGE}/wire-long-stage-lr-stiefel.json")[1]
    long_recs = [load(root, f"{LONG_STAGE}/wire-long-stage-lr-{k}.json") for k in ("dense", "stiefel")]
    vs = {k: _run(root, f"{VSTEP}/wire-{k}.json")[1] for k in ("vstep-2", "stage-lr-more-8", "vstep-3", "stage-lr-more-9")}
    base = _run(root, f"{VSTEP}/wire-tie-0.json")[1]
    spread = [_run(root, rel, "dense@1.5e-4")[1]["final_loss"] for rel in SEEDS] + [base["final_loss"]]
    return "\n".join(lines + [
        "", f"Over 1200 fresh-window steps ({_older(long_recs)}) dense with factors "
        f"({', '.join(f'{v:g}' for v in long_recs[0]['config']['stage_lr_scale'])}) ends {pct(_gap(ld, d))} against the "
        f"uniform 1.5e-4 run ({ld['final_loss']:.4f} against {d['final_loss']:.4f}), and stiefel:16 with factors "
        f"({', '.join(f'{v:g}' for v in long_recs[1]['config']['stage_lr_scale'])}) {pct(_gap(ls, d))} (validation "
        f"{pct(_gap(ls, d, 'val_loss'))}) {cite(LONG_STAGE)}.", "",
        f"Tied or not, against dense at 1.5e-4, 300 steps, one seed: with `k = d` two separate projections cost "
        f"{pct(_gap(vs['vstep-2'], base))} and a shared one {pct(_gap(vs['stage-lr-more-8'], base))} (dense's own "
        f"spread over three seeds: {max(spread) / min(spread) - 1:.1%}); at 4x {pct(_gap(vs['vstep-3'], base))} "
        f"untied, {pct(_gap(vs['stage-lr-more-9'], base))} tied {cite(VSTEP, *SEEDS)}."])


def wire_doc_code_bits(root: Path) -> str:
    """8-bit codes: the small model's 106x boundary over three seeds, and the 124M GPT's 107x boundary over 1200,
    1800 and 2400 steps and four rates, against dense at the same length."""
    cpu = [(_run(root, f"{f}/stiefel28-q8-full-anchors{s}.json")[1], _run(root, f"{f}/dense-6e-4{s}.json")[1])
           for f, s in zip(BITS_CPU, ("", "-seed1", "-seed2"))]
    g = [_gap(a, b) for a, b in cpu]
    v = [_gap(a, b, "val_loss") for a, b in cpu]
    cpu_recs = [load(root, f"{f}/dense-6e-4{s}.json") for f, s in zip(BITS_CPU, ("", "-seed1", "-seed2"))]
    head = (f"On the small 2-stage GPT over 1200 fresh-window steps ({_older(cpu_recs)}), `stiefel:28` with 8-bit codes "
            f"and full-rank anchors is {times(cpu[0][0]['measured_ratio_fwd'], 1)} smaller forward and "
            f"{', '.join(pct(x) for x in g)} against dense at 6e-4 (mean {pct(sum(g) / len(g))}; validation mean "
            f"{pct(sum(v) / len(v))}) {cite('results/cpu/wire-small-fresh-code-bits*/')}.")
    rows, recs = [], []
    for folder, dense_file in zip(BITS, ("wire-long-124m.json", "dense-1.5e-4.json", "dense-1.5e-4.json")):
        drec, d = _run(root, f"{folder}/{dense_file}", "dense@1.5e-4")
        srec, s = _run(root, f"{folder}/stiefel30-q8-anchors-1.5e-4.json")
        recs += [drec, srec]
        rows.append(("stiefel:30, 8-bit codes, 1.5e-4", s, d, srec["config"]["steps"]))
    s4rec, s4 = _run(root, f"{BITS[0]}/stiefel4-q8-anchors-1e-4.json")
    rows.append(("stiefel:4, 8-bit codes, 1e-4", s4, rows[0][2], s4rec["config"]["steps"]))
    lines = [head, "", f"On the 124M GPT (H200, {_older(recs + [s4rec])}): `stiefel:30` with 8-bit codes sends "
             f"{rows[0][1]['bytes_per_token_fwd']:.1f} B per token forward, {times(rows[0][1]['measured_ratio_fwd'], 0)} "
             "fewer than dense:", "", "| entry | fwd ratio | steps | loss | dense | vs dense | val vs dense |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label, s, d, steps in rows:
        lines.append(f"| {label} | {s['measured_ratio_fwd']:.0f} | {steps} | {s['final_loss']:.4f} | "
                     f"{d['final_loss']:.4f} | {pct(_gap(s, d))} | {pct(_gap(s, d, 'val_loss'))} |")
    rates = [_run(root, f"{BITS[0]}/stiefel30-q8-anchors-{r}.json")[1] for r in ("1e-4", "1.5e-4", "2.5e-4", "4e-4")]
    d25 = _run(root, f"{BITS[0]}/dense-2.5e-4.json")[1]
    return "\n".join(lines + ["", f"At 1200 steps dense at 2.5e-4 scores {d25['final_loss']:.4f} against "
                              f"{rows[0][2]['final_loss']:.4f} at 1.5e-4, and stiefel:30 "
                              f"{', '.join(format(r['final_loss'], '.4f') for r in rates)} at "
                              f"{', '.join(_rate(r) for r in rates)} {cite(*BITS)}."])


def _per_seed(root, folders, names):
    """Per seed folder: {name: run} for the files whose names start with each given prefix (first match)."""
    out, recs = [], []
    for rel in folders:
        files = load_folder(root, rel)
        got = {}
        for name, (prefix, entry) in names.items():
            hit = [(p, rec) for p, rec in files if p.rsplit("/", 1)[1].startswith(prefix)
                   and (entry is None or rec["runs"][0]["entry"] == entry)]
            if hit:
                got[name] = hit[0][1]["runs"][0]
                recs.append(hit[0][1])
        out.append(got)
    return out, recs


def _gap_rows(seeds, rows, dense="dense", control="control"):
    lines = []
    for label, key in rows:
        have = [(i, s) for i, s in enumerate(seeds) if key in s]
        if not have:
            raise ConfigError(f"figure: no results file for the row {label!r} in any seed folder")
        vs_d = [_gap(s[key], s[dense]) for _, s in have]
        cells = [f"{have[0][1][key]['measured_ratio_fwd']:.1f}", ", ".join(pct(x) for x in vs_d),
                 pct(sum(vs_d) / len(vs_d))]
        if key != control and control in have[0][1]:
            vs_c = [_gap(s[key], s[control]) for _, s in have]
            vc = [_gap(s[key], s[control], "val_loss") for _, s in have]
            cells += [", ".join(pct(x) for x in vs_c), pct(sum(vs_c) / len(vs_c)), pct(sum(vc) / len(vc))]
        else:
            cells += ["", "", ""]
        seeds_of = "" if len(have) == len(seeds) else f" (seed{'s' if len(have) > 1 else ''} " \
            f"{', '.join(str(i) for i, _ in have)})"
        lines.append(f"| {label}{seeds_of} | " + " | ".join(cells) + " |")
    return lines


def wire_doc_context_cpu(root: Path) -> str:
    """Anchors over two tokens on the small CPU model, five seeds: gaps to dense and to dense plus the same anchors,
    one-token anchors beside them, and the 2400-step run."""
    names = {"dense": ("dense-6e-4", None), "control": ("dense-plus-anchors-ctx2-6e-4", None),
             "one": ("dense-plus-anchors-6e-4", None), "s16": ("stiefel16-ctx2", "stiefel:16@3e-4"),
             "s28": ("stiefel28-q8-ctx2", None), "s16a": ("stiefel16-full-anchors", None),
             "s28a": ("stiefel28-q8-full-anchors", None)}
    seeds, recs = _per_seed(root, CTX_CPU, names)
    lines = [f"Training loss over 1200 fresh-window steps, {_older(recs)} {cite(*CTX_CPU)}:", "",
             "| entry | fwd ratio | vs dense | mean | vs dense plus the same anchors | mean | val vs control, mean |",
             "|---|---:|---|---:|---|---:|---:|"]
    lines += _gap_rows(seeds, [("dense plus anchors over two tokens (the control)", "control"),
                               ("dense plus one-token anchors (`anchor_whole=true`)", "one"),
                               ("stiefel:16, anchors over two tokens", "s16"),
                               ("stiefel:28, 8-bit codes, anchors over two tokens", "s28"),
                               ("stiefel:16, one-token anchors", "s16a"),
                               ("stiefel:28, 8-bit codes, one-token anchors", "s28a")])
    s0 = seeds[0]
    long, lrecs = _per_seed(root, (CPU_2400,), {"dense": ("dense-6e-4", None), "control": ("dense-plus-anchors-ctx2", None),
                                                "s16": ("stiefel16-ctx2", None), "s28": ("stiefel28-q8-ctx2", None)})
    L = long[0]
    return "\n".join(lines + [
        "", f"Against dense with one-token anchors (seed 0) the 8-bit one-token boundary is {pct(_gap(s0['s28a'], s0['one']))} "
        f"rather than {pct(_gap(s0['s28a'], s0['dense']))} against plain dense. Twice as long ({L['dense']['tokens'] // 1000}k "
        f"tokens, {_older(lrecs)}) the 8-bit boundary is {pct(_gap(L['s28'], L['control']))} against its control "
        f"(validation {pct(_gap(L['s28'], L['control'], 'val_loss'))}) and {pct(_gap(L['s28'], L['dense']))} against dense, "
        f"stiefel:16 {pct(_gap(L['s16'], L['control']))} (validation {pct(_gap(L['s16'], L['control'], 'val_loss'))}) "
        f"and {pct(_gap(L['s16'], L['dense']))}; the control itself is {pct(_gap(L['control'], L['dense']))} against "
        f"dense {cite(CPU_2400)}."])


def wire_doc_context(root: Path) -> str:
    """Anchors over two tokens on the 124M GPT at 1200 steps, per seed: gaps to dense and to the control."""
    names = {k: (v, None) for k, v in {
        "dense": "dense-1.5e-4", "control": "control-", "s16": "stiefel16-context2-1.5e-4",
        "s5": "stiefel5-q8-context2-1.5e-4", "s30": "stiefel30-q8-context2-1.5e-4", "s4": "stiefel4-q8-context2-1e-4",
        "s16b": "stiefel16-context2-2.5e-4"}.items()}
    seeds, recs = _per_seed(root, CTX, names)
    drec, d0 = _run(root, f"{CTX[0]}/wire-long-124m.json", "dense@1.5e-4")
    seeds[0]["dense"] = d0
    lines = [f"Training loss over 1200 fresh-window steps, {_older(recs + [drec])} {cite(*CTX)}:", "",
             "| entry | fwd ratio | vs dense | mean | vs dense plus the same anchors | mean | val vs control, mean |",
             "|---|---:|---|---:|---|---:|---:|"]
    lines += _gap_rows(seeds, [("dense plus anchors over two tokens (the control)", "control"),
                               ("stiefel:16, float32 codes", "s16"), ("stiefel:5, 8-bit codes", "s5"),
                               ("stiefel:30, 8-bit codes", "s30"), ("stiefel:4, 8-bit codes, at 1e-4", "s4"),
                               ("stiefel:16 at 2.5e-4", "s16b")])
    return "\n".join(lines)


RENDERERS = {"wire-doc-tf32": wire_doc_tf32, "wire-doc-quick": wire_doc_quick, "wire-doc-nccl": wire_doc_nccl,
             "wire-doc-baselines": wire_doc_baselines, "wire-doc-lr": wire_doc_lr, "wire-doc-best": wire_doc_best,
             "wire-doc-seeds": wire_doc_seeds, "wire-doc-long": wire_doc_long, "wire-doc-stage-lr": wire_doc_stage_lr,
             "wire-doc-code-bits": wire_doc_code_bits, "wire-doc-context-cpu": wire_doc_context_cpu,
             "wire-doc-context": wire_doc_context}
