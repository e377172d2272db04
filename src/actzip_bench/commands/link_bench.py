"""``actzip bench link``: messages, and two ranks' all-gathers, timed over a real shaped link (network namespaces,
``tc``) against the link model's time for them, per size."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import command_line, write_json


def _bench_link(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console

    from actzip.errors import ConfigError
    from actzip.wire.link import LinkSpec, netns_unavailable_reason, shaping_qdisc
    from actzip.wire.link_probe import DEFAULT_SIZES, gather_times, model_seconds, transfer_times
    from actzip.wire.replay import dp_sync_seconds
    from actzip_bench.harness import machine_record

    try:  # the options first: a bad one is named wherever the command runs
        sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else DEFAULT_SIZES
    except ValueError:
        raise ConfigError(f"--sizes takes comma-separated byte counts, got {args.sizes!r}") from None
    why = netns_unavailable_reason(shaped=True)
    if why is not None:
        raise ConfigError(f"bench link needs a shaped link: {why}")
    link = LinkSpec(bandwidth_mbps=args.mbps)
    console = Console()
    console.print(f"timing {len(sizes)} message sizes x {args.repeats} over a {args.mbps:g} Mbit/s shaped link")
    got = transfer_times(link, sizes, repeats=args.repeats, idle_s=args.idle)
    rows = [{"bytes": n, "measured_s": got[n], "model_s": model_seconds(link, n)} for n in sizes]
    console.print(_table(f"{args.mbps:g} Mbit/s ({shaping_qdisc()}), median of {args.repeats}", "bytes", rows))
    console.print(f"timing all-gathers of {len(sizes)} sizes x {args.repeats} between two ranks, each uplink shaped")
    got = gather_times(link, sizes, repeats=args.repeats, idle_s=args.idle)
    gathers = [{"bytes": n, "measured_s": got[n], "model_s": dp_sync_seconds({"all_gather": n}, 2, link)}
               for n in sizes]
    console.print(_table(f"all-gathers of two gloo ranks, the slower rank's time, median of {args.repeats}",
                         "bytes a rank", gathers))
    record = {"config": {"mbps": args.mbps, "sizes": list(sizes), "repeats": args.repeats, "idle_s": args.idle},
              "rows": rows, "gathers": gathers, "shaping": shaping_qdisc(),
              "machine": machine_record(torch.device("cpu")), "command": command_line(args)}
    write_json(record, args.json, console)
    return 0


def _table(title: str, first: str, rows: list[dict]):
    """A rich table of measured against modelled times, one row per size."""
    from rich.table import Table

    t = Table(title=title)
    for col in (first, "measured ms", "model ms", "model vs measured"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(f"{r['bytes']:,}", f"{1e3 * r['measured_s']:.2f}", f"{1e3 * r['model_s']:.2f}",
                  f"{r['model_s'] / r['measured_s'] - 1:+.1%}")
    return t


def add_parsers(bench) -> None:
    """Add ``link`` to ``actzip bench``."""
    lb = bench.add_parser("link", help="messages and two ranks' all-gathers timed over a real shaped link against "
                          "the link model (root)")
    lb.add_argument("--mbps", type=float, default=200.0, help="the link's rate in Mbit/s (default 200)")
    lb.add_argument("--sizes", help="comma-separated message sizes in bytes (default 16 kB to 4 MB)")
    lb.add_argument("--repeats", type=int, default=7, help="messages of each size; the median counts (default 7)")
    lb.add_argument("--idle", type=float, default=0.2, help="seconds idle before each message (default 0.2)")
    lb.add_argument("--json", help="write the record here")
    lb.set_defaults(func=_bench_link)
