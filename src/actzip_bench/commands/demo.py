"""``actzip demo``: a ReLU² GPT trained with no compression, checkpointing and the sparse cache."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import command_line, config_from_args


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actzip_bench.demo import DemoConfig, render, run_demo, write_json

    cfg = config_from_args(DemoConfig, args)
    console = Console()
    console.print(f"[bold]actzip demo[/]: {cfg.steps} steps of a {cfg.activation} GPT ({cfg.preset}), strategies "
                  f"{', '.join(cfg.strategies)}")
    result = run_demo(cfg, progress=not args.no_progress)
    result["command"] = command_line(args)
    console.print(render(result))
    if args.json:
        write_json(result, args.json)
        console.print(f"wrote {args.json}")
    return 0


def add_parsers(commands) -> None:
    """Add ``demo`` to the top-level subcommands."""
    d = commands.add_parser("demo", help="train a ReLU² GPT with no compression, checkpointing and the sparse cache")
    d.add_argument("--steps", type=int, help="training steps (default 60)")
    d.add_argument("--preset", help="model size: tiny, small (default), gpt2-124m")
    d.add_argument("--activation", choices=["relu", "relu2", "gelu"], help="MLP activation (default relu2)")
    d.add_argument("--batch-size", type=int, dest="batch_size", help="sequences per step (default 8)")
    d.add_argument("--block-size", type=int, dest="block_size", help="tokens per sequence (default: the preset's)")
    d.add_argument("--device", help="auto (default), cpu, cuda, cuda:1, ...")
    d.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], help="weights dtype (default: bf16 on CUDA)")
    d.add_argument("--text-file", dest="text_file", help="train on this text file instead of the stdlib source")
    d.add_argument("--seed", type=int)
    d.add_argument("--nondeterministic", dest="deterministic", action="store_false", default=None,
                   help="allow nondeterministic GPU kernels (faster; gradients then differ run to run)")
    d.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(func=_demo)
