"""``actzip report``: docs/RESULTS.md from the JSON files under results/, and the figure blocks of README.md and
docs/*.md re-rendered in place (``--check``: list the stale ones, write nothing)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actzip_bench import figures
from actzip_bench.report import check_root, find_root, write


def _report(args: argparse.Namespace) -> int:
    root = check_root(Path(args.root)) if args.root else find_root()
    if args.check:
        stale = figures.stale(root)
        for where in stale:
            print(f"out of date: {where}", file=sys.stderr)
        print(f"{len(stale)} figure block(s) out of date; `actzip report` re-renders them" if stale
              else "every figure block is current")
        return 1 if stale else 0
    print(f"wrote {write(root, Path(args.out) if args.out else None)}")
    for path in figures.update(root):
        print(f"re-rendered the figures of {path}")
    return 0


def add_parsers(commands) -> None:
    """Add ``report`` to the top-level subcommands."""
    r = commands.add_parser("report", help="write docs/RESULTS.md from the JSON files under results/ and re-render "
                            "the figure blocks of README.md and docs/*.md")
    r.add_argument("--root", help="project root, the folder with results/ and docs/ (default: the current "
                   "directory or the nearest one above it with both)")
    r.add_argument("--out", metavar="PATH", help="write the report here instead of ROOT/docs/RESULTS.md (its links "
                   "stay relative to docs/)")
    r.add_argument("--check", action="store_true", help="write nothing; list the figure blocks whose text differs "
                   "from what their renderers make from results/ (exit status 1 if any)")
    r.set_defaults(func=_report)
