"""``actzip bench wire``: pipeline training over slow links, dense against each boundary compressor."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import (command_line, config_from_args, device_from_args, write_json_and_plot,
                                          write_partial)


def _bench_wire(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console
    from rich.progress import Progress

    from actzip_bench.wire import QUICK, WireBenchConfig, run_wire
    from actzip_bench.wire_render import plot, render

    cfg = config_from_args(WireBenchConfig, args)
    if args.quick:  # the quick settings, except where an option was given
        cfg = dataclasses.replace(cfg, **{k: v for k, v in QUICK.items() if getattr(args, k, None) is None})
    device = device_from_args(args)
    console = Console(width=max(Console().width, 132))  # the table has ten columns
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=cfg.steps * len(cfg.compressors))
        record = run_wire(cfg, device, progress=lambda name, step: bar.update(
            task, advance=1 if step < cfg.steps else 0, description=f"{name} step {step + 1}"),
            on_entry=lambda partial: write_partial(partial, args, bar.console))
    record["command"] = command_line(args)
    console.print(render(record))
    write_json_and_plot(record, args.json, console, plot)
    return 0


def add_parsers(bench) -> None:
    """Add ``wire`` to ``actzip bench``."""
    wb = bench.add_parser("wire", help="pipeline training over slow links: dense vs each boundary compressor")
    wb.add_argument("--quick", action="store_true", help="a small run for a 2-core CPU (under 3 minutes)")
    wb.add_argument("--model", help="GPT preset (default small)")
    wb.add_argument("--n-layer", type=int, dest="n_layer")
    wb.add_argument("--n-embd", type=int, dest="n_embd")
    wb.add_argument("--n-head", type=int, dest="n_head")
    wb.add_argument("--block-size", type=int, dest="block_size")
    wb.add_argument("--stages", type=int, help="pipeline stages (default 2)")
    wb.add_argument("--compressors", help="comma-separated name:ratio entries (dense, bf16, quant:8, mask:8, topk:8, "
                    "delta:8, subspace:100, bottleneck:100, stiefel:16, stiefel-rvq:100, ...), each optionally "
                    "with its own learning rate: subspace:100@2e-3 (several dense entries: the best sets the target)")
    wb.add_argument("--boundary", help="boundary config overrides for every stage compressor, e.g. "
                    "anchor_rank=256,lr=1e-4 (StiefelConfig, SubspaceConfig, BottleneckConfig fields)")
    wb.add_argument("--bwd-codec", dest="bwd_codec", help="backward codec spec for the byte codecs and the stage "
                    "compressors' code gradients (default: follow the forward one; dense stays raw)")
    wb.add_argument("--stage-codec", dest="stage_codec", help="byte codec on the stage compressors' codes, both "
                    "ways unless --bwd-codec is given, e.g. quant:bits=8 (default: raw codes)")
    wb.add_argument("--bandwidths", help="comma-separated link speeds in Mbps (default 80,200)")
    wb.add_argument("--latency-ms", type=float, dest="latency_ms", help="one-way link latency (default 50)")
    wb.add_argument("--schedule", choices=["gpipe", "1f1b"])
    wb.add_argument("--microbatches", type=int)
    wb.add_argument("--batch-size", type=int, dest="batch_size")
    wb.add_argument("--steps", type=int)
    wb.add_argument("--lr", type=float)
    wb.add_argument("--lr-schedule", dest="lr_schedule", choices=["constant", "cosine"],
                    help="constant (default) or cosine: 5%% warm-up, decay to lr/10 over --steps")
    wb.add_argument("--optimizer", choices=["adamw", "muon"],
                    help="adamw (default) or muon: Muon on the hidden matrices, AdamW on the rest, at --lr")
    wb.add_argument("--stage-lr-scale", dest="stage_lr_scale",
                    help="one learning-rate factor per stage, comma-separated (0.3,1: the first stage at 0.3 lr)")
    wb.add_argument("--seed", type=int)
    wb.add_argument("--matmul-precision", dest="matmul_precision", choices=["highest", "high", "medium"],
                    help="float32 matmuls: highest (default) or high (TF32 on GPUs with it)")
    wb.add_argument("--dataset-windows", type=int, dest="dataset_windows",
                    help="train on a fixed set of this many windows (delta needs repeated samples); 0: fresh "
                    "windows every step (default 4096)")
    wb.add_argument("--target-steps", type=float, dest="target_steps",
                    help="runs short of dense's final loss train on up to this many times --steps (default 2)")
    wb.add_argument("--target-loss", type=float, dest="target_loss",
                    help="the loss to reach instead of the best dense run's (e.g. dense's from an earlier run)")
    wb.add_argument("--corpus-bytes", type=int, dest="corpus_bytes", help="bytes of the embedded corpus read")
    wb.add_argument("--mode", choices=["simulated", "processes", "netns"],
                    help="stages in one process (default), one process per stage under torchrun, or two "
                         "processes through a real netem-shaped link per bandwidth (root, sch_netem)")
    wb.add_argument("--device")
    wb.add_argument("--json", metavar="PATH", help="also writes PATH with .png: loss vs bytes and vs time")
    wb.set_defaults(func=_bench_wire)
