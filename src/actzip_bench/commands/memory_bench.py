"""``actzip bench memory|ffn|gpt|bits|kernels|quant``: the sparse cache's benchmarks and the kernel timings."""

from __future__ import annotations

import argparse

from actzip.errors import ActzipError, ConfigError
from actzip_bench.commands.common import command_line, config_from_args, device_from_args, write_json


def _bench_ffn(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip_bench.ffn import FFNBenchConfig, run_ffn

    cfg = config_from_args(FFNBenchConfig, args)
    device = device_from_args(args)
    console = Console()
    console.print(f"[bold]FFN stack[/]: {cfg.n_blocks} blocks, d={cfg.d}, hidden={cfg.hidden}, rows={cfg.rows}, "
                  f"{cfg.dtype}, {cfg.matmul} matmuls, density {cfg.density}, {cfg.harness} harness, on {device}")
    record = run_ffn(cfg, device)
    record["command"] = command_line(args)
    t = Table(title=f"measured density {record['density']:.3f}")
    for col in ("strategy", "median ms", "vs none", "peak GiB", "vs none", "max|Δgrad|"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in record["runs"]:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f}"
        rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
        t.add_row(r["strategy"], f"{r['median_ms']:.2f}", f"{r['time_vs_none'] - 1:+.2%}", peak, rel,
                  f"{r['max_grad_abs_diff']:.3g}")
    console.print(t)
    write_json(record, args.json, console)
    return 0


def _bench_gpt(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip_bench.gpt_memory import GPTBenchConfig, run_gpt

    cfg = config_from_args(GPTBenchConfig, args)
    device = device_from_args(args)
    console = Console()
    record = run_gpt(cfg, device)
    record["command"] = command_line(args)
    t = Table(title=f"{cfg.model} ({cfg.preset}, {cfg.dtype}), {cfg.tokens_per_step} tokens/step, {device}")
    for col in ("seq", "strategy", "median ms", "vs none", "peak KiB/token", "vs none", "max |Δgrad|"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in record["runs"]:
        peak = "n/a" if r["peak_bytes_per_token"] is None else f"{r['peak_bytes_per_token'] / 1024:.1f}"
        rel = "" if r["peak_vs_none"] is None else f"{r['peak_vs_none'] - 1:+.1%}"
        t.add_row(str(r["seq_len"]), r["strategy"], f"{r['median_ms']:.2f}", f"{r['time_vs_none'] - 1:+.2%}", peak, rel,
                  f"{r['max_grad_abs_diff']:.3g}")
    console.print(t)
    write_json(record, args.json, console)
    return 0


def _bench_bits(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from actzip_bench.bits import BitsBenchConfig, run_bits

    cfg = config_from_args(BitsBenchConfig, args)
    device = device_from_args(args)
    console = Console()
    record = run_bits(cfg, device)
    record["command"] = command_line(args)
    t = Table(title=f"bits/element on relu(h) of a {cfg.preset} ReLU² GPT after {cfg.steps} steps ({cfg.dtype})")
    for col in ("layer", "density", "bound", "codec", "bound (sign)", "codec (sign)", "codec/bound (sign)"):
        t.add_column(col, justify="right")
    for r in record["layers"]:
        t.add_row(str(r["layer"]), f"{r['density']:.3f}", f"{r['bound_bits']:.2f}", f"{r['codec_bits']:.2f}",
                  f"{r['bound_bits_signpack']:.2f}", f"{r['codec_bits_signpack']:.2f}",
                  f"{r['codec_bits_signpack'] / r['bound_bits_signpack']:.3f}")
    console.print(t)
    write_json(record, args.json, console)
    return 0


def _run_kernel_bench(args: argparse.Namespace, name: str, config_cls, run):
    """The shared part of the GPU kernel benchmarks: CUDA check, config from --numel, run, command recorded."""
    import torch
    from rich.console import Console

    if not torch.cuda.is_available():
        raise ActzipError(f"actzip bench {name} times GPU kernels: it needs a CUDA device")
    cfg = config_cls(**({"numel": args.numel} if args.numel else {}))
    record = run(cfg, torch.device("cuda"))
    record["command"] = command_line(args)
    return cfg, record, Console()


def _bench_kernels(args: argparse.Namespace) -> int:
    from rich.table import Table

    from actzip_bench.kernels import KernelBenchConfig, run_kernels

    cfg, record, console = _run_kernel_bench(args, "kernels", KernelBenchConfig, run_kernels)
    t = Table(title=f"sparse kernels, {cfg.numel:,} elements; copy bandwidth {record['copy_bandwidth'] / 1e12:.2f} TB/s")
    for col in ("dtype", "density", "sign", "exact", "2-pass enc ms", "% copy", "1-pass enc ms", "% copy",
                "decode ms", "% copy", "relu² enc % copy", "1-pass"):
        t.add_column(col, justify="right")

    def ms(v):
        return "" if v is None else f"{v * 1e3:.3f}"

    def pct(v):
        return "" if v is None else f"{v:.0%}"

    for r in record["runs"]:
        t.add_row(r["dtype"], f"{r['density']:.2f}", str(r["sign_pack"]), str(r["exact"]), ms(r["encode_s"]),
                  pct(r["encode_frac_copy"]), ms(r.get("encode_single_pass_s")),
                  pct(r.get("encode_single_pass_frac_copy")), ms(r["decode_s"]), pct(r["decode_frac_copy"]),
                  pct(r.get("encode_relu2_frac_copy")), pct(r.get("encode_relu2_single_pass_frac_copy")))
    console.print(t)
    write_json(record, args.json, console)
    return 0


def _bench_quant(args: argparse.Namespace) -> int:
    from rich.table import Table

    from actzip_bench.quant_kernels import QuantKernelBenchConfig, run_quant_kernels

    cfg, record, console = _run_kernel_bench(args, "quant", QuantKernelBenchConfig, run_quant_kernels)
    bw = record["copy_bandwidth"] / 1e12
    t = Table(title=f"quant/fp8 kernels, {cfg.numel:,} elements; copy bandwidth {bw:.2f} TB/s")
    for col in ("dtype", "variant", "ratio", "exact", "encode ms", "enc % copy", "decode ms", "dec % copy", "vs torch"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for r in record["runs"]:
        t.add_row(r["dtype"], r["variant"], f"{r['ratio']:.2f}", str(r["exact"]), f"{r['encode_s'] * 1e3:.3f}",
                  f"{r['encode_frac_copy']:.0%}", f"{r['decode_s'] * 1e3:.3f}", f"{r['decode_frac_copy']:.0%}",
                  f"{r['encode_bw'] / r['torch_encode_bw']:.0f}x")
    console.print(t)
    write_json(record, args.json, console)
    return 0


def _bench_memory(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console

    from actzip_bench.memory_suite import PARTS, run_suite

    parts = tuple(p.strip() for p in (args.parts or ",".join(PARTS)).split(",") if p.strip())
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ConfigError(f"bench memory: unknown parts {bad}; choose from {', '.join(PARTS)}")
    rows = tuple(int(r) for r in args.ffn_rows.split(",")) if args.ffn_rows else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    status = run_suite(out, parts, args.device, rows, args.main)
    for part, why in status.items():
        console.print(f"[bold]{part}[/]: {why}")
    return 0 if all(v == "ok" for v in status.values()) else 1


def add_parsers(bench) -> None:
    """Add the sparse cache's benchmarks to ``actzip bench``."""
    mb = bench.add_parser("memory", help="the sparse cache's benchmarks in one go (kernels, FFN sweep, GPT, bits), "
                          "one JSON each in --out")
    mb.add_argument("--out", required=True, help="directory for kernels.json, ffn.json, gpt.json, bits.json")
    mb.add_argument("--parts", help="comma-separated subset of kernels,ffn,gpt,bits (default all)")
    mb.add_argument("--ffn-rows", dest="ffn_rows", help="FFN sweep rows (default 4096,8192,16384,32768)")
    mb.add_argument("--device")
    mb.set_defaults(func=_bench_memory)
    f = bench.add_parser("ffn", help="residual ReLU² FFN stack: peak memory and step time per strategy")
    f.add_argument("--d", type=int, help="width (default 4096)")
    f.add_argument("--rows", type=int, help="tokens per step (default 16384)")
    f.add_argument("--n-blocks", type=int, dest="n_blocks", help="blocks (default 8)")
    f.add_argument("--density", choices=["mid", "low"], help="mid: ~50%% non-zero, low: ~20%%")
    f.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    f.add_argument("--kernel", choices=["auto", "torch", "triton"])
    f.add_argument("--matmul", choices=["bf16", "fp8"], help="fp8: up/down as Fp8Linear (float8 matmuls)")
    f.add_argument("--harness", choices=["actzip", "public"],
                   help="public: the public BitSparse code's own workload (default actzip)")
    f.add_argument("--rounds", type=int)
    f.add_argument("--warmup", type=int)
    f.add_argument("--strategies", help="comma-separated subset of none,checkpoint,relu-only,cache,fused,fused-arena,"
                   "fused-arena-signpack")
    f.add_argument("--device")
    f.add_argument("--json", metavar="PATH")
    f.set_defaults(func=_bench_ffn)
    gp = bench.add_parser("gpt", help="reference ReLU² GPT or a Nemotron-H-style hybrid: per-token peak memory and "
                          "step time per strategy")
    gp.add_argument("--model", choices=["reference", "nemotron-h"],
                    help="reference: actzip's ReLU² GPT (default); nemotron-h: transformers' NemotronH from a local config")
    gp.add_argument("--preset", help="model size (default gpt2-124m; nemotron-h: nemotron-h-small or nemotron-h-tiny)")
    gp.add_argument("--seq-lens", dest="seq_lens", help="comma-separated (default 1024,4096,8192)")
    gp.add_argument("--tokens-per-step", type=int, dest="tokens_per_step")
    gp.add_argument("--loss-chunk", type=int, dest="loss_chunk", help="tokens per loss chunk (0: full logits)")
    gp.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    gp.add_argument("--kernel", choices=["auto", "torch", "triton"])
    gp.add_argument("--rounds", type=int)
    gp.add_argument("--warmup", type=int)
    gp.add_argument("--strategies", help="comma-separated subset of none,checkpoint,fused,fused-arena,fused-arena-signpack,"
                    "rebuild,fused-arena-rebuild,fused-arena-rebuild-ln2,compress,compress-signpack (nemotron-h: "
                    "none,checkpoint,compress,compress-signpack)")
    gp.add_argument("--device")
    gp.add_argument("--json", metavar="PATH")
    gp.set_defaults(func=_bench_gpt)
    kb = bench.add_parser("kernels", help="sparse-codec kernel throughput vs the measured copy bandwidth (CUDA)")
    kb.add_argument("--numel", type=int, help="elements per tensor (default 2**28)")
    kb.add_argument("--json", metavar="PATH")
    kb.set_defaults(func=_bench_kernels)
    qb = bench.add_parser("quant", help="quant/fp8 kernel throughput vs the measured copy bandwidth (CUDA)")
    qb.add_argument("--numel", type=int, help="elements per tensor (default 2**28)")
    qb.add_argument("--json", metavar="PATH")
    qb.set_defaults(func=_bench_quant)
    bb = bench.add_parser("bits", help="codec bits per element vs the entropy bound on a trained ReLU² GPT")
    bb.add_argument("--preset")
    bb.add_argument("--steps", type=int)
    bb.add_argument("--batch-size", type=int, dest="batch_size")
    bb.add_argument("--dtype", choices=["bfloat16", "float16", "float32", "float8_e4m3fn"])
    bb.add_argument("--device")
    bb.add_argument("--json", metavar="PATH")
    bb.set_defaults(func=_bench_bits)
