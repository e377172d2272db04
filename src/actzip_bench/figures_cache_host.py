"""Figures of docs/memory.md on the cache's host time per save and on the norms rebuilt under the lossy
strategies, rendered from committed results (see :mod:`actzip_bench.figures`)."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load

HOST_BEFORE = "results/cpu/cache-host-cost/before.json"  # the tree before role plans (every step tracked)
HOST_AFTER = "results/cpu/cache-host-cost/after.json"
NORMS_QUICK = "results/cpu/cache-norms-quick.json"
MODEL_NAMES = {"gpt-gelu": "GELU GPT", "gpt-relu2": "ReLU² GPT", "llama-swiglu": "Llama"}


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
            f"nothing compressed {_per_save(after, 'count', HOST_AFTER):.1f} µs {cite(HOST_BEFORE, HOST_AFTER)}")


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


RENDERERS = {
    "memory-cache-host-cost": host_cost,
    "memory-cache-norms": norms_bytes,
}
