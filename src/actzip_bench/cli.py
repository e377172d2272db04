"""The ``actzip`` command: the parser and the dispatch; each subcommand lives in :mod:`actzip_bench.commands`."""

from __future__ import annotations

import argparse
import sys

from actzip.errors import ActzipError
from actzip_bench.commands import (decentralized_bench, demo, link_bench, memory_bench, prompt_bench, report,
                                    split_bench, training_bench, wire_bench)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="actzip", description="Compress PyTorch activations where they are held or sent.")
    sub = p.add_subparsers(dest="command", required=True)
    demo.add_parsers(sub)
    b = sub.add_parser("bench", help="benchmarks (results as JSON for results/)")
    bench = b.add_subparsers(dest="bench", required=True)
    memory_bench.add_parsers(bench)
    training_bench.add_parsers(bench)
    wire_bench.add_parsers(bench)
    decentralized_bench.add_parsers(bench)
    link_bench.add_parsers(bench)
    split_bench.add_parsers(bench)
    prompt_bench.add_parsers(bench)
    report.add_parsers(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one ``actzip`` command; 2 (and the message on stderr) for an actzip error."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    args.main = main  # for commands that run other commands (bench memory)
    try:
        return args.func(args)
    except ActzipError as e:
        print(f"actzip: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
