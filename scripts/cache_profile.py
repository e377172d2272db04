"""Where an activation-cache strategy's step time goes: the GPU's kernels, grouped, against the plain step.

Builds ``actzip bench cache``'s model (the same config: ``--model``, ``--gpt-preset``, batch, sequence length,
1024-token loss chunks), runs a few warm-up steps of each strategy, then profiles ``--steps`` steps of each with
``torch.profiler``: the step's wall time, the GPU's busy time (kernels and copies), and every kernel's total time,
grouped by name, with the kernels that only the strategy runs (or that take longer under it) first. The rest of
a step's wall time is the GPU waiting for the host: launches, Python, the hooks' bookkeeping; the record also
lists the host's costliest operations by self time (``host_ops``), per step.

    PYTHONPATH=src python scripts/cache_profile.py --device cuda [--model gpt-gelu] [--strategies none,4bit]
        [--json PATH]

On a CPU it runs the same code (a tiny model, ``--gpt-preset tiny``) but the profile has no GPU kernels.
"""

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch  # noqa: E402


def _host_ops(prof, top: int) -> list[dict]:
    """The host's costliest operations over the profiled steps, by self time (ms in all, calls)."""
    rows = [e for e in prof.key_averages() if getattr(e, "self_cpu_time_total", 0) > 0]
    rows.sort(key=lambda e: -e.self_cpu_time_total)
    return [{"name": e.key[:120], "self_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in rows[:top]]


def _kernels(prof) -> dict[str, dict]:
    """GPU time per kernel name (ms in all, calls) over the profiled steps."""
    out: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "calls": 0})
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is not None and str(dev).endswith("CUDA"):
            k = out[e.name[:120]]
            k["ms"] += e.time_range.elapsed_us() / 1e3  # a kernel's own interval on the device
            k["calls"] += 1
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="gpt-gelu", help="gpt-gelu or llama-swiglu (bench cache's models)")
    parser.add_argument("--gpt-preset", default=None, help="model size (default gpt2-124m on CUDA, tiny on a CPU)")
    parser.add_argument("--strategies", default="none,4bit", help="comma-separated, bench cache's strategies")
    parser.add_argument("--batch-size", type=int, default=None, help="default: bench cache's (32), 2 on a CPU")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per strategy")
    parser.add_argument("--top", type=int, default=12, help="kernel groups listed per strategy")
    parser.add_argument("--compile", default="", help="bench cache's --compile: inductor, inductor-cudagraphs, "
                        "aot_eager (default: eager)")
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args()
    device = torch.device(args.device)
    from actzip_bench.cache_config import CacheBenchConfig
    from actzip_bench.cache import compiled_model
    from actzip_bench.cache_models import adamw, build_model
    from actzip_bench.cache_strategies import Strategy, sketch_strategy_modules
    from actzip_bench.data import Corpus
    from actzip_bench.harness import machine_record

    cpu = device.type == "cpu"
    strategies = args.strategies.split(",")
    cfg = CacheBenchConfig(models=(args.model,), gpt_preset=args.gpt_preset or ("tiny" if cpu else "gpt2-124m"),
                           batch_size=args.batch_size or (2 if cpu else 32), seq_len=64 if cpu else 1024,
                           loss_chunk=1024, strategies=tuple(strategies), compile=args.compile,
                           **({"min_bytes": 0} if cpu else {}))
    model = build_model(args.model, cfg, device)
    if cfg.compile:
        model = compiled_model(model, cfg.compile)
    opt = adamw(model.module, cfg.lr)
    sketched, plain = sketch_strategy_modules(model, cfg) if any(s.startswith("sketch") for s in strategies) \
        else (None, None)
    runs = {s: Strategy(s, cfg, model, sketched, plain) for s in strategies}
    corpus = Corpus.from_stdlib(max_bytes=cfg.corpus_bytes)
    x, y = corpus.get_batch("train", cfg.batch_size, cfg.seq_len, generator=torch.Generator().manual_seed(0),
                            device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if not cpu else [])
    rows = []
    for name, s in runs.items():
        # what the strategy changes in the model (modules swapped, norms rebuilt) stays for its steps, untimed
        with s, s.prepared():
            for _ in range(3):
                s.train_step(opt, x, y)
            sync()
            with torch.profiler.profile(activities=activities) as prof:
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    s.train_step(opt, x, y)
                sync()
                wall = (time.perf_counter() - t0) / args.steps * 1e3
        kernels = _kernels(prof)
        busy = sum(k["ms"] for k in kernels.values()) / args.steps
        host = [{**h, "self_ms": h["self_ms"] / args.steps, "calls": h["calls"] / args.steps}
                for h in _host_ops(prof, 3 * args.top)]
        rows.append({"strategy": name, "step_ms": wall, "gpu_busy_ms": busy, "gpu_idle_ms": wall - busy,
                     "host_ops": host,
                     "kernels": {k: {"ms": v["ms"] / args.steps, "calls": v["calls"] / args.steps}
                                 for k, v in kernels.items()}})
    base = rows[0]["kernels"]
    for r in rows:
        extra = {k: v["ms"] - base.get(k, {"ms": 0.0})["ms"] for k, v in r["kernels"].items()}
        r["top"] = sorted(r["kernels"], key=lambda k: -r["kernels"][k]["ms"])[:args.top]
        r["extra_top"] = sorted((k for k in extra if extra[k] > 0), key=lambda k: -extra[k])[:args.top]
        print(f"\n{r['strategy']}: step {r['step_ms']:.2f} ms, GPU busy {r['gpu_busy_ms']:.2f} ms, "
              f"waiting {r['gpu_idle_ms']:.2f} ms")
        for k in r["extra_top"]:
            v = r["kernels"][k]
            print(f"  +{extra[k]:8.3f} ms  {v['ms']:8.3f} ms  {v['calls']:6.0f} calls  {k[:90]}")
    if args.json:
        record = {"command": "python " + " ".join(sys.argv), "machine": machine_record(device),
                  "model": args.model, "config": {"gpt_preset": cfg.gpt_preset, "batch_size": cfg.batch_size,
                                                  "seq_len": cfg.seq_len, "loss_chunk": cfg.loss_chunk,
                                                  "dtype": cfg.dtype, "steps": args.steps,
                                                  "compile": cfg.compile},
                  "rows": rows}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
