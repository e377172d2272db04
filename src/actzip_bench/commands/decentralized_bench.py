"""``actzip bench decentralized``: two-circuit training (masked pipeline + compressed data parallel + anchors)
against the trivial wire baselines, on S stages x R replicas under torchrun."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import command_line, config_from_args, device_from_args, write_json_and_plot


def _bench_decentralized(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console
    from rich.progress import Progress

    from actzip_bench.decentralized import DecentralizedRunError, run_decentralized
    from actzip_bench.decentralized_config import DecentralizedBenchConfig

    if args.merge:
        import json

        from actzip_bench.decentralized import merge_records

        records = []
        for path in args.merge.split(","):
            with open(path) as f:
                records.append(json.load(f))
        record = merge_records(records)
        dropped = [p for p, rec in zip(args.merge.split(","), records) if rec.get("link_calibration")]
        if dropped and not args.link_calibration:
            Console(stderr=True).print(f"bench decentralized --merge: the link calibration of {', '.join(dropped)} "
                                       "was dropped (give --link-calibration to calibrate every seed alike)")
        if args.speed:
            from actzip_bench.decentralized import with_speed

            with open(args.speed) as f:
                record = with_speed(record, json.load(f))
        if args.link_calibration:
            from actzip_bench.decentralized import with_calibration

            record = with_calibration(record, _probe(args.link_calibration))
        cfg = DecentralizedBenchConfig(**{k: tuple(tuple(x) for x in v) if k == "links" else
                                          tuple(v) if isinstance(v, list) else v for k, v in record["config"].items()})
        record["command"] = command_line(args)
        return _report(record, cfg, args, Console(width=max(Console().width, 160)))
    if args.speed:
        from actzip.errors import ConfigError

        raise ConfigError("bench decentralized: --speed replaces the step times of merged records; give --merge too")
    cfg = config_from_args(DecentralizedBenchConfig, args)
    if args.quick:  # the quick settings, except where an option was given
        given = {k: getattr(cfg, k) for k in DecentralizedBenchConfig.__dataclass_fields__
                 if getattr(args, k, None) is not None}
        cfg = dataclasses.replace(DecentralizedBenchConfig.quick(), **given)
    if args.link_calibration:
        from actzip_bench.decentralized import calibration_fields

        probe = _probe(args.link_calibration)
        cfg = dataclasses.replace(cfg, **calibration_fields(probe))
    console = Console(width=max(Console().width, 160))
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("training", total=len(cfg.seeds) * len(cfg.tasks) * len(cfg.methods))
        def progress(done: str) -> None:
            bar.update(task, advance=1, description=done)
            bar.console.log(f"trained {done}")

        try:
            record = run_decentralized(cfg, progress=progress, log=bar.console.log, device=device_from_args(args))
        except DecentralizedRunError as e:
            if e.record is not None:  # the runs that finished before the failure: reported and written, marked
                e.record["command"] = command_line(args)
                console.print("[bold red]the training failed; the runs finished before it (the record says "
                              "'failed'):[/]")
                done = dataclasses.replace(cfg, seeds=tuple(e.record["config"]["seeds"]),
                                           tasks=tuple(e.record["config"]["tasks"]))
                _report(e.record, done, args, console)
            raise
    record["command"] = command_line(args)
    if args.link_calibration:
        from actzip_bench.decentralized import calibration_source

        record["link_calibration"] = calibration_source(probe)
    return _report(record, cfg, args, console)


def _probe(path: str) -> dict:
    """An ``actzip bench link`` record with its all-gathers, or a clear error."""
    import json

    from actzip.errors import ConfigError

    try:
        with open(path) as f:
            probe = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"bench decentralized --link-calibration: cannot read {path!r}: {e}") from None
    if not isinstance(probe, dict) or not probe.get("gathers") or "mbps" not in probe.get("config", {}):
        raise ConfigError(f"bench decentralized --link-calibration: {path!r} is not a `bench link` record with "
                          "all-gathers")
    return probe


def _report(record: dict, cfg, args: argparse.Namespace, console) -> int:
    from actzip_bench.decentralized_render import plot, table

    for t in cfg.tasks:
        console.print(table(record, t))
    write_json_and_plot(record, args.json, console, plot)
    return 0


def add_parsers(bench) -> None:
    """Add ``decentralized`` to ``actzip bench``."""
    db = bench.add_parser("decentralized", help="two-circuit training over slow links: masked pipeline + "
                          "compressed data parallel + anchors, against bf16 / 8-bit / 4-bit / delta wires")
    db.add_argument("--quick", action="store_true", help="a small run for a 2-core CPU (under 5 minutes)")
    db.add_argument("--n-layer", type=int, dest="n_layer")
    db.add_argument("--n-embd", type=int, dest="n_embd")
    db.add_argument("--block-size", type=int, dest="block_size")
    db.add_argument("--stages", type=int, help="pipeline stages (2-4, default 2)")
    db.add_argument("--replicas", type=int, help="data-parallel replicas of each stage (default 2)")
    db.add_argument("--batch-size", type=int, dest="batch_size", help="sequences per replica per step")
    db.add_argument("--microbatches", type=int)
    db.add_argument("--schedule", choices=["gpipe", "1f1b"])
    db.add_argument("--device", help="cpu or cuda (default: cuda when there is one); ranks beyond the GPUs share them")
    db.add_argument("--pretrain-steps", type=int, dest="pretrain_steps")
    db.add_argument("--steps", type=int, help="steps of each task")
    db.add_argument("--lr", type=float)
    db.add_argument("--until-target", type=float, dest="until_target",
                    help="a method that has not reached dense's final loss after --steps trains on until it does, "
                    "up to this multiple of --steps (default 1: never past them); final losses stay at --steps")
    db.add_argument("--mask-keep", type=float, dest="mask_keep",
                    help="fraction of the elements the boundary masks keep (default 0.125)")
    db.add_argument("--anchor-codec", dest="anchor_codec",
                    help="the anchor passes' wire codec both ways (default none: float32; e.g. cast:dtype=bfloat16)")
    db.add_argument("--spectral-decay", type=float, dest="spectral_decay",
                    help="weight of the correction's old averages when an anchor arrives (default: 0.9, "
                    "and 0 for the debias correction)")
    db.add_argument("--shaped-link", dest="shaped_link", metavar="MBPS,MS",
                    help="every rank in a network namespace of its own, each one's uplink shaped to this bandwidth "
                    "and one-way latency (root; `tc tbf` with the latency added by the senders where the kernel "
                    "has no netem): step times and times to target measured on it beside the link model's")
    db.add_argument("--dense-off-link", action="store_const", const=True, dest="dense_off_link",
                    help="with --shaped-link: dense (the loss reference) trains on this host first, the other "
                    "methods on the shaped link (values never depend on the link; dense's time there is the model's)")
    db.add_argument("--keep-replay", action="store_const", const=True, dest="keep_replay",
                    help="keep each run's measured schedule in the record, so the link model can replay it "
                    "again (about a megabyte per 50 rows)")
    db.add_argument("--link-calibration", dest="link_calibration", metavar="PATH",
                    help="an `actzip bench link` record from the machine that runs (or ran, with --merge): each "
                    "modelled link of its rate is replayed again with the syncs at its measured all-gather times "
                    "(`... calibrated` links; with --merge the records must keep their schedule, --keep-replay)")
    db.add_argument("--methods", help="comma-separated methods (default all; docs/wire.md lists them, an unknown "
                    "name is refused with the list)")
    db.add_argument("--tasks", help="comma-separated tasks: domain, continual (default both)")
    db.add_argument("--seeds", help="comma-separated seeds (default 0,1,2)")
    db.add_argument("--json", help="write the record here (and a plot next to it)")
    db.add_argument("--merge", help="comma-separated records of the same config on other seeds: one record of "
                    "all of them (no training)")
    db.add_argument("--speed", help="with --merge: a record of the same shapes run alone on the machine; its step "
                    "times replace the merged runs' (runs side by side share the GPU), times to target follow")
    db.set_defaults(func=_bench_decentralized)
