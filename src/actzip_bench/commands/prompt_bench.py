"""``actzip bench prompt``: the full instruction prompt, one activation vector in its place, no prompt, and the
one-slot baselines, on the project's reference model and instruction suite."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.commands.common import LIST_OPTIONS, command_line, write_json, write_partial


def _config(args: argparse.Namespace):
    from actzip_bench.prompt_bench import PromptBenchConfig, quick_config

    base = quick_config() if args.quick else PromptBenchConfig()
    over = {}
    for name in ("seeds", "methods", "splits"):
        value = getattr(args, name)
        if value:
            item = LIST_OPTIONS.get(name, str)
            over[name] = tuple(item(v) for v in value.split(","))
    for name in ("per_family", "min_tasks", "n_fit", "n_test", "model_dir", "device", "sweep_tasks"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    fit = base.fit
    if args.sweep_only:
        over["sweep_only"] = True
    for name in ("extract_layer", "inject_layer", "steps"):
        if getattr(args, name) is not None:
            fit = replace(fit, **{name: getattr(args, name)})
    model = base.model
    if args.train_steps is not None:
        model = replace(model, steps=args.train_steps, warmup=min(model.warmup, args.train_steps - 1))
    return replace(base, fit=fit, model=model, **over)


def _merge(paths: list[str]) -> dict:
    """Records of one protocol run per seed (separate processes), as one record."""
    from actzip_bench.prompt_bench import costs, summarize
    from actzip_bench.prompt_model import PromptModelConfig

    loaded = [json.loads(Path(p).read_text()) for p in paths]
    records = [r for r in loaded if not r["config"].get("sweep_only")]
    if not records:
        raise ConfigError("bench prompt --merge: every record given is a sweep alone")
    first = records[0]
    own = ("seeds", "sweep_only", "sweep_tasks")  # what the per-seed processes may differ in
    for p, r in zip(paths, loaded):
        a = {k: v for k, v in r["config"].items() if k not in own}
        b = {k: v for k, v in first["config"].items() if k not in own}
        if a != b:
            raise ConfigError(f"bench prompt --merge: {p} ran another config than the first record")
        if r.get("partial") and not r["config"].get("sweep_only"):
            raise ConfigError(f"bench prompt --merge: {p} is a partial record (its run was cut short)")
    seeds = [s for r in records for s in r["config"]["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"bench prompt --merge: seeds repeat across the records: {seeds}")
    rows = [row for r in records for row in r["rows"]]
    merged = {**first, "rows": rows, "training": [t for r in records for t in r["training"]],
              "sweep": [row for r in loaded for row in r.get("sweep", [])],
              # a sweep cut short keeps the settings it finished; its figure says which
              "sweep_partial": any(r.get("partial") for r in loaded if r["config"].get("sweep_only")),
              "single_fit_seconds": [x for r in records for x in r.get("single_fit_seconds", [])],
              "summary": summarize(rows, seeds), "merged_from": [r.get("command") for r in loaded]}
    merged["config"] = {**first["config"], "seeds": seeds}
    merged["cost"] = costs(PromptModelConfig(**first["config"]["model"]), rows)
    return merged


def _print(record: dict, console) -> None:
    from rich.table import Table

    from actzip_bench.figures_prompt import METHOD_NAMES

    summary = record["summary"]
    if not summary:
        console.print(f"sweep: {len(record['sweep'])} (task, L_e, L_i) rows")
        return
    splits = [s for s in ("train", "heldout_paraphrase", "heldout_labels", "heldout_family", "held_out")
              if s in summary]
    table = Table(title=f"prompt -> one vector, accuracy (mean of {len(record['config']['seeds'])} seeds, spread)")
    table.add_column("method")
    for s in splits:
        table.add_column(s.replace("heldout_", "held-out "), justify="right")
    for method in METHOD_NAMES:
        if method not in summary.get(splits[0], {}):
            continue
        cells = [f"{summary[s][method]['mean']:.3f} ±{summary[s][method]['spread'] / 2:.3f}"
                 if method in summary[s] else "" for s in splits]
        table.add_row(METHOD_NAMES[method], *cells)
    console.print(table)
    cost = record.get("cost") or {}
    if cost:
        console.print(f"prefill per query: {cost['flops_ratio']:.1f}x fewer FLOPs, {cost['kv_ratio']:.1f}x fewer KV "
                      f"bytes with the vector (prompt {cost['mean_prompt_positions']:.1f} positions -> 1)")
    probe = record.get("probe") or {}
    if probe.get("task_identity_accuracy") is not None:
        console.print(f"probe: task family from the vector {probe['task_identity_accuracy']:.2f} "
                      f"(chance {probe['task_identity_chance']:.2f})")


def _quiet_partial(record: dict, args: argparse.Namespace) -> None:
    from rich.console import Console

    write_partial(record, args, Console(quiet=True))


def _bench_prompt(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from actzip_bench.harness import machine_record

    console = Console()
    if args.merge:
        record = _merge(args.merge)
    else:
        from actzip_bench.prompt_bench import run_prompt_bench

        cfg = _config(args)
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task("starting")
            record = run_prompt_bench(cfg, progress=lambda s: bar.update(task, description=s),
                                      checkpoint=lambda partial: _quiet_partial(partial, args))
        device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                              ("cpu" if cfg.device == "auto" else cfg.device))
        record["machine"] = machine_record(device)
    record["command"] = command_line(args)
    _print(record, console)
    write_json(record, args.json, console)
    if args.json and record["summary"]:
        from actzip_bench.figures_prompt import plot_accuracy

        png = Path(args.json).with_suffix(".png")
        plot_accuracy(record, png)
        console.print(f"wrote {png}")
    return 0


def add_parsers(bench) -> None:
    """Add ``prompt`` to ``actzip bench``."""
    pb = bench.add_parser("prompt", help="an instruction prompt against one activation vector in its place")
    pb.add_argument("--quick", action="store_true", help="a small model trained here, fewer tasks (2-core CPU)")
    pb.add_argument("--seeds", help="comma-separated (default 0,1,2)")
    pb.add_argument("--methods", help="comma-separated, of full,none,vector,task_vector,soft_prompt,i2cl")
    pb.add_argument("--splits", help="comma-separated, of train,heldout_paraphrase,heldout_labels,heldout_family")
    pb.add_argument("--per-family", type=int, dest="per_family", help="tasks drawn per family and split")
    pb.add_argument("--min-tasks", type=int, dest="min_tasks", help="tasks per split at least")
    pb.add_argument("--n-fit", type=int, dest="n_fit", help="fit examples per task")
    pb.add_argument("--n-test", type=int, dest="n_test", help="test queries per task")
    pb.add_argument("--extract-layer", type=int, dest="extract_layer", help="the vector's L_e")
    pb.add_argument("--inject-layer", type=int, dest="inject_layer", help="the vector's L_i")
    pb.add_argument("--steps", type=int, help="Adam steps of every fitted method")
    pb.add_argument("--train-steps", type=int, dest="train_steps", help="training steps of the reference model")
    pb.add_argument("--sweep-tasks", type=int, dest="sweep_tasks", help="tasks per held-out split in the sweep")
    pb.add_argument("--sweep-only", action="store_true", dest="sweep_only",
                    help="only the (L_e, L_i) sweep, on the first seed's model in --model-dir (waits for it)")
    pb.add_argument("--model-dir", dest="model_dir", help="save / load the reference models here")
    pb.add_argument("--device", help="cpu or cuda (default: cuda when there is one)")
    pb.add_argument("--merge", nargs="+", help="merge these per-seed records into one (no run)")
    pb.add_argument("--json", help="write the record here")
    pb.set_defaults(func=_bench_prompt)
