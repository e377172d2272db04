"""``actzip report``: docs/RESULTS.md from the JSON files under results/."""

from __future__ import annotations

import argparse
from pathlib import Path

from actzip_bench.report import find_root, write


def _report(args: argparse.Namespace) -> int:
    root = Path(args.root) if args.root else find_root()
    print(f"wrote {write(root, Path(args.out) if args.out else None)}")
    return 0


def add_parsers(commands) -> None:
    """Add ``report`` to the top-level subcommands."""
    r = commands.add_parser("report", help="write docs/RESULTS.md from the JSON files under results/")
    r.add_argument("--root", help="project root, the folder with results/ and docs/ (default: the current "
                   "directory or the nearest one above it with both)")
    r.add_argument("--out", metavar="PATH", help="write the report here instead of ROOT/docs/RESULTS.md (its links "
                   "stay relative to docs/)")
    r.set_defaults(func=_report)
