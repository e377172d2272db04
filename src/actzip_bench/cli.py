"""The ``actzip`` command."""

from __future__ import annotations

import argparse
import sys

from actzip.errors import ActzipError, ConfigError


# Options given as comma-separated lists on the command line, and the type of their items.
_LIST_OPTIONS = {"strategies": str, "seq_lens": int, "presets": str, "methods": str, "compressors": str,
                 "bandwidths": float, "stage_lr_scale": float}


def _config(cls, args: argparse.Namespace):
    """A config dataclass from the options the user gave (the others keep the dataclass defaults)."""
    fields = {k: v for k, v in vars(args).items() if k in cls.__dataclass_fields__ and v is not None}
    for key, item in _LIST_OPTIONS.items():
        if isinstance(fields.get(key), str):
            try:
                fields[key] = tuple(item(p) for p in fields[key].split(","))
            except ValueError:
                raise ConfigError(f"--{key.replace('_', '-')} takes comma-separated {item.__name__} values, "
                                  f"got {fields[key]!r}") from None
    return cls(**fields)


def _device(args: argparse.Namespace):
    import torch

    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _command(args: argparse.Namespace) -> str:
    return " ".join(["actzip", *args.argv])


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actzip_bench.demo import DemoConfig, render, run_demo, write_json

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

    from actzip_bench.ffn import FFNBenchConfig, run_ffn

    cfg = _config(FFNBenchConfig, args)
    device = _device(args)
    console = Console()
    console.print(f"[bold]FFN stack[/]: {cfg.n_blocks} blocks, d={cfg.d}, hidden={cfg.hidden}, rows={cfg.rows}, "
                  f"{cfg.dtype}, {cfg.matmul} matmuls, density {cfg.density}, on {device}")
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

    from actzip_bench.gpt_memory import GPTBenchConfig, run_gpt

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

    from actzip_bench.bits import BitsBenchConfig, run_bits

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


def _run_kernel_bench(args: argparse.Namespace, name: str, config_cls, run):
    """The shared part of the GPU kernel benchmarks: CUDA check, config from --numel, run, command recorded."""
    import torch
    from rich.console import Console

    if not torch.cuda.is_available():
        raise ActzipError(f"actzip bench {name} times GPU kernels: it needs a CUDA device")
    cfg = config_cls(**({"numel": args.numel} if args.numel else {}))
    record = run(cfg, torch.device("cuda"))
    record["command"] = _command(args)
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
    _write_json(record, args.json, console)
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
    _write_json(record, args.json, console)
    return 0


def _bench_presets(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip_bench.presets import PresetBenchConfig, plot, run_presets

    cfg = _config(PresetBenchConfig, args)
    device = _device(args)
    console = Console()
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=cfg.steps * len(cfg.presets))
        record = run_presets(cfg, device, progress=lambda name, step: bar.update(task, advance=1, description=name))
    record["command"] = _command(args)
    family = "Llama (HF)" if cfg.activation == "swiglu" else "GPT"
    t = Table(title=f"{cfg.model}-size {cfg.activation} {family}, {cfg.steps} steps per preset, {device}")
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


def _bench_lora(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip_bench.lora import LoRABenchConfig, run_lora

    given = _config(LoRABenchConfig, args)  # only to parse and check the options given
    overrides = {k: getattr(given, k) for k in vars(args) if k in LoRABenchConfig.__dataclass_fields__
                 and k != "name" and getattr(args, k) is not None}
    cfg = LoRABenchConfig.preset(args.config, **overrides)
    device = _device(args)
    console = Console()
    console.print(f"[bold]LoRA fine-tuning[/] ({cfg.name}): Llama d={cfg.hidden} x {cfg.layers} layers, {cfg.dtype}, "
                  f"r={cfg.rank}, batch {cfg.batch_size}, {cfg.steps} steps per method, on {device}")
    with Progress(transient=True) as bar:
        pre = bar.add_task("pretrain", total=cfg.pretrain_steps)
        fine = bar.add_task("fine-tune", total=cfg.steps * len(cfg.methods))
        record = run_lora(cfg, device, progress=lambda phase, _: bar.update(pre if phase == "pretrain" else fine,
                                                                            advance=1))
    record["command"] = _command(args)
    t = Table(title=f"after {cfg.pretrain_steps} pretraining steps (loss {record['pretrain']['final_loss']:.3f}); "
                    f"task: {len(cfg.task.packages)} classes, chance {record['task']['chance_accuracy']:.0%}")
    for col in ("method", "step ms", "vs lora", "peak MiB", "vs lora", "saved KiB/token", "vs lora",
                "final loss", "test acc", "Δ points"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in record["runs"]:
        pk = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.1f}"
        pv = "" if r["peak_vs_lora"] is None else f"{r['peak_vs_lora'] - 1:+.1%}"
        sv = "n/a" if r["saved_bytes_per_token"] is None else f"{r['saved_bytes_per_token'] / 1024:,.2f}"
        sr = "" if r["saved_vs_lora"] is None else f"{r['saved_vs_lora'] - 1:+.1%}"
        t.add_row(r["method"], f"{r['median_ms']:.1f}", f"{r['time_vs_lora'] - 1:+.1%}", pk, pv, sv, sr,
                  f"{r['final_train_loss']:.4f}", f"{r['test_accuracy']:.1%}", f"{r['accuracy_vs_lora_points']:+.1f}")
    console.print(t)
    if cfg.seeds > 1:
        console.print(f"test accuracy over {cfg.seeds} seeds: " + "; ".join(
            f"{r['method']} {r['test_accuracy_mean']:.1%} ± {r['test_accuracy_std']:.1%} "
            f"({r['mean_accuracy_vs_lora_points']:+.1f} points)" for r in record["runs"]))
    for r in record["runs"]:
        e = r.get("grad_a_rel_error")
        if e is not None:
            console.print(f"{r['method']} grad_A relative error vs exact LoRA: median {e['median']:.1%}, all layers "
                          f"{e['global']:.1%} ({e['min']:.1%}..{e['max']:.1%}); grad_B bit-identical: "
                          f"{e['grad_b_bit_identical']}")
    console.print("targets: " + ", ".join(f"{k}={v}" for k, v in record["targets"].items()))
    _write_json(record, args.json, console)
    return 0


def _write_partial(record: dict, args: argparse.Namespace, console) -> None:
    """The entries finished so far, to --json (overwritten by the full record at the end)."""
    if args.json:
        record["command"] = _command(args)
        record["partial"] = True
        _write_json(record, args.json, console)


def _bench_wire(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from rich.console import Console
    from rich.progress import Progress

    from actzip_bench.wire import QUICK, WireBenchConfig, run_wire
    from actzip_bench.wire_render import plot, render

    cfg = _config(WireBenchConfig, args)
    if args.quick:  # the quick settings, except where an option was given
        cfg = dataclasses.replace(cfg, **{k: v for k, v in QUICK.items() if getattr(args, k, None) is None})
    device = _device(args)
    console = Console(width=max(Console().width, 132))  # the table has ten columns
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=cfg.steps * len(cfg.compressors))
        record = run_wire(cfg, device, progress=lambda name, step: bar.update(
            task, advance=1 if step < cfg.steps else 0, description=f"{name} step {step + 1}"),
            on_entry=lambda partial: _write_partial(partial, args, bar.console))
    record["command"] = _command(args)
    console.print(render(record))
    _write_json(record, args.json, console)
    if args.json:
        png = Path(args.json).with_suffix(".png")
        plot(record, png)
        console.print(f"wrote {png}")
    return 0


def _bench_cache(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actzip_bench.cache import CacheBenchConfig, render, run_cache, with_quick

    if isinstance(args.models, str):
        args.models = tuple(args.models.split(","))
    cfg = _config(CacheBenchConfig, args)
    if args.quick:  # the quick settings, except where an option was given
        cfg = with_quick(cfg, {k for k in vars(args) if getattr(args, k) is not None})
    device = _device(args)
    console = Console()
    console.print(f"[bold]activation cache[/]: {', '.join(cfg.models)} x {', '.join(cfg.strategies)}, "
                  f"{cfg.batch_size} x {cfg.seq_len} tokens, {cfg.dtype}, on {device}")
    record = run_cache(cfg, device)
    record["command"] = _command(args)
    for item in render(record):
        console.print(item)
    _write_json(record, args.json, console)
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

    from actzip_bench.report import write

    print(f"wrote {write(Path(args.root))}")
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
    status = run_suite(out, parts, args.device, rows, lambda argv: main(argv))
    for part, why in status.items():
        console.print(f"[bold]{part}[/]: {why}")
    return 0 if all(v == "ok" for v in status.values()) else 1


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
    mb = bsub.add_parser("memory", help="the sparse cache's benchmarks in one go (kernels, FFN sweep, GPT, bits), "
                         "one JSON each in --out")
    mb.add_argument("--out", required=True, help="directory for kernels.json, ffn.json, gpt.json, bits.json")
    mb.add_argument("--parts", help="comma-separated subset of kernels,ffn,gpt,bits (default all)")
    mb.add_argument("--ffn-rows", dest="ffn_rows", help="FFN sweep rows (default 4096,8192,16384,32768)")
    mb.add_argument("--device")
    mb.set_defaults(func=_bench_memory)
    f = bsub.add_parser("ffn", help="residual ReLU² FFN stack: peak memory and step time per strategy")
    f.add_argument("--d", type=int, help="width (default 4096)")
    f.add_argument("--rows", type=int, help="tokens per step (default 16384)")
    f.add_argument("--n-blocks", type=int, dest="n_blocks", help="blocks (default 8)")
    f.add_argument("--density", choices=["mid", "low"], help="mid: ~50%% non-zero, low: ~20%%")
    f.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    f.add_argument("--kernel", choices=["auto", "torch", "triton"])
    f.add_argument("--matmul", choices=["bf16", "fp8"], help="fp8: up/down as Fp8Linear (float8 matmuls)")
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
    gp.add_argument("--loss-chunk", type=int, dest="loss_chunk", help="tokens per loss chunk (0: full logits)")
    gp.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    gp.add_argument("--kernel", choices=["auto", "torch", "triton"])
    gp.add_argument("--rounds", type=int)
    gp.add_argument("--warmup", type=int)
    gp.add_argument("--strategies", help="comma-separated subset of none,checkpoint,fused,fused-arena,fused-arena-signpack,rebuild,fused-arena-rebuild,"
                    "fused-arena-rebuild-ln2")
    gp.add_argument("--device")
    gp.add_argument("--json", metavar="PATH")
    gp.set_defaults(func=_bench_gpt)
    kb = bsub.add_parser("kernels", help="sparse-codec kernel throughput vs the measured copy bandwidth (CUDA)")
    kb.add_argument("--numel", type=int, help="elements per tensor (default 2**28)")
    kb.add_argument("--json", metavar="PATH")
    kb.set_defaults(func=_bench_kernels)
    qb = bsub.add_parser("quant", help="quant/fp8 kernel throughput vs the measured copy bandwidth (CUDA)")
    qb.add_argument("--numel", type=int, help="elements per tensor (default 2**28)")
    qb.add_argument("--json", metavar="PATH")
    qb.set_defaults(func=_bench_quant)
    pb = bsub.add_parser("presets", help="loss curves of the activation-cache presets on the reference GPT")
    pb.add_argument("--model", help="GPT preset (default tiny)")
    pb.add_argument("--activation", choices=["relu", "relu2", "gelu", "swiglu"],
                    help="the reference GPT's MLP activation, or swiglu: a HuggingFace Llama of the same size")
    pb.add_argument("--presets", help="comma-separated (default lossless,conservative,balanced,aggressive; "
                    "also 4bit, 2bit and sketch-d8: rank-d/8 sketches of the linear inputs)")
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
    lb = bsub.add_parser("lora", help="LoRA fine-tuning of a Llama-style model: LoRA, checkpointing, LoRA-FA, CARE-LoRA")
    lb.add_argument("--config", default="quick", help="quick (CPU, ~1-2 min, default) or h200")
    lb.add_argument("--methods", help="comma-separated, from lora,lora+checkpoint,fa,care,care+K,care+KpQ,care@G,care+KpQ@G (K: "
                    "extra_rank, Q: power_iters, G: fit_group_rows)")
    lb.add_argument("--steps", type=int, help="fine-tuning steps per method")
    lb.add_argument("--seeds", type=int, help="fine-tuning runs per method (the first timed; the others add test accuracies)")
    lb.add_argument("--pretrain-steps", type=int, dest="pretrain_steps")
    lb.add_argument("--lr", type=float, help="fine-tuning learning rate")
    lb.add_argument("--lr-schedule", dest="lr_schedule", choices=["cosine", "constant"],
                    help="cosine: 5%% warm-up, decay to lr/10 (default); constant")
    lb.add_argument("--batch-size", type=int, dest="batch_size")
    lb.add_argument("--rank", type=int)
    lb.add_argument("--dropout", type=float)
    lb.add_argument("--lam", type=float)
    lb.add_argument("--dropout-mask", dest="dropout_mask", choices=["bitmask", "bool", "regenerate"],
                    help="how fa / care keep the dropout mask (default bitmask)")
    lb.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    lb.add_argument("--adapter-dtype", dest="adapter_dtype", choices=["peft", "model"])
    lb.add_argument("--seed", type=int)
    lb.add_argument("--device")
    lb.add_argument("--json", metavar="PATH")
    lb.set_defaults(func=_bench_lora)
    wb = bsub.add_parser("wire", help="pipeline training over slow links: dense vs each boundary compressor")
    wb.add_argument("--quick", action="store_true", help="a small run for a 2-core CPU (under 3 minutes)")
    wb.add_argument("--model", help="GPT preset (default small)")
    wb.add_argument("--n-layer", type=int, dest="n_layer")
    wb.add_argument("--n-embd", type=int, dest="n_embd")
    wb.add_argument("--n-head", type=int, dest="n_head")
    wb.add_argument("--block-size", type=int, dest="block_size")
    wb.add_argument("--stages", type=int, help="pipeline stages (default 2)")
    wb.add_argument("--compressors", help="comma-separated name:ratio entries (dense, quant:8, mask:8, topk:8, "
                    "delta:8, subspace:100, bottleneck:100, stiefel:16, stiefel-rvq:100, ...), each optionally "
                    "with its own learning rate: subspace:100@2e-3 (several dense entries: the best sets the target)")
    wb.add_argument("--boundary", help="boundary config overrides for every stage compressor, e.g. "
                    "anchor_rank=256,lr=1e-4 (StiefelConfig, SubspaceConfig, BottleneckConfig fields)")
    wb.add_argument("--bwd-codec", dest="bwd_codec", help="backward codec spec for the byte codecs (default: "
                    "follow the forward one)")
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
    cb = bsub.add_parser("cache", help="activation bytes, peak memory and step time of every cache strategy on "
                         "the reference GPT (ReLU², GELU) and a Llama-style model (SwiGLU)")
    cb.add_argument("--quick", action="store_true", help="tiny models, a few steps: under a minute on a CPU")
    cb.add_argument("--models", help="comma-separated subset of gpt-relu2,gpt-gelu,llama-swiglu")
    cb.add_argument("--strategies", help="comma-separated subset of none,checkpoint,sparse,lossless,conservative,"
                    "balanced,aggressive,4bit,2bit,sketch-d8 (none is required)")
    cb.add_argument("--gpt-preset", dest="gpt_preset", help="model size, GPT preset (default gpt2-124m)")
    cb.add_argument("--seq-len", type=int, dest="seq_len", help="default 1024")
    cb.add_argument("--batch-size", type=int, dest="batch_size", help="default 32")
    cb.add_argument("--vocab-size", type=int, dest="vocab_size",
                    help="default: the model's own (50304 GPT-2, 32000 Llama); 256 = bytes, as the corpus")
    cb.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    cb.add_argument("--rounds", type=int)
    cb.add_argument("--warmup", type=int)
    cb.add_argument("--min-bytes", type=int, dest="min_bytes", help="tensors below this are kept (default 64 KiB)")
    cb.add_argument("--loss-chunk", type=int, dest="loss_chunk",
                    help="output head + loss this many tokens at a time (default 4096; 0: full float32 logits)")
    cb.add_argument("--group-size", type=int, dest="group_size", help="quantization group (default 128)")
    cb.add_argument("--device")
    cb.add_argument("--json", metavar="PATH")
    cb.set_defaults(func=_bench_cache)
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
