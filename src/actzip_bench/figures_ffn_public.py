"""docs/memory.md figure of the public BitSparse code's own FFN workload (see :mod:`actzip_bench.figures`):
``results/h200/ffn-public/DENSITY-ROWS.json``, each an ``actzip bench ffn --harness public`` run, set against
``results/h200/ffn-public/public-code.json``, the public code's figures measured on the same workload (its
code is not in this tree; the file says where the figures come from)."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load, load_folder, pct

FOLDER = "results/h200/ffn-public"
PUBLIC = f"{FOLDER}/public-code.json"
MIB = 2**20
LABELS = {
    "none": "plain PyTorch autograd",
    "relu-only": "dense function keeping only relu(h)",
    "checkpoint": "activation checkpointing",
    "fused": "actzip, `SparseMLPConfig(arena=None)`",
    "fused-arena": "actzip, `SparseMLPConfig()`",
    "fused-arena-signpack": "actzip, `SparseMLPConfig()` + sign packing",
}
TARGET_ROWS = 16000


def _runs(root: Path) -> dict[tuple[str, int], dict]:
    found = {}
    for rel, rec in load_folder(root, FOLDER):
        if rel == PUBLIC:
            continue
        c = rec["config"]
        if c.get("harness") != "public":
            raise ConfigError(f"figure: {rel} is not a --harness public run")
        found[(c["density"], c["rows"])] = rec
    if not found:
        raise ConfigError(f"figure: {FOLDER} holds no --harness public run")
    return found


def ffn_public(root: Path) -> str:
    """Peak (MiB) and step time against plain PyTorch per strategy, density and row count; then the targets at
    16,000 rows against the public code's peaks."""
    runs = _runs(root)
    public = load(root, PUBLIC)
    any_rec = next(iter(runs.values()))
    versions = {r["machine"].get("code_version") for r in runs.values()}
    version = ", ".join(sorted(v[:10] if v else "unrecorded" for v in versions))
    c = any_rec["config"]
    lines = [f"{c['n_blocks']} blocks, d={c['d']}, hidden {c['hidden']}, {c['dtype']}, on {gpu(any_rec)}, code "
             f"{version}; peak in MiB above what was resident, arena included, and step time against plain "
             "PyTorch (median of the interleaved rounds). Every strategy's gradients are bit-identical to plain "
             "PyTorch's (max |Δ| 0 in every run).", ""]
    for density in ("mid", "low"):
        sizes = sorted(r for d, r in runs if d == density)
        if not sizes:
            continue
        dens = [runs[(density, r)]["density"] for r in sizes]
        lines += [f"**{density} density** (measured {min(dens):.3f}–{max(dens):.3f}):", "",
                  "| strategy | " + " | ".join(f"{r:,} rows" for r in sizes) + " |",
                  "|---|" + "---:|" * len(sizes)]
        for s, label in LABELS.items():
            cells = []
            for r in sizes:
                row = next((x for x in runs[(density, r)]["runs"] if x["strategy"] == s), None)
                if row is None:
                    cells.append("")
                    continue
                if row["max_grad_abs_diff"] != 0:
                    raise ConfigError(f"figure: {s} at {density}/{r} rows has gradient differences")
                cells.append(f"{row['peak_bytes'] / MIB:,.0f} ({pct(row['time_vs_none'] - 1)})")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _targets(runs, public)
    lines += ["", f"{cite(FOLDER)}"]
    return "\n".join(lines)


def _targets(runs: dict, public: dict) -> list[str]:
    """The public code's peaks at 16,000 rows and actzip's as a fraction of them."""
    out = [f"Against the public code at {TARGET_ROWS:,} rows ({public['source']}):", "",
           "| density | public, exact allocation | actzip `SparseMLPConfig()` | public, 15-bit packing | "
           "actzip + sign packing |", "|---|---:|---:|---:|---:|"]
    for density in ("mid", "low"):
        rec = runs.get((density, TARGET_ROWS))
        if rec is None:
            continue
        by = {x["strategy"]: x for x in rec["runs"]}
        pub = public["peak_mib"][density]

        def cell(ours: str, theirs: str) -> str:
            if ours not in by:
                return ""
            mib = by[ours]["peak_bytes"] / MIB
            return f"{mib:,.0f} MiB = {mib / pub[theirs]:.3f}× at {pct(by[ours]['time_vs_none'] - 1)}"

        out.append(f"| {density} | {pub['exact']:,} MiB | {cell('fused-arena', 'exact')} | {pub['signpack']:,} MiB | "
                   f"{cell('fused-arena-signpack', 'signpack')} |")
    return out


RENDERERS = {"memory-ffn-public": ffn_public}
