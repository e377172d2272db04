"""Figures of docs/memory.md on the cache's host time per save and on the norms rebuilt under the lossy
strategies, rendered from committed results (see :mod:`actzip_bench.figures`)."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load
from actzip_bench.figures_memory_docs import PROSE_NAMES as MODEL_NAMES

HOST_BEFORE = "results/cpu/cache-host-cost/before.json"  # the tree before role plans (every step tracked)
HOST_AFTER = "results/cpu/cache-host-cost/after.json"
GPU_HOST_BEFORE = "results/h100/cache-host-cost/before.json"  # the same two trees, every kernel launched
GPU_HOST_AFTER = "results/h100/cache-host-cost/after.json"
NORMS_QUICK = "results/cpu/cache-norms-quick.json"
PROFILES = ("results/h100/cache-profile/gpt.json", "results/h100/cache-profile/llama.json")  # scripts/cache_profile.py
NORMS_GPU = ("results/h100/cache-norms/all.json",)  # the full stage: both models, every strategy, 8 timed steps


def _per_save(rec: dict, variant: str, rel: str) -> float:
    row = next((r for r in rec["rows"] if r["variant"] == variant), None)
    if row is None:
        raise ConfigError(f"figure: {rel} has no variant {variant!r}")
    return row["us_per_save"]


def host_cost(root: Path) -> str:
    """The host microseconds per save of the 4bit preset before and after role plans, and the parts."""
    before, after = load(root, HOST_BEFORE), load(root, HOST_AFTER)
    code = lambda rec: rec["machine"].get("code_version") or "unrecorded"  # noqa: E731
    launches = after["launches"]
    return (f"On the development CPU ({after['machine']['host_cpu']}, kernel launches {launches}; a tiny GPT's "
            f"forward of {after['saves_per_forward']} saves, {after['quant_saves_per_forward']} of them quantized), "
            f"the 4bit preset's host time per save is {_per_save(after, '4bit', HOST_AFTER):.1f} µs with the roles "
            f"replayed and {_per_save(after, '4bit, tracked every step', HOST_AFTER):.1f} µs tracked every step "
            f"(code {code(after)[:7]}), against {_per_save(before, '4bit', HOST_BEFORE):.1f} µs before role plans "
            f"(code {code(before)[:7]}, run right before it on the same machine); of that, the tracker alone costs "
            f"{_per_save(after, 'tracker', HOST_AFTER):.1f} µs a save and the cache's hooks and accounting with "
            f"nothing compressed {_per_save(after, 'count', HOST_AFTER):.1f} µs {cite(HOST_BEFORE, HOST_AFTER)}. "
            + _gpu_host_cost(root))


def _gpu_host_cost(root: Path) -> str:
    before, after = load(root, GPU_HOST_BEFORE), load(root, GPU_HOST_AFTER)
    return (f"On an {after['machine']['gpu']} with every kernel launched ({after['saves_per_forward']} saves a "
            f"forward there, {after['quant_saves_per_forward']} quantized), the same two trees one after the other: "
            f"{_per_save(before, '4bit', GPU_HOST_BEFORE):.1f} µs a save before, "
            f"{_per_save(after, '4bit', GPU_HOST_AFTER):.1f} µs after ("
            f"{_per_save(after, '4bit, tracked every step', GPU_HOST_AFTER):.1f} µs tracked every step); the "
            f"tracker {_per_save(after, 'tracker', GPU_HOST_AFTER):.1f} µs, the count-only cache "
            f"{_per_save(after, 'count', GPU_HOST_AFTER):.1f} µs {cite(GPU_HOST_BEFORE, GPU_HOST_AFTER)}")


def norms_bytes(root: Path) -> str:
    """Saved-bytes ratios of the lossy strategies without and with the norms rebuilt, per model (tiny size)."""
    rec = load(root, NORMS_QUICK)
    pairs = [("4bit", "4bit+norms"), ("2bit", "2bit+norms"), ("sketch-d8", "sketch-d8+norms")]
    lines = ["| model | " + " | ".join(f"`{a}` | `{b}`" for a, b in pairs) + " |",
             "|---|" + "---:|" * (2 * len(pairs))]
    for m in rec["models"]:
        runs = {r["strategy"]: r for r in m["runs"]}
        missing = [s for p in pairs for s in p if s not in runs]
        if missing:
            raise ConfigError(f"figure: {NORMS_QUICK} lacks {missing} for {m['model']}")
        cells = " | ".join(f"{runs[s]['x_smaller']:.2f}×" for p in pairs for s in p)
        lines.append(f"| {MODEL_NAMES.get(m['model'], m['model'])} | {cells} |")
    cfg = rec["config"]
    lines += ["", f"Saved activation bytes, times smaller than plain PyTorch's, {cfg['batch_size']} x {cfg['seq_len']} "
              f"tokens at the tiny size on the CPU (bytes only: the peak is a GPU figure) {cite(NORMS_QUICK)}."]
    return "\n".join(lines)


def norms_gpu(root: Path) -> str:
    """Bytes, peak and step time of the lossy strategies without and with the norms rebuilt at 124M on the GPU."""
    rows, machine = {}, None
    for rel in NORMS_GPU:
        rec = load(root, rel)
        machine = rec["machine"]
        for m in rec["models"]:
            for r in m["runs"]:
                if r["strategy"] != "none":
                    rows[(m["model"], m["params"], r["strategy"])] = (r, rel, rec["config"]["rounds"])
    lines = ["| model | strategy | saved bytes | peak memory | step time |", "|---|---|---:|---:|---:|"]
    order = ("4bit", "4bit+norms", "2bit", "2bit+norms", "sketch-d8", "sketch-d8+norms")
    for (model, params, strategy), (r, _, _) in sorted(rows.items(), key=lambda kv: (kv[0][0], order.index(kv[0][2]))):
        lines.append(f"| {MODEL_NAMES.get(model, model)} {params / 1e6:.0f}M | `{strategy}` | {r['x_smaller']:.2f}× "
                     f"smaller | {(r['peak_vs_none'] - 1) * 100:+.1f}% | {(r['time_vs_none'] - 1) * 100:+.1f}% |")
    rounds = sorted({n for _, _, n in rows.values()})
    sketch = {k[0]: r for k, (r, _, _) in rows.items() if k[2] == "sketch-d8+norms"}
    met = [f"{MODEL_NAMES.get(m, m)} ({(r['peak_vs_none'] - 1) * 100:+.1f}%)" for m, r in sorted(sketch.items())
           if r["peak_vs_none"] <= 0.75]
    lines += ["", f"On an {machine['gpu']}, 32 x 1024 tokens, 1024-token loss chunks, each file one run of "
              f"{' or '.join(map(str, rounds))} timed steps a strategy after the bench's warm-up, interleaved with "
              f"plain PyTorch in the same run (peak and step time against it) {cite(*NORMS_GPU)}. With the norms "
              f"rebuilt the sketch's peak is at least 25% lower on {', '.join(met) or 'none'}."]
    return "\n".join(lines)


def _short(kernel: str) -> str:
    """A kernel's name without its template arguments: what a reader can find in the code."""
    return kernel.split("<")[0].split("(")[0].strip()[:60]


def cache_profile(root: Path) -> str:
    """Per model and strategy: the profiled step, the GPU's busy time, the time it waits for the host, and the
    kernel groups that cost the most over the plain step."""
    head = ["model", "strategy", "step ms", "GPU busy ms", "GPU waiting ms", "kernels that cost the most over none"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * 3 + "---|"]
    rels = [rel for rel in PROFILES if (Path(root) / rel).exists()]
    if not rels:
        raise ConfigError(f"figure: none of {', '.join(PROFILES)} exists")
    busier = []  # (model, strategy, GPU busy time over the plain step's)
    for rel in rels:
        rec = load(root, rel)
        rows = {r["strategy"]: r for r in rec["rows"]}
        if "none" not in rows:
            raise ConfigError(f"figure: {rel} has no 'none' row to compare with")
        base = rows["none"]["kernels"]
        name = MODEL_NAMES.get(rec["model"], rec["model"])
        busier += [(name, r["strategy"], r["gpu_busy_ms"] / rows["none"]["gpu_busy_ms"] - 1)
                   for r in rec["rows"] if r["strategy"] != "none"]
        for r in rec["rows"]:
            extra = sorted(((k, v["ms"] - base.get(k, {"ms": 0.0})["ms"]) for k, v in r["kernels"].items()),
                           key=lambda kv: -kv[1])
            top = "; ".join(f"{_short(k)} +{ms:.2f}" for k, ms in extra[:3] if ms > 0.05) or "-"
            top = top if r["strategy"] != "none" else "-"
            lines.append(f"| {name} | {r['strategy']} | {r['step_ms']:.1f} | {r['gpu_busy_ms']:.1f} | "
                         f"{r['gpu_idle_ms']:.1f} | {top} |")
    c = load(root, rels[0])
    return "\n".join([
        f"`scripts/cache_profile.py`, {c['config']['batch_size']} × {c['config']['seq_len']} tokens, "
        f"{c['config']['dtype']}, {c['config']['steps']} profiled steps per strategy after 3 warm-up steps, on "
        f"{c['machine'].get('gpu', c['machine']['host_cpu'])}; the GPU's busy time is the sum of its kernels' "
        "own intervals, the rest of the step it waits (the profiler's own host work lengthens every step, so "
        "compare the busy times, not these steps, with the bench's):", "", *lines, "",
        "The GPU's own work is " + ", ".join(f"{(b * 100):+.1f}% under `{s}` ({m})" for m, s, b in busier)
        + f" against the plain step's {cite(*rels)}."])


RENDERERS = {
    "memory-cache-profile": cache_profile,
    "memory-cache-host-cost": host_cost,
    "memory-cache-norms": norms_bytes,
    "memory-cache-norms-gpu": norms_gpu,
}
