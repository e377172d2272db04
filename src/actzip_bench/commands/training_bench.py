"""``actzip bench presets|lora|cache``: training runs with compressed activations (loss, bytes, time)."""

from __future__ import annotations

import argparse

from actzip_bench.commands.common import (command_line, config_from_args, device_from_args, write_json,
                                          write_json_and_plot)


def _bench_presets(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip_bench.presets import PresetBenchConfig, plot, run_presets

    cfg = config_from_args(PresetBenchConfig, args)
    device = device_from_args(args)
    console = Console()
    with Progress(transient=True) as bar:
        task = bar.add_task("training", total=cfg.steps * len(cfg.presets))
        record = run_presets(cfg, device, progress=lambda name, step: bar.update(task, advance=1, description=name))
    record["command"] = command_line(args)
    family = "Llama (HF)" if cfg.activation == "swiglu" else "GPT"
    t = Table(title=f"{cfg.model}-size {cfg.activation} {family}, {cfg.steps} steps per preset, {device}")
    for col in ("preset", "saved B/token", f"vs {record['reference']}", "final train loss", "val loss", "val gap",
                "step ms"):
        t.add_column(col, justify="left" if col == "preset" else "right")
    ref = record["runs"][0]
    for r in record["runs"]:
        t.add_row(r["preset"], f"{r['saved_bytes_per_token']:,.0f}",
                  f"{r['saved_bytes_per_token'] / ref['saved_bytes_per_token'] - 1:+.1%}", f"{r['final_train_loss']:.4f}",
                  f"{r['val_loss']:.4f}", f"{r['val_loss_gap']:+.2%}",
                  "-" if r["step_time_s"] is None else f"{r['step_time_s'] * 1e3:.1f}")
    console.print(t)
    write_json_and_plot(record, args.json, console, plot)
    return 0


def _bench_lora(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from actzip_bench.lora import LoRABenchConfig, run_lora

    given = config_from_args(LoRABenchConfig, args)  # only to parse and check the options given
    overrides = {k: getattr(given, k) for k in vars(args) if k in LoRABenchConfig.__dataclass_fields__
                 and k != "name" and getattr(args, k) is not None}
    cfg = LoRABenchConfig.named(args.config, **overrides)
    device = device_from_args(args)
    console = Console()
    console.print(f"[bold]LoRA fine-tuning[/] ({cfg.name}): Llama d={cfg.hidden} x {cfg.layers} layers, {cfg.dtype}, "
                  f"r={cfg.rank}, batch {cfg.batch_size}, {cfg.steps} steps per method, on {device}")
    with Progress(transient=True) as bar:
        pre = bar.add_task("pretrain", total=cfg.pretrain_steps)
        fine = bar.add_task("fine-tune", total=cfg.steps * len(cfg.methods))
        record = run_lora(cfg, device, progress=lambda phase, _: bar.update(pre if phase == "pretrain" else fine,
                                                                            advance=1))
    record["command"] = command_line(args)
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
    write_json(record, args.json, console)
    return 0


def _bench_cache(args: argparse.Namespace) -> int:
    from rich.console import Console

    from actzip_bench.cache import run_cache
    from actzip_bench.cache_config import CacheBenchConfig, with_quick
    from actzip_bench.cache_render import render

    if isinstance(args.models, str):
        args.models = tuple(args.models.split(","))
    cfg = config_from_args(CacheBenchConfig, args)
    if args.quick:  # the quick settings, except where an option was given
        cfg = with_quick(cfg, {k for k in vars(args) if getattr(args, k) is not None})
    device = device_from_args(args)
    console = Console()
    console.print(f"[bold]activation cache[/]: {', '.join(cfg.models)} x {', '.join(cfg.strategies)}, "
                  f"{cfg.batch_size} x {cfg.seq_len} tokens, {cfg.dtype}, on {device}")
    record = run_cache(cfg, device)
    record["command"] = command_line(args)
    for item in render(record):
        console.print(item)
    write_json(record, args.json, console)
    return 0


def _bench_grpo(args: argparse.Namespace) -> int:
    import dataclasses

    from rich.console import Console
    from rich.table import Table

    from actzip_bench.grpo import GRPOBenchConfig, run_grpo
    from actzip_bench.grpo_plots import plot_rewards, plot_throughput
    from actzip_bench.grpo_compile import describe_tried

    cfg = config_from_args(GRPOBenchConfig, args)
    if args.quick:
        given = {k: getattr(cfg, k) for k in GRPOBenchConfig.__dataclass_fields__ if getattr(args, k, None) is not None}
        cfg = dataclasses.replace(GRPOBenchConfig.quick(), **given)
    device = device_from_args(args)
    console = Console()
    with console.status("GRPO bench") as status:
        record = run_grpo(cfg, device, progress=lambda name: status.update(f"timing {name}"),
                          log=lambda message: (console.log(message), status.update(message)))
    record["command"] = command_line(args)
    t = Table(title=f"GRPO actor update, {cfg.preset} Llama policy, {cfg.prompts}x{cfg.group_size} completions of "
                    f"<= {cfg.completion_len} tokens, {cfg.loss_type}, {device}")
    for col in ("strategy", "update ms", "tokens/s", "vs none", "peak MiB", "reward"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in record["runs"]:
        peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:,.1f}"
        reward = "" if r.get("reward") is None else f"{r['reward']:.3f}"
        t.add_row(r["strategy"], f"{r['median_ms']:.2f}", f"{r['tokens_per_s']:,.0f}", f"{r['time_vs_none'] - 1:+.1%}",
                  peak, reward)
    console.print(t)
    console.print(f"{record['zero_advantage_rows']} of {record['rows']} sequences have zero advantage (the planner "
                  "leaves them out)")
    plan = next((r["plan"] for r in record["runs"] if r.get("plan")), None)
    if plan:
        console.print(plan)
    for r in record["runs"]:
        if r.get("compile_budgets"):
            console.print(f"compile: activation_memory_budget {r['compile_budget']} kept (peaks tried: "
                          f"{describe_tried(r['compile_budgets'])})")
    pt = record["planner_timing"]
    console.print(f"planner: a fresh plan for {pt['units']} units in {pt['solve_s']:.2f} s; a cached lookup "
                  f"{pt['lookup_ms']:.4f} ms")
    for s, why in record["skipped"].items():
        console.print(f"skipped {s}: {why}")
    write_json_and_plot(record, args.json, console, plot_rewards if cfg.reward_steps else plot_throughput)
    return 0


def add_parsers(bench) -> None:
    """Add the presets, LoRA, activation-cache and GRPO benchmarks to ``actzip bench``."""
    gr = bench.add_parser("grpo", help="GRPO actor update: tokens/s and peak per memory strategy, reward when trained")
    gr.add_argument("--quick", action="store_true", help="a CPU-sized run (tiny policy, short completions)")
    gr.add_argument("--preset", choices=["tiny", "small", "1b"], help="the throughput policy (default tiny)")
    gr.add_argument("--prompts", type=int)
    gr.add_argument("--group-size", type=int, dest="group_size")
    gr.add_argument("--completion-len", type=int, dest="completion_len")
    gr.add_argument("--loss-type", dest="loss_type", choices=["grpo", "bnpo", "dr_grpo", "dapo"])
    gr.add_argument("--dtype", choices=["float32", "bfloat16"])
    gr.add_argument("--rounds", type=int)
    gr.add_argument("--warmup", type=int)
    gr.add_argument("--strategies",
                    help="comma-separated subset of none,checkpoint,compile,lossless,8bit,offload,planner,"
                         "planner-no-drop")
    gr.add_argument("--reward-steps", type=int, dest="reward_steps", help="GRPO steps per strategy and seed")
    gr.add_argument("--reward-preset", choices=["tiny", "small", "1b"], dest="reward_preset",
                    help="the trained policy (default small)")
    gr.add_argument("--reward-completion-len", type=int, dest="reward_completion_len",
                    help="longest completion when trained (default 8)")
    gr.add_argument("--seeds", type=int)
    gr.add_argument("--task-digits", type=int, dest="task_digits", help="operand digits of the trained sums (default 1)")
    gr.add_argument("--sft-steps", type=int, dest="sft_steps", help="supervised warm-up steps before GRPO (default 100)")
    gr.add_argument("--device")
    gr.add_argument("--json", metavar="PATH",
                    help="also writes PATH with .png: the reward curves when training, else tokens/s against peak")
    gr.set_defaults(func=_bench_grpo)
    pb = bench.add_parser("presets", help="loss curves of the activation-cache presets on the reference GPT")
    pb.add_argument("--model", help="GPT preset (default tiny)")
    pb.add_argument("--activation", choices=["relu", "relu2", "gelu", "swiglu"],
                    help="the reference GPT's MLP activation, or swiglu: a HuggingFace Llama of the same size")
    pb.add_argument("--presets", help="comma-separated (default lossless,conservative,balanced,aggressive; "
                    "also 4bit, 2bit, sketch-d8: rank-d/8 sketches of the linear inputs, and none: no cache); a preset "
                    "may replace roles' treatments: 2bit/attention=quant2-rn/norm=quant2-rn, and a name ending in "
                    "+derivatives runs with the GELUs / SiLUs keeping their derivative: 2bit+derivatives")
    pb.add_argument("--steps", type=int)
    pb.add_argument("--batch-size", type=int, dest="batch_size")
    pb.add_argument("--seed", type=int, help="initial weights and training batches (default 0)")
    pb.add_argument("--lr", type=float, help="AdamW learning rate (default 1e-3)")
    pb.add_argument("--block-size", type=int, dest="block_size", help="sequence length (default: the GPT size's)")
    pb.add_argument("--dtype", choices=["float32", "bfloat16"],
                    help="float32 (default) or bfloat16: every forward under autocast, the weights in float32")
    pb.add_argument("--graphs", action="store_true", default=None,
                    help="CUDA: each preset's step captured as a CUDA graph after 3 eager steps and replayed "
                    "(presets none, 4bit, 2bit; none is then the reference)")
    pb.add_argument("--device")
    pb.add_argument("--json", metavar="PATH", help="also writes PATH with .png: the loss curves")
    pb.set_defaults(func=_bench_presets)
    lb = bench.add_parser("lora", help="LoRA fine-tuning of a Llama-style model: LoRA, checkpointing, LoRA-FA, CARE-LoRA")
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
    cb = bench.add_parser("cache", help="activation bytes, peak memory and step time of every cache strategy on "
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
    cb.add_argument("--compile", choices=["inductor", "inductor-cudagraphs", "aot_eager"],
                    help="run every strategy's loss under torch.compile with this backend (default: eager); "
                    "inductor-cudagraphs: inductor with mode=reduce-overhead (CUDA graphs)")
    cb.add_argument("--graphs", action="store_true", default=None,
                    help="capture each strategy's whole step as a CUDA graph and time its replays (CUDA; none, "
                    "4bit, 2bit, checkpoint)")
    cb.add_argument("--fuse-compiled", action="store_true", dest="fuse_compiled", default=None,
                    help="with --compile: the quant codec written in the graphs' own operations, fused by the "
                    "compiler (CacheConfig.fuse_compiled)")
    cb.add_argument("--device")
    cb.add_argument("--json", metavar="PATH")
    cb.set_defaults(func=_bench_cache)
