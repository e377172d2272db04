"""``actzip bench split``: keep-ratio policies for a split-learning client's modalities under one uplink budget,
simulated in one process on the synthetic multimodal suite; ``actzip bench split-link``: the split-learning
runtime as processes over a real shaped link, against the link model."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import command_line, config_from_args, write_json, write_json_and_plot


QUICK = dict(compressors=("random", "topk", "dct"), compression=5.0, seeds=(0,), steps=200)


def _bench_split(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip_bench.harness import machine_record
    from actzip_bench.split_sim import SplitSimConfig, run_split_sim

    cfg = config_from_args(SplitSimConfig, args)
    if args.quick:  # one seed, fewer steps, the three compressors of the policy comparison at 5x
        cfg = dataclasses.replace(cfg, compression=QUICK["compression"], seeds=QUICK["seeds"], steps=QUICK["steps"])
    cells = [dataclasses.replace(cfg, compressor=c) for c in QUICK["compressors"]] if args.quick else [cfg]
    console = Console()
    records, t0 = [], time.perf_counter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("training", total=len(cells) * len(cfg.seeds) * len(cfg.policies))
        for cell in cells:
            records.append(run_split_sim(cell, progress=lambda done: bar.update(task, advance=1, description=done)))
    for cell, record in zip(cells, records):
        table = Table(title=f"split learning on {cell.dataset} ({cell.client} client), {cell.compressor} uplink at "
                            f"{cell.compression:g}x, "
                            f"{len(cell.seeds)} seed(s)")
        for col in ("policy", "mean accuracy", "per seed", "uplink / dense bf16", "final ratios (seed 0)"):
            table.add_column(col)
        for p in cell.policies:
            rows = [r for r in record["rows"] if r["policy"] == p]
            share = sum(r["uplink_bytes"] / r["dense_bytes"] for r in rows) / len(rows)
            table.add_row(p, f"{record['mean_accuracy'][p]:.3f}", " ".join(f"{r['accuracy']:.3f}" for r in rows),
                          f"{share:.3f}", " ".join(f"{v:.2f}" for v in rows[0]["ratios"]))
        console.print(table)
    out = records[0] if not args.quick else {"quick": True, "config": records[0]["config"], "cells": records,
                                              "rows": [r for rec in records for r in rec["rows"]]}
    out["wall_s"] = time.perf_counter() - t0
    out["machine"] = machine_record(torch.device("cpu"))
    out["command"] = command_line(args)
    write_json(out, args.json, console)
    return 0


def _bench_split_link(args: argparse.Namespace) -> int:
    import time

    import torch
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip.errors import ConfigError
    from actzip.wire.link import netns_unavailable_reason, shaping_qdisc
    from actzip_bench.harness import machine_record
    from actzip_bench.split_link import SplitLinkConfig, plot, run_split_link

    cfg = config_from_args(SplitLinkConfig, args)  # the options first: a bad one is named wherever it runs
    why = netns_unavailable_reason(shaped=True)
    if why is not None:
        raise ConfigError(f"bench split-link needs a shaped link: {why}")
    console = Console()
    t0 = time.perf_counter()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("running", total=2 * len(cfg.cells))
        record = run_split_link(cfg, progress=lambda done: bar.update(task, advance=1, description=done))
    table = Table(title=f"split learning, {cfg.clients} client(s) served in turn, {cfg.policy} keep-ratios, "
                        f"clients {cfg.link}, server {cfg.server_link} ({shaping_qdisc()}), median of {cfg.steps} "
                        "steps")
    for col in ("cell", "up kB", "down kB", "unshaped ms", "measured ms", "model ms", "model vs measured",
                "speedup vs dense"):
        table.add_column(col, justify="right")
    for r in record["rows"]:
        speedup = f"{r['speedup_vs_dense']:.2f}x" if r["speedup_vs_dense"] is not None else "-"
        table.add_row(r["cell"], f"{r['up_bytes'] / 1e3:.1f}", f"{r['down_bytes'] / 1e3:.1f}",
                      f"{1e3 * r['unshaped_step_s']:.1f}", f"{1e3 * r['measured_step_s']:.1f}",
                      f"{1e3 * r['model_step_s']:.1f}", f"{r['model_error']:+.1%}", speedup)
    console.print(table)
    for r in record["rows"]:
        if r["scoring_share"] is not None:
            console.print(f"{r['cell']}: ModalShare's scores (every {cfg.refresh} steps) took "
                          f"{r['scoring_share']:.1%} of the server's work (unshaped run)")
    record.update({"shaping": shaping_qdisc(), "wall_s": time.perf_counter() - t0,
                   "machine": machine_record(torch.device("cpu")), "command": command_line(args)})
    write_json_and_plot(record, args.json, console, plot)
    return 0


def add_parsers(bench) -> None:
    """Add ``split`` and ``split-link`` to ``actzip bench``."""
    sb = bench.add_parser("split", help="split learning: keep-ratio policies at one budget under one compressor")
    sb.add_argument("--compression", type=float, help="the modalities' dense bf16 payload / the payload sent")
    sb.add_argument("--compressor", help="random, topk, dct (SL-FAC) or quant (default random)")
    sb.add_argument("--dataset", help="synthetic (default), digits, spoken-digits (needs espeak-ng), crema-d or mvsa "
                    "(read from --data-root)")
    sb.add_argument("--data-root", help="the local copy of crema-d or mvsa")
    sb.add_argument("--client", help="linear (default) or conv: spatial modalities through a convolution, feature "
                    "maps sent with space last (what SL-FAC's DCT runs along)")
    sb.add_argument("--channels", type=int, help="feature maps of a convolutional encoder (default 8)")
    sb.add_argument("--policies", help="comma-separated (default: equal,equal-payload,gradient-norm,std,modalshare)")
    sb.add_argument("--absent", help="ModalShare's stand-in for a modality outside a coalition: zeros (default) or "
                    "mean (its features' batch mean)")
    sb.add_argument("--score-on", help="what the score-driven policies score: received (default: the batch just "
                    "trained on) or heldout (a batch of training samples they never train on, sent in place of a "
                    "training batch at each refresh)")
    sb.add_argument("--score-at", help="with --score-on heldout: the keep-ratios the held-out batch is sent at, "
                    "current (default: the policy's own), equal (the equal ones, the same payload) or raised (the policy's own, "
                    "each at least the equal one, scaled to the same payload)")
    sb.add_argument("--switch-step", type=int, help="synthetic suite only: from this step on the image stream "
                    "carries the class and the sensor is silent (training and test samples after the switch)")
    sb.add_argument("--rounding", help="how dct and quant round their codes, both ways: stochastic (default: unbiased "
                    "on what they send) or nearest (biased, less noise)")
    sb.add_argument("--levels", help="how dct codes its bands, both ways: uniform (default: the min-max grid) or "
                    "fitted (that or a unit Gaussian's Lloyd-Max levels with one scale a group, whichever leaves less "
                    "error)")
    sb.add_argument("--steps", type=int)
    sb.add_argument("--refresh", type=int, help="steps between ModalShare's score refreshes")
    sb.add_argument("--explore", type=float, help="share of its equal keep-ratio every modality keeps under the "
                    "score-driven policies (default 0.1)")
    sb.add_argument("--seeds", help="comma-separated (default 0,1,2)")
    sb.add_argument("--quick", action="store_true",
                    help="random, topk and dct at 5x, one seed, 200 steps, in one record (a few minutes on 2 cores)")
    sb.add_argument("--json", help="write the record here")
    sb.set_defaults(func=_bench_split)
    sl = bench.add_parser("split-link", help="the split-learning runtime as processes over a real shaped link, "
                          "measured against the link model (root)")
    sl.add_argument("--cells", help="comma-separated compressor:compression or dense (default: dense,quant:2,"
                    "quant:4,topk:5,topk:20,dct:20)")
    sl.add_argument("--policy", help="equal (default) or modalshare")
    sl.add_argument("--refresh", type=int, help="steps between ModalShare's refreshes (default 5)")
    sl.add_argument("--clients", type=int, help="client processes, served in turn (default 1)")
    sl.add_argument("--bandwidth-mbps", type=float, help="every client's uplink rate in Mbit/s (default 10)")
    sl.add_argument("--server-mbps", type=float, help="the server's uplink rate in Mbit/s (default: the clients')")
    sl.add_argument("--latency-ms", type=float, help="one-way latency in ms, added in software (default 20)")
    sl.add_argument("--batch", type=int, help="samples a client step (default 256)")
    sl.add_argument("--steps", type=int, help="timed steps, after the warm-up (default 20)")
    sl.add_argument("--warmup", type=int, help="steps before the timing (default 3)")
    sl.add_argument("--json", help="write the record here")
    sl.set_defaults(func=_bench_split_link)
