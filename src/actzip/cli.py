"""The ``actzip`` command."""

from __future__ import annotations

import argparse
import sys

from actzip.core.errors import ActzipError


# Options given as comma-separated lists on the command line, and the type of their items.
_LIST_OPTIONS = {"strategies": str, "seq_lens": int, "presets": str}


def _config(cls, args: argparse.Namespace):
    """A config dataclass from the options the user gave (the others keep the dataclass defaults)."""
    fields = {k: v for k, v in vars(args).items() if k in cls.__dataclass_fields__ and v is not None}
    for key, item in _LIST_OPTIONS.items():
        if isinstance(fields.get(key), str):
            fields[key] = tuple(item(p) for p in fields[key].split(","))
    return cls(**fields)


def _device(args: argparse.Namespace):
    import torch

    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _command(args: argparse.Namespace) -> str:
    return " ".join(["actzip", *args.argv])


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actzip.bench.demo import DemoConfig, render, run_demo, write_json

    cfg = _config(DemoConfig, args)
    console = Console()
    console.print(f"[bold]actzip demo[/]: {cfg.steps} steps of a {cfg.activation} GPT ({cfg.preset}), strategies "
                  f"{', '.join(cfg.strategies)}")
    result = run_demo(cfg, progress=not args.no_progress)
    result["command"] = _command(args)
    console.print(render(result))
    if args.json:
        write_json(result, args.json)
        console.print(f"wrote {args.json}")
    return 0


def _bench_ffn(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip.bench.ffn import FFNBenchConfig, run_ffn

    cfg = _config(FFNBenchConfig, args)
    device = _device(args)
    console = Console()
    console.print(f"[bold]FFN stack[/]: {cfg.n_blocks} blocks, d={cfg.d}, hidden={cfg.hidden}, rows={cfg.rows}, "
                  f"{cfg.dtype}, density {cfg.density}, on {device}")
    record = run_ffn(cfg, device)
    record["command"] = _command(args)
    t = Table(title=f"measured density {record['density']:.3f}")
    for col in ("strategy", "median ms", "vs none", "peak GiB", "vs none", "max|Δgrad|"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in record["runs"]:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
        t.add_row(r["strategy"], f"{r['median_ms']:.2f}", f"{r['time_vs_none'] - 1:+.2%}", peak, rel,
                  f"{r['max_grad_abs_diff']:.3g}")
    console.print(t)
    _write_json(record, args.json, console)
    return 0


def _bench_gpt(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip.bench.gpt_memory import GPTBenchConfig, run_gpt

    cfg = _config(GPTBenchConfig, args)
    device = _device(args)
    console = Console()
    record = run_gpt(cfg, device)
    record["command"] = _command(args)
    t = Table(title=f"reference GPT ({cfg.preset}, {cfg.dtype}), {cfg.tokens_per_step} tokens/step, {device}")
    for col in ("seq", "strategy", "median ms", "vs none", "peak KiB/token", "vs none"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in record["runs"]:
        peak = "n/a" if r["peak_bytes_per_token"] is None else f"{r['peak_bytes_per_token'] / 1024:.1f}"
        rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
        t.add_row(str(r["seq_len"]), r["strategy"], f"{r['median_ms']:.2f}", f"{r['time_vs_none'] - 1:+.2%}", peak, rel)
    console.print(t)
    _write_json(record, args.json, console)
    return 0


def _bench_bits(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip.bench.bits import BitsBenchConfig, run_bits

    cfg = _config(BitsBenchConfig, args)
    device = _device(args)
    console = Console()
    record = run_bits(cfg, device)
    record["command"] = _command(args)
    t = Table(title=f"bits/element on relu(h) of a {cfg.preset} ReLU² GPT after {cfg.steps} steps ({cfg.dtype})")
    for col in ("layer", "density", "bound", "codec", "bound (sign)", "codec (sign)", "codec/bound (sign)"):
        t.add_column(col, justify="right")
    for r in record["layers"]:
        t.add_row(str(r["layer"]), f"{r['density']:.3f}", f"{r['bound_bits']:.2f}", f"{r['codec_bits']:.2f}",
                  f"{r['bound_bits_signpack']:.2f}", f"{r['codec_bits_signpack']:.2f}",
                  f"{r['codec_bits_signpack'] / r['bound_bits_signpack']:.3f}")
    console.print(t)
    _write_json(record, args.json, console)
    return 0


def _bench_kernels(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from actzip.bench.kernels import KernelBenchConfig, run_kernels

    if not torch.cuda.is_available():
        raise ActzipError("actzip bench kernels times GPU kernels: it needs a CUDA device")
    cfg = KernelBenchConfig(**({"numel": args.numel} if args.numel else {}))
    console = Console()
    record = run_kernels(cfg, torch.device("cuda"))
    record["command"] = _command(args)
    t = Table(title=f"sparse kernels, {cfg.numel:,} elements; copy bandwidth {record['copy_bandwidth'] / 1e12:.2f} TB/s")
    for col in ("dtype", "density", "sign", "exact", "encode ms", "enc % copy", "decode ms", "dec % copy"):
        t.add_column(col, justify="right")
    for r in record["runs"]:
        t.add_row(r["dtype"], f"{r['density']:.2f}", str(r["sign_pack"]), str(r["exact"]), f"{r['encode_s'] * 1e3:.3f}",
                  f"{r['encode_frac_copy']:.0%}", f"{r['decode_s'] * 1e3:.3f}", f"{r['decode_frac_copy']:.0%}")
    console.print(t)
    _write_json(record, args.json, console)
    return 0


def _bench_presets(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip.bench.presets import PresetBenchConfig, plot, run_presets

    cfg = _config(PresetBenchConfig, args)
    device = _device(args)
    console = Console()
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=cfg.steps * len(cfg.presets))
        record = run_presets(cfg, device, progress=lambda name, step: bar.update(task, advance=1, description=name))
    record["command"] = _command(args)
    t = Table(title=f"{cfg.model} {cfg.activation} GPT, {cfg.steps} steps per preset, {device}")
    for col in ("preset", "saved B/token", "vs lossless", "final train loss", "val loss", "val gap", "step ms"):
        t.add_column(col, justify="left" if col == "preset" else "right")
    ref = record["runs"][0]
    for r in record["runs"]:
        t.add_row(r["preset"], f"{r['saved_bytes_per_token']:,.0f}",
                  f"{r['saved_bytes_per_token'] / ref['saved_bytes_per_token'] - 1:+.1%}", f"{r['final_train_loss']:.4f}",
                  f"{r['val_loss']:.4f}", f"{r['val_loss_gap']:+.2%}", f"{r['step_time_s'] * 1e3:.1f}")
    console.print(t)
    _write_json(record, args.json, console)
    if args.json:
        png = Path(args.json).with_suffix(".png")
        plot(record, png)
        console.print(f"wrote {png}")
    return 0


def _write_json(record: dict, path: str | None, console) -> None:
    import json
    from pathlib import Path

    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(record, indent=2) + "\n")
        console.print(f"wrote {path}")


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from actzip.bench.report import write

    print(f"wrote {write(Path(args.root))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="actzip", description="Compress PyTorch activations where they are held or sent.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="train a ReLU² GPT with no compression, checkpointing and the sparse cache")
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
    b = sub.add_parser("bench", help="benchmarks (results as JSON for results/)")
    bsub = b.add_subparsers(dest="bench", required=True)
    f = bsub.add_parser("ffn", help="residual ReLU² FFN stack: peak memory and step time per strategy")
    f.add_argument("--d", type=int, help="width (default 4096)")
    f.add_argument("--rows", type=int, help="tokens per step (default 16384)")
    f.add_argument("--n-blocks", type=int, dest="n_blocks", help="blocks (default 8)")
    f.add_argument("--density", choices=["mid", "low"], help="mid: ~50%% non-zero, low: ~20%%")
    f.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    f.add_argument("--kernel", choices=["auto", "torch", "triton"])
    f.add_argument("--rounds", type=int)
    f.add_argument("--warmup", type=int)
    f.add_argument("--strategies", help="comma-separated subset of none,checkpoint,cache,fused,fused-arena,fused-arena-signpack")
    f.add_argument("--device")
    f.add_argument("--json", metavar="PATH")
    f.set_defaults(func=_bench_ffn)
    gp = bsub.add_parser("gpt", help="reference ReLU² GPT: per-token peak memory and step time per strategy")
    gp.add_argument("--preset", help="model size (default gpt2-124m)")
    gp.add_argument("--seq-lens", dest="seq_lens", help="comma-separated (default 1024,4096,8192)")
    gp.add_argument("--tokens-per-step", type=int, dest="tokens_per_step")
    gp.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    gp.add_argument("--kernel", choices=["auto", "torch", "triton"])
    gp.add_argument("--rounds", type=int)
    gp.add_argument("--warmup", type=int)
    gp.add_argument("--strategies", help="comma-separated subset of none,checkpoint,fused,fused-arena,fused-arena-signpack")
    gp.add_argument("--device")
    gp.add_argument("--json", metavar="PATH")
    gp.set_defaults(func=_bench_gpt)
    kb = bsub.add_parser("kernels", help="sparse-codec kernel throughput vs the measured copy bandwidth (CUDA)")
    kb.add_argument("--numel", type=int, help="elements per tensor (default 2**28)")
    kb.add_argument("--json", metavar="PATH")
    kb.set_defaults(func=_bench_kernels)
    pb = bsub.add_parser("presets", help="loss curves of the activation-cache presets on the reference GPT")
    pb.add_argument("--model", help="GPT preset (default tiny)")
    pb.add_argument("--activation", choices=["relu", "relu2", "gelu"])
    pb.add_argument("--presets", help="comma-separated (default lossless,conservative,balanced,aggressive)")
    pb.add_argument("--steps", type=int)
    pb.add_argument("--batch-size", type=int, dest="batch_size")
    pb.add_argument("--device")
    pb.add_argument("--json", metavar="PATH", help="also writes PATH with .png: the loss curves")
    pb.set_defaults(func=_bench_presets)
    bb = bsub.add_parser("bits", help="codec bits per element vs the entropy bound on a trained ReLU² GPT")
    bb.add_argument("--preset")
    bb.add_argument("--steps", type=int)
    bb.add_argument("--batch-size", type=int, dest="batch_size")
    bb.add_argument("--dtype", choices=["bfloat16", "float16", "float32", "float8_e4m3fn"])
    bb.add_argument("--device")
    bb.add_argument("--json", metavar="PATH")
    bb.set_defaults(func=_bench_bits)
    r = sub.add_parser("report", help="write docs/RESULTS.md from the JSON files under results/")
    r.add_argument("--root", default=".", help="project root (default: the current directory)")
    r.set_defaults(func=_report)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except ActzipError as e:
        print(f"actzip: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
