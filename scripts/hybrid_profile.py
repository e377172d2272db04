"""Where the Nemotron-H-style hybrid's step time and peak memory go, per strategy (none, compress, ...).

Run from the repo root on a GPU:  PYTHONPATH=src python3 scripts/hybrid_profile.py --out DIR
CPU smoke run:  PYTHONPATH=src python3 scripts/hybrid_profile.py --device cpu --preset nemotron-h-tiny --seq 64 \
    --tokens 128 --strategies none

The model, optimizer and steps are those of ``actzip bench gpt --model nemotron-h`` (``actzip_bench.hybrid_memory``).
After the arenas settle, each strategy runs ``--steps`` steps under ``torch.profiler``; the record has, per
strategy, the device time of every kernel name (summed), the step's wall time, the device's busy time, and the
memory at three points of a step: allocated after the forward, the peak of the step, the arena's capacity. The
kernels whose time differs most between ``none`` and each other strategy are printed last.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import torch

from actzip_bench.harness import machine_record
from actzip_bench.hybrid_memory import HYBRID_PRESETS, build_hybrid, chunked_loss, mamba_path, saved_by_kind
from actzip_bench.model_rows import random_tokens
from actzip_bench.one_liner import compressed_copies


def kernel_times(prof) -> tuple[dict, float]:
    """Summed device time (ms) per kernel name, and the total."""
    per = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            per[e.name[:120]] += e.device_time / 1e3
    return dict(per), sum(per.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="nemotron-h-small")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--loss-chunk", type=int, default=1024)
    ap.add_argument("--strategies", default="none,compress")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    strategies = args.strategies.split(",")
    torch.manual_seed(0)
    model = build_hybrid(args.preset, args.seq).to(device=dev, dtype=torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    models, arenas = {"none": model}, {}
    models.update(compressed_copies(model, strategies, "auto", arenas))
    x, y = random_tokens(model.config.vocab_size, args.tokens // args.seq, args.seq, dev)
    pattern = HYBRID_PRESETS[args.preset]["hybrid_override_pattern"]

    def step(s: str, marks: dict | None = None) -> None:
        opt.zero_grad(set_to_none=True)
        loss = chunked_loss(models[s], x, y, args.loss_chunk)
        if marks is not None and cuda:
            torch.cuda.synchronize()
            marks["after_forward"] = torch.cuda.memory_allocated(dev)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(6):
        for s in strategies:
            step(s)
    out = {"config": vars(args), "machine": machine_record(dev), "mamba_path": mamba_path(), "strategies": {}}
    for s in strategies:
        rec = {"saved_bytes_per_token": saved_by_kind(models[s], x, y, args.loss_chunk, pattern)}
        marks: dict = {}
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
            marks["resident"] = torch.cuda.memory_allocated(dev)
        step(s, marks)
        if cuda:
            torch.cuda.synchronize()
            marks["peak"] = torch.cuda.max_memory_allocated(dev)
            marks["arena_capacity"] = sum(a.capacity_bytes for n, a in arenas.items() if n == s)
            marks["other_arenas"] = sum(a.capacity_bytes for n, a in arenas.items() if n != s)
        rec["memory_per_token"] = {k: v / args.tokens for k, v in marks.items()}
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        with torch.profiler.profile(activities=acts) as prof:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(s)
            if cuda:
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / args.steps * 1e3
        per, busy = kernel_times(prof)
        rec.update(wall_ms=wall, busy_ms=busy / args.steps,
                   kernels_ms={k: v / args.steps for k, v in sorted(per.items(), key=lambda kv: -kv[1])})
        out["strategies"][s] = rec
        print(f"{s}: wall {wall:.1f} ms/step, device busy {busy / args.steps:.1f} ms/step, memory per token "
              + ", ".join(f"{k} {v / 1024:.1f} KiB" for k, v in rec["memory_per_token"].items()), flush=True)
        print("  saved per token: " + ", ".join(f"{k} {v / 1024:.1f} KiB"
                                               for k, v in rec["saved_bytes_per_token"].items()), flush=True)
    base = out["strategies"]["none"]["kernels_ms"]
    for s in strategies[1:]:
        other = out["strategies"][s]["kernels_ms"]
        diff = {k: other.get(k, 0) - base.get(k, 0) for k in set(base) | set(other)}
        print(f"-- {s} against none: kernels that moved most (ms/step)")
        for k, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:25]:
            print(f"  {v:+8.3f}  {base.get(k, 0):8.3f} -> {other.get(k, 0):8.3f}  {k[:100]}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "hybrid-profile.json"), "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
