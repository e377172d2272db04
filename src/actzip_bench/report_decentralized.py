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
CPU_PCA_QUICK = "results/cpu/decentralized-pca-quick.json"
CPU_PCA = "results/cpu/decentralized-pca.json"  # the default run's protocol, with --until-target 2
CPU_PCA_4STAGES = "results/cpu/decentralized-pca-quick-4stages.json"
CPU_CORRECTION_QUICK = "results/cpu/decentralized-correction-quick.json"
H200_PCA_LOSS = "results/h200/decentralized-h200-pca-loss.json"  # 3 seeds side by side: losses, not speeds
H200_PCA_SPEED = {"512": "results/h200/decentralized-h200-pca-speed-512.json",
                  "512-4stages": "results/h200/decentralized-h200-pca-speed-512-4stages.json",
                  "1024": "results/h200/decentralized-h200-pca-speed-1024.json",
                  "512-long": "results/h200/decentralized-h200-pca-speed-512-long.json"}
# the 512-long shapes again on an H100 alone, with both axes compressed (pca+diloco, pca+powersgd)
H100_WIDE_SPEED = "results/h100/decentralized-wide-speed.json"
# those shapes to dense's loss, one seed after the other alone on an H100 (their own step times), 3 seeds
H100_WIDE_LOSS = "results/h100/decentralized-wide-loss.json"
# seed 2's continual runs its record lacks (pca, int8, bf16), run again with their own dense (another pretraining)
H100_WIDE_S2_CONTINUAL = "results/h100/wide-loss/wide-loss-s2-continual.json"
# width 256 on the CPU, 3 seeds: the data-parallel compressions beside pca (diloco, a plain average, powersgd)
CPU_PCA_256 = "results/cpu/decentralized-pca-256.json"
# the quick protocol, 3 seeds: every step's gradient in 4-bit codes with error feedback, under pca and int4
CPU_QUANT_QUICK = "results/cpu/decentralized-quant-quick.json"
# width 256 on the CPU, 3 seeds: pca+quant and int4+quant beside int4 and pca (losses: other work shared the machine)
CPU_QUANT_256 = "results/cpu/decentralized-quant-256.json"
# the quick protocol with every rank in a namespace of its own, each uplink shaped (one record per link)
CPU_SHAPED = ("results/cpu/decentralized-shaped-200.json", "results/cpu/decentralized-shaped-80.json")
# the same protocol for the 4-bit data-parallel sync (pca+quant, int4+quant) on the 200 Mbit/s link
CPU_SHAPED_QUANT = ("results/cpu/decentralized-shaped-quant-200.json",)
# and at width 256 on the CPU, one seed, domain (records with each step's measured sync)
CPU_SHAPED_256 = ("results/cpu/decentralized-shaped-quant-256.json",)
# those runs again with their schedules kept, replayed beside on a link calibrated by CPU_LINK's all-gathers
CPU_SHAPED_256_CALIBRATED = ("results/cpu/decentralized-shaped-quant-256-calibrated.json",)
CPU_LOCAL_256 = "results/cpu/decentralized-quant-256-local.json"  # the same runs with every rank on one host
CPU_LINK = "results/cpu/link-200.json"  # bench link: messages alone over the shaped link, against the model
# those methods on the shaped mesh with an H100 computing (width 512, 256-token windows), one seed, domain
H100_SHAPED = ("results/h100/decentralized-shaped-gpu.json",)
# the wide shape's 4-bit-sync methods on the shaped mesh with an H100 computing, 3 seeds one after the other,
# dense trained off the link (its losses the targets)
H100_WIDE_SHAPED = ("results/h100/decentralized-wide-shaped.json",)
# the corrections' ablation with the trained models' held-out loss (codecs off): the quick and the default protocol
CPU_CORRECTION_ABLATION = {"quick": "results/cpu/decentralized-correction-ablation-quick.json",
                           "default": "results/cpu/decentralized-correction-ablation.json"}
# the debias correction's decay on the default protocol (0.9: the ablation above), then 0 on unseen seeds and quick
CPU_CORRECTION_DECAY = {"0.9": CPU_CORRECTION_ABLATION["default"],
                        "0.5": "results/cpu/decentralized-correction-decay-0.5.json",
                        "0": "results/cpu/decentralized-correction-decay-0.json"}
CPU_CORRECTION_CHECK = {"seeds345": "results/cpu/decentralized-correction-decay-0-seeds345.json",
                        "quick": "results/cpu/decentralized-correction-decay-0-quick.json"}
# the seeds-3-5 check again with the anchor passes in bf16 (--anchor-codec cast:dtype=bfloat16)
CPU_CORRECTION_BF16 = "results/cpu/decentralized-correction-decay-0-seeds345-bf16-anchors.json"
# each corrected circuit -> the same circuit uncorrected (whose gap to dense a correction should close)
UNCORRECTED = {"two-circuit": "mask+topk", "two-circuit-projection": "mask+topk", "two-circuit-wiener": "mask+topk",
               "two-circuit-debias": "mask+topk", "mask-backward-shrinkage": "mask-backward",
               "mask-backward-wiener": "mask-backward", "mask-backward-debias": "mask-backward"}


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


SHARED_SEEDS = "the runs of the seeds shared one machine, so no step time is given."


def _describe(rec: dict, speeds: bool = True, unshared: str = SHARED_SEEDS) -> str:
    c = rec["config"]
    seeds = len(c["seeds"])
    timing = ("step times from the link model replaying each run's measured schedule, with each stage's "
              "data-parallel sync before its update; `pipeline alone` leaves the sync out." if speeds else unshared)
    return (f"GPT of {c['n_layer']} blocks, width {c['n_embd']}, {c['block_size']}-token windows; {c['stages']} stages "
            f"x {c['replicas']} replicas (one process each, gloo), {c['batch_size']} sequences per replica per step in "
            f"{c['microbatches']} microbatches ({c.get('schedule', '1f1b')}); {c['pretrain_steps']} dense pretraining "
            f"steps on standard-library code, then {c['steps']} steps per task; {seeds} seed{'s' * (seeds > 1)}. "
            "Final loss: the replicas' mean training loss over the last tenth of the steps; " + timing)


def decentralized_markdown(rec: dict, path_note: str, speeds: bool = True, unshared: str = SHARED_SEEDS) -> str:
    """Per task, a table of every method: bytes per step on each axis, loss against dense, step-time ratios to
    the bf16 wire (the whole step and the pipeline axis alone) and time to dense's final loss on every link;
    without ``speeds`` (runs that shared their machine) the bytes and losses alone, and the pipeline bytes'
    ratio to bf16's."""
    c = rec["config"]
    links = [f"{bw:g}mbps-{lat:g}ms" for bw, lat in c["links"]] if speeds else []
    out = [_describe(rec, speeds, unshared), ""]
    for task in c["tasks"]:
        rows = [a for a in rec["aggregate"] if a["task"] == task]
        head = ["method", "pipeline MB/step", "data-parallel MB/step", "loss vs dense (range)"]
        bf16 = next((a["pp_bytes_per_step"] for a in rows if a["method"] == "bf16"), None)
        ratios = not speeds and bf16 is not None  # without a bf16 run there is nothing to divide by
        if ratios:
            head.append("bf16's pipeline bytes / these")
        for name in links:
            head += [f"{name}: step vs bf16", "pipeline alone vs bf16", "time to dense's loss"]
        out += [f"**{task}**", "", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
        all_dense = next(a for a in rows if a["method"] == "dense")
        for a in rows:
            lo, hi = a["final_loss_range"]
            dense = a.get("dense_reference", all_dense["final_loss"])  # dense over the row's own seeds
            # a loss claim needs seeds: a one-seed run's loss is left out
            loss = (f"{pct(a['loss_vs_dense'])} ({pct(lo / dense - 1)} to {pct(hi / dense - 1)})" if a["seeds"] > 1
                    else "one seed: not a loss figure")
            if 1 < a["seeds"] < all_dense["seeds"]:
                loss += f", {a['seeds']} seeds"
            cells = [a["method"], f"{a['pp_bytes_per_step'] / 1e6:,.3f}", f"{a['dp_bytes_per_step'] / 1e6:,.3f}", loss]
            if ratios:
                cells.append(f"{bf16 / a['pp_bytes_per_step']:.2f}x")
            for name in links:
                link = a["links"][name]
                t = link["time_to_target_s"]
                cells += [_x(link.get("throughput_vs_bf16")), _x(link.get("pp_throughput_vs_bf16")),
                          "not reached" if t is None else f"{t:,.1f} s"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    anchored = sorted({r["method"] for r in rec["rows"] if r.get("anchors")})
    if anchored:  # their anchor passes cross the same links, apart from the fast circuit's bytes above
        out += [f"The pipeline bytes of {', '.join(f'`{m}`' for m in anchored)} are the fast circuit's: their anchor "
                f"passes (one dense float32 pass every {c['anchor_every']} steps) cross the same links besides, and "
                "the step times leave them out.", ""]
    out.append(path_note)
    return "\n".join(out)


def decentralized_section(path: Path, root: Path) -> str:
    rec = json.loads(path.read_text())
    return ("\n## Decentralized two-circuit training: every method on the same mesh\n\n"
            + decentralized_markdown(rec, provenance(rec, path, root)) + "\n")


def _figure(rel: str, speeds: bool = True, unshared: str = SHARED_SEEDS):
    """A record's figure; without ``speeds``, ``unshared`` says why its step times are left out."""
    def render(root: Path) -> str:
        rec = json.loads((Path(root) / rel).read_text())
        return decentralized_markdown(rec, cite(rel), speeds, unshared)
    return render


def _agg(rec: dict, method: str, task: str = "domain") -> dict:
    return next(a for a in rec["aggregate"] if a["method"] == method and a["task"] == task)


def pca_reading(root: Path) -> str:
    """The figures docs/wire.md's reading of the ``pca`` runs cites, from their records."""
    load = lambda rel: json.loads((Path(root) / rel).read_text())  # noqa: E731
    loss, wide, long = (load(r) for r in (H200_PCA_LOSS, H200_PCA_SPEED["1024"], H200_PCA_SPEED["512-long"]))
    tasks = loss["config"]["tasks"]
    pca = [_agg(loss, "pca", t)["loss_vs_dense"] for t in tasks]
    mask = [_agg(loss, "mask", t)["loss_vs_dense"] for t in tasks]
    ratio = _agg(loss, "bf16")["pp_bytes_per_step"] / _agg(loss, "pca")["pp_bytes_per_step"]
    slow, fast = (f"{bw:g}mbps-{lat:g}ms" for bw, lat in wide["config"]["links"][:2])
    bw, one_way = wide["config"]["links"][0]

    def floor(rec: dict) -> str:
        mine, theirs = _agg(rec, "pca"), _agg(rec, "bf16")
        c = rec["config"]
        send = mine["pp_bytes_per_step"] * 8 / (bw * 1e6)
        latency = 2 * one_way / 1e3
        step = mine["links"][slow]["pp_step_s"]
        return (f"width {c['n_embd']:,}, {c['block_size']:,}-token windows and {c['batch_size']} sequences: "
                f"{step:.2f} s ({latency:.2f} s of latency, {send:.2f} s of sending its "
                f"{mine['pp_bytes_per_step'] / 1e6:.1f} MB, {step - latency - send:.2f} s of compute and pipeline "
                f"bubble) against {theirs['links'][slow]['pp_step_s']:.2f} s for the bf16 wire, "
                f"{mine['links'][slow]['pp_throughput_vs_bf16']:.2f} times faster "
                f"({mine['links'][fast]['pp_throughput_vs_bf16']:.2f} times at {fast})")

    diloco = [_agg(loss, "pca+diloco", t)["loss_vs_dense"] for t in tasks]
    both = _agg(wide, "pca+diloco")["links"]
    return (f"`pca` is {pct(min(pca))} to {pct(max(pca))} against dense over the two tasks at {ratio:.1f} times "
            f"fewer pipeline bytes than the bf16 wire, where the random mask is {pct(min(mask))} to {pct(max(mask))}. "
            f"The `pca` step's pipeline time on the {bw:g} Mbit/s link at {floor(wide)}; at {floor(long)}. With the "
            f"data-parallel axis compressed too (`pca+diloco`, width {wide['config']['n_embd']:,}) the whole step is "
            f"{both[slow]['throughput_vs_bf16']:.2f} times faster than the bf16 wire's "
            f"({both[fast]['throughput_vs_bf16']:.2f} times at {fast}), but its loss is {pct(min(diloco))} to "
            f"{pct(max(diloco))} against dense (`{H200_PCA_LOSS}`, `{H200_PCA_SPEED['1024']}`, "
            f"`{H200_PCA_SPEED['512-long']}`)")


def wide_loss_reading(root: Path) -> str:
    """What docs/wire.md reads off the wide shape's three-seed record: losses and times to dense's loss."""
    rec = json.loads((Path(root) / H100_WIDE_LOSS).read_text())
    tasks = rec["config"]["tasks"]
    links = [f"{bw:g}mbps-{lat:g}ms" for bw, lat in rec["config"]["links"]]
    both = [_agg(rec, "pca+quant", t) for t in tasks]
    alone = [_agg(rec, "pca", t) for t in tasks]
    ttt = [a["links"][name]["ttt_vs_best_trivial"] for a in both for name in links]
    seeds = len(rec["config"]["seeds"])

    def losses(aggs: list[dict]) -> str:
        return " and ".join(pct(a["loss_vs_dense"]) + (f" ({a['seeds']} seeds)" if a["seeds"] < seeds else "")
                            for a in aggs)

    def gap(r: dict, rows: list[dict]) -> float:
        dense = next(d for d in rows if d["method"] == "dense" and (d["seed"], d["task"]) == (r["seed"], r["task"]))
        return r["final_loss"] / dense["final_loss"] - 1

    rerun = json.loads((Path(root) / H100_WIDE_S2_CONTINUAL).read_text())["rows"]
    merged = [(r["seed"], gap(r, rec["rows"])) for r in rec["rows"] if (r["method"], r["task"]) == ("pca", "continual")]
    pca = sorted(merged + [(r["seed"], gap(r, rerun)) for r in rerun if r["method"] == "pca"])
    continual = (f"; with seed 2's continual `pca` run again beside its own dense (`{H100_WIDE_S2_CONTINUAL}`: "
                 f"another pretraining, so not merged), `pca` on the continual task is "
                 f"{pct(sum(g for _, g in pca) / len(pca))} over {len(pca)} seeds "
                 f"({', '.join(f'seed {s} {pct(g)}' for s, g in pca)}), each against its own run's dense")
    bw = rec["config"]["links"][0][0]
    mine, theirs = _agg(rec, "pca"), _agg(rec, "bf16")
    # the pipeline step with its sending taken out: latency, compute and bubble, what no compression removes
    floor = mine["links"][links[0]]["pp_step_s"] - mine["pp_bytes_per_step"] * 8 / (bw * 1e6)
    bf16_step = theirs["links"][links[0]]["step_s"]
    ceiling = (f". With no byte at all on either axis a step of this schedule still takes its latency, compute and "
               f"bubble, {floor:.2f} s at {links[0]}, so no compression makes it more than "
               f"{bf16_step / floor:.1f} times faster than the bf16 wire's {bf16_step:.2f} s")
    return (f"`pca+quant` is {losses(both)} against dense ({' and '.join(tasks)}), "
            f"`pca` alone {losses(alone)}{continual}; `pca+quant`'s whole step is "
            f"{min(a['links'][links[0]]['throughput_vs_bf16'] for a in both):.2f} times the bf16 wire's speed at "
            f"{links[0]}, its pipeline alone {min(a['links'][links[0]]['pp_throughput_vs_bf16'] for a in both):.2f} "
            f"times, and it reaches dense's final loss {min(ttt):.2f} to {max(ttt):.2f} times sooner than the best "
            f"trivial baseline over both tasks and links{ceiling} {cite(H100_WIDE_LOSS)}")


def shaped_calibration(root: Path, rels: tuple[str, ...] = CPU_SHAPED, summarized: str = "pca") -> str:
    """Per method and shaped link: the measured step against the link model's of the same runs (mean over seeds
    and tasks), and per task the measured time to dense's loss and its ratio to the best trivial wire's (the
    range of that ratio for method ``summarized`` closes the figure)."""
    recs = [json.loads((Path(root) / rel).read_text()) for rel in rels]
    tasks = recs[0]["config"]["tasks"]
    head = ["method", "link", "measured step ms", "model step ms", "model vs measured"]
    # records replayed again with the syncs at the machine's measured all-gather times (bench link)
    calibrated = all(any(k.endswith(" calibrated") for k in r["links"]) for rec in recs for r in rec["rows"])
    if calibrated:
        head += ["calibrated model step ms", "calibrated vs measured"]
    # records that keep each step's measured data-parallel sync: it beside the part of the model's step it adds
    syncs = all("dp_sync_s" in r for rec in recs for r in rec["rows"])
    hosts = syncs and all("dp_host_s" in r for rec in recs for r in rec["rows"])
    if syncs:
        head += ["sync measured ms", "sync in the model ms"] + (["of it host work ms"] if hosts else [])
    for t in tasks:
        head += [f"{t}: time to dense's loss, measured (model)", "best trivial wire's time / this one's, measured"]
    out = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    offs, ratios, cal_offs = [], [], []
    for rec in recs:
        bw, lat = rec["config"]["shaped_link"]
        model, shaped = f"{bw:g}mbps-{lat:g}ms", f"shaped {bw:g}mbps-{lat:g}ms"
        for method in dict.fromkeys(a["method"] for a in rec["aggregate"]):
            aggs = [_agg(rec, method, t) for t in tasks]
            measured = sum(a["links"][shaped]["step_s"] for a in aggs) / len(aggs)
            modelled = sum(a["links"][model]["step_s"] for a in aggs) / len(aggs)
            off_link = any(r["links"][shaped].get("modelled") for r in rec["rows"] if r["method"] == method)
            if not off_link:  # a method trained off the link (dense_off_link) has no measured step there
                offs.append(modelled / measured - 1)
            cells = [method, f"{bw:g} Mbps, {lat:g} ms", "off the link" if off_link else f"{1e3 * measured:.1f}",
                     f"{1e3 * modelled:.1f}", "n/a" if off_link else pct(modelled / measured - 1)]
            if calibrated:
                cal = sum(a["links"][f"{model} calibrated"]["step_s"] for a in aggs) / len(aggs)
                if not off_link:
                    cal_offs.append(cal / measured - 1)
                cells += [f"{1e3 * cal:.1f}", "n/a" if off_link else pct(cal / measured - 1)]
            if syncs:
                rows = [r for r in rec["rows"] if r["method"] == method]
                sync_model = sum(r["links"][model]["step_s"] - r["links"][model]["pp_step_s"] for r in rows) / len(rows)
                cells += [f"{1e3 * sum(r['dp_sync_s'] for r in rows) / len(rows):.1f}", f"{1e3 * sync_model:.1f}"]
                if hosts:  # measured, and the same in the model
                    cells.append(f"{1e3 * sum(r['dp_host_s'] for r in rows) / len(rows):.1f}")
            for a in aggs:
                got, want = a["links"][shaped]["time_to_target_s"], a["links"][model]["time_to_target_s"]
                ratio = a["links"][shaped].get("ttt_vs_best_trivial")
                if method == summarized and ratio is not None:
                    ratios.append(ratio)
                cells += ["not reached" if got is None else
                          f"{got:.1f} s ({'not reached' if want is None else f'{want:.1f} s'})",
                          "n/a" if ratio is None or method == "dense" else f"{ratio:.2f}x"]
            out.append("| " + " | ".join(cells) + " |")
    c = recs[0]["config"]
    summary = (f"\nGPT of {c['n_layer']} blocks, width {c['n_embd']}, {c['stages']} stages x {c['replicas']} "
               f"replicas, each rank in its own network namespace, every uplink shaped (`tc tbf`, the latency added "
               f"by the senders); {len(c['seeds'])} seed{'s' * (len(c['seeds']) > 1)}, {c['steps']} steps a task "
               f"(`--until-target "
               f"{c['until_target']:g}`). Over {len(offs)} method-and-link entries the model's step is "
               f"{pct(min(offs))} to {pct(max(offs))} off the measured one")
    if cal_offs:
        summary += (f", and with the syncs at the all-gather times `bench link` measured {_probed_on(recs)} "
                    f"{pct(min(cal_offs))} to {pct(max(cal_offs))}")
    if ratios:
        summary += (f"; on the shaped link the best trivial wire's time to dense's loss over `{summarized}`'s is "
                    f"{min(ratios):.2f}x to {max(ratios):.2f}x (below 1: `{summarized}` later)")
    return "\n".join(out) + summary + " " + cite(*rels) + "."


def _probed_on(recs: list[dict]) -> str:
    """Where the records' link calibration was measured: on the machine that ran them, or which other one."""
    key = lambda m: (m.get("host_cpu"), m.get("cores"))  # noqa: E731
    probes = {key(r.get("link_calibration", {}).get("machine") or {}) for r in recs}
    if probes == {key(r["machine"]) for r in recs}:
        return "on the same machine"
    return "on another machine (" + "; ".join(f"{cpu}, {n} cores" for cpu, n in sorted(probes, key=str)) + ")"


def _decay(c: dict) -> str:
    """The corrections' decay in a record's config (records made before the option ran at 0.9 throughout)."""
    d = c.get("spectral_decay", 0.9)
    return f"decay {d:g}" if d is not None else "each mode's default decay (debias 0, the others 0.9)"


def _anchor_bytes(rec: dict, method: str, task: str) -> float:
    """Replica 0's anchor traffic per step, the mean over seeds: metered, or in records made before the meter
    the dense pipeline's bytes a step (an anchor is one dense pass) times the anchors a stage ran a step."""
    c = rec["config"]
    rows = [r for r in rec["rows"] if (r["method"], r["task"]) == (method, task)]
    if all("anchor_bytes_per_step" in r for r in rows):
        return sum(r["anchor_bytes_per_step"] for r in rows) / len(rows)
    got = []
    for r in rows:
        dense = next(d for d in rec["rows"] if (d["method"], d["task"], d["seed"]) == ("dense", task, r["seed"]))
        per_stage = 0 if r["anchors"] is None else r["anchors"]["launched"] / (c["stages"] * c["replicas"])
        got.append(dense["pp_bytes_per_step"] * per_stage / r["steps_run"])
    return sum(got) / len(got)


def correction_ablation(rel: str):
    """Per task, each correction beside the circuit it corrects: the training loss (through the masks) and the
    trained model's held-out loss (codecs off) against dense, and the share of the uncorrected circuit's
    held-out gap to dense that the correction closes."""
    def render(root: Path) -> str:
        rec = json.loads((Path(root) / rel).read_text())
        c = rec["config"]
        out = [_describe(rec).split(" Final loss:")[0] + " Training loss: the replicas' mean over the last tenth "
               "of the steps, through the masks; held-out loss: the trained model (replica 0) on "
               f"{c['eval_batches']} held-out batches of its task with every boundary codec off, as it is used "
               "after training; the anchors' traffic is their dense passes' (metered, or for records made before "
               "the meter, dense's pipeline bytes for each pass); the anchors every "
               f"{c['anchor_every']} steps, due {c['anchor_delay']} later, rank {c['spectral_rank']}, "
               f"{_decay(c)}.", ""]
        head = ["task", "method", "corrects", "pipeline MB/step", "anchors' MB/step", "training loss vs dense (range)",
                "held-out loss vs dense (range)", "held-out gap closed"]
        out += ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
        for task in c["tasks"]:
            for a in (a for a in rec["aggregate"] if a["task"] == task and a["method"] not in ("dense", "bf16")):
                base = UNCORRECTED.get(a["method"])
                lo, hi = a["final_loss_range"]
                mlo, mhi = a["model_val_loss_vs_dense_range"]
                closed = "" if base is None else pct(1 - a["model_val_loss_vs_dense"] / _agg(
                    rec, base, task)["model_val_loss_vs_dense"]).lstrip("+")
                out.append(f"| {task} | {a['method']} | {base or ''} | {a['pp_bytes_per_step'] / 1e6:.3f} | "
                           f"{_anchor_bytes(rec, a['method'], task) / 1e6:.3f} | {pct(a['loss_vs_dense'])} "
                           f"({pct(lo / a['dense_reference'] - 1)} to {pct(hi / a['dense_reference'] - 1)}) | "
                           f"{pct(a['model_val_loss_vs_dense'])} ({pct(mlo)} to {pct(mhi)}) | {closed} |")
        return "\n".join(out) + f"\n\n{len(c['seeds'])} seeds {cite(rel)}."
    return render


def _closed(rec: dict, method: str, task: str) -> float:
    base = _agg(rec, UNCORRECTED[method], task)["model_val_loss_vs_dense"]
    return 1 - _agg(rec, method, task)["model_val_loss_vs_dense"] / base


def correction_reading(root: Path) -> str:
    """What docs/wire.md reads off the ablations: the share of the masked circuit's held-out gap each correction
    closes, at the first decay over both protocols, then the debias correction's decay and its checks."""
    load = lambda rel: json.loads((Path(root) / rel).read_text())  # noqa: E731
    recs = {k: load(rel) for k, rel in CPU_CORRECTION_ABLATION.items()}

    def span(recs: list[dict], method: str) -> str:
        got = [_closed(rec, method, t) for rec in recs for t in rec["config"]["tasks"]]
        return f"{pct(min(got))} to {pct(max(got))}"

    others = ", ".join(f"`{m}` {span(list(recs.values()), m)}"
                       for m in ("two-circuit", "two-circuit-projection", "two-circuit-wiener"))
    decays = {k: load(rel) for k, rel in CPU_CORRECTION_DECAY.items()}
    sweep = "; ".join(f"decay {k}: " + ", ".join(f"{t} {pct(_closed(rec, 'two-circuit-debias', t))}"
                                                 for t in rec["config"]["tasks"]) for k, rec in decays.items())
    checks = [load(rel) for rel in CPU_CORRECTION_CHECK.values()]
    back = span(list(recs.values()), "mask-backward-debias")
    sources = [*CPU_CORRECTION_ABLATION.values(), *list(CPU_CORRECTION_DECAY.values())[1:],
               *CPU_CORRECTION_CHECK.values(), CPU_CORRECTION_BF16]
    half = load(CPU_CORRECTION_BF16)
    half_anchors = _anchor_bytes(half, "two-circuit-debias", "domain")
    both = _agg(half, "two-circuit-debias")["pp_bytes_per_step"] + half_anchors
    halved = (f" With the anchor passes in bf16 (`--anchor-codec cast:dtype=bfloat16`, seeds 3, 4, 5 again) "
              f"`debias` closes {span([half], 'two-circuit-debias')} of the gap with {half_anchors / 1e6:.3f} MB a "
              f"step of anchors, the two circuits together "
              f"{_agg(recs['default'], 'bf16')['pp_bytes_per_step'] / both:.1f} times fewer bytes than the bf16 "
              f"wire's.")
    default = recs["default"]
    mine = _agg(default, "two-circuit-debias")["pp_bytes_per_step"]
    anchors = _anchor_bytes(default, "two-circuit-debias", "domain")
    bf16 = _agg(default, "bf16")["pp_bytes_per_step"]
    traffic = (f" The anchors are not free on the wire: on the default protocol their dense float32 pass every "
               f"{default['config']['anchor_every']} steps adds {anchors / 1e6:.3f} MB a step to the masked "
               f"circuit's {mine / 1e6:.3f} MB, the two together {bf16 / (mine + anchors):.1f} times fewer bytes "
               f"than the bf16 wire's (the masked circuit alone: {bf16 / mine:.1f} times); off the critical path, "
               f"but on the same links, which the link model's step times leave out.")
    return (f"At the decay the subspace corrections use (0.9), `debias` closes "
            f"{span(list(recs.values()), 'two-circuit-debias')} of `mask+topk`'s held-out gap over both protocols "
            f"and tasks, and the other corrections {others} (negative: wider); on the gradient-only mask, whose "
            f"gradients are unbiased, it has no bias to remove and adds the pairs' noise ({back} of "
            f"`mask-backward`'s gap). Its decay on the default protocol, three values tried, the share closed: "
            f"{sweep}. At decay 0 (the latest pair alone) on three seeds none of these runs used (3, 4, 5) and on "
            f"the quick protocol: {span(checks, 'two-circuit-debias')} of the gap closed over both tasks. Its "
            f"training loss through the masks moves away from dense as its model's held-out loss moves towards "
            f"it: it trains the model, not the masked function.{traffic}{halved} "
            f"{cite(*sources)}.")


def _timings(first: str, rows: list[dict]) -> str:
    """A markdown table of measured against modelled times, one row per size."""
    out = [f"| {first} | measured ms | model ms | model vs measured |", "|---:|---:|---:|---:|"]
    out += [f"| {r['bytes']:,} | {1e3 * r['measured_s']:.2f} | {1e3 * r['model_s']:.2f} | "
            f"{pct(r['model_s'] / r['measured_s'] - 1)} |" for r in rows]
    return "\n".join(out)


def link_probe(rel: str):
    """A renderer of the ``bench link`` record at ``rel``: each message size's and each all-gather's measured
    time against the model's."""
    def render(root: Path) -> str:
        rec = json.loads((Path(root) / rel).read_text())
        c = rec["config"]
        text = _timings("message bytes", rec["rows"]) + (
            f"\n\n{c['mbps']:g} Mbit/s shaped by `{rec['shaping']}`, one message at a time after {c['idle_s']:g} s "
            f"idle, median of {c['repeats']} {cite(rel)}.")
        if "gathers" not in rec:
            return text
        big = [r["model_s"] / r["measured_s"] - 1 for r in rec["gathers"] if r["bytes"] >= 1_000_000]
        return (text + "\n\nTwo gloo ranks' all-gathers (the 4-bit sync's collective), each rank in a namespace "
                "with its uplink shaped the same way, the slower rank's time:\n\n" +
                _timings("bytes a rank", rec["gathers"]) +
                (f"\n\nFrom a megabyte a rank up the model is {pct(min(big))} to {pct(max(big))} off the measured "
                 "all-gather" if big else "") + f" {cite(rel)}.")
    return render


def local_sync(root: Path) -> str:
    """The same runs on one host: what their data-parallel sync took without a slow link under it."""
    rec = json.loads((Path(root) / CPU_LOCAL_256).read_text())
    parts = ", ".join(f"`{r['method']}` {1e3 * r['dp_sync_s']:.1f} ms" for r in rec["rows"])
    return (f"The same runs with every rank on one host, no namespace: their sync took {parts} a step, the host's "
            f"own work and the loopback's copies {cite(CPU_LOCAL_256)}.")


RENDERERS = {"wire-decentralized-pca-reading": pca_reading, "wire-decentralized-cpu": _figure(CPU_RUN),
             "wire-decentralized-h200-speed": _figure(H200_SPEED),
             "wire-decentralized-h200-speed-gpipe": _figure(H200_SPEED_GPIPE),
             "wire-decentralized-pca-quick": _figure(CPU_PCA_QUICK),
             "wire-decentralized-pca-cpu": _figure(CPU_PCA),
             "wire-decentralized-pca-quick-4stages": _figure(CPU_PCA_4STAGES),
             "wire-decentralized-correction-quick": _figure(CPU_CORRECTION_QUICK),
             "wire-decentralized-h200-pca-loss": _figure(H200_PCA_LOSS, speeds=False),
             **{f"wire-decentralized-h200-pca-speed-{k}": _figure(v) for k, v in H200_PCA_SPEED.items()},
             "wire-decentralized-h100-wide-speed": _figure(H100_WIDE_SPEED),
             "wire-decentralized-h100-wide-loss": _figure(H100_WIDE_LOSS),
             "wire-decentralized-h100-wide-reading": wide_loss_reading,
             "wire-decentralized-pca-256": _figure(CPU_PCA_256),
             "wire-decentralized-quant-quick": _figure(CPU_QUANT_QUICK),
             "wire-decentralized-quant-256": _figure(CPU_QUANT_256, speeds=False, unshared=(
                 "tests ran on the same two cores during part of the run, so no step time is given.")),
             "wire-decentralized-shaped": shaped_calibration,
             "wire-decentralized-correction-reading": correction_reading,
             **{f"wire-decentralized-correction-ablation-{k}": correction_ablation(v)
                for k, v in CPU_CORRECTION_ABLATION.items()},
             **{f"wire-decentralized-correction-decay-0-{k}": correction_ablation(v)
                for k, v in CPU_CORRECTION_CHECK.items()},
             "wire-decentralized-shaped-quant": lambda root: shaped_calibration(root, CPU_SHAPED_QUANT, "pca+quant"),
             "wire-decentralized-shaped-h100": lambda root: shaped_calibration(root, H100_SHAPED, "pca+quant"),
             "wire-decentralized-shaped-h100-wide": lambda root: shaped_calibration(root, H100_WIDE_SHAPED,
                                                                                    "pca+quant"),
             "wire-decentralized-shaped-256": lambda root: shaped_calibration(root, CPU_SHAPED_256, "pca+quant")
             + " " + local_sync(root),
             "wire-decentralized-shaped-256-calibrated": lambda root: shaped_calibration(
                 root, CPU_SHAPED_256_CALIBRATED, "pca+quant"),
             "wire-link-probe": link_probe(CPU_LINK)}
