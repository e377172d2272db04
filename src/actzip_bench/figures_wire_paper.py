"""Figure of the paper ablation of the subspace and bottleneck boundaries (``scripts/wire_ablation.sh paper``; see
:mod:`actzip_bench.figures`): each difference from the published versions changed alone and all together, dense
beside under both optimizers, every record ``NAME-sSEED.json`` one ``actzip bench wire`` run at equal tokens.

The gap of a run is its final training loss (the mean of its last tenth of steps) against the same seed's dense
run with AdamW, and against the better of the seed's two dense runs; held-out losses beside. The RVQ table
(``scripts/wire_ablation.sh rvq``) measures the Stiefel boundary's RVQ against its 8-bit codes the same way, with
the paper ablation's dense runs (same protocol, checked) beside.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, mean_range

FOLDERS = {  # folder -> what it measured; the first must exist, the others are shown once committed
    "results/cpu/wire-paper-ablation": "the small GPT (4 blocks, d = 256) on the CPU, 2 stages, 500 steps",
    "results/cpu/wire-paper-ablation-4st": "the same in 4 stages (one block each, 3 boundaries), the key variants",
    "results/h100/wire-paper-ablation-2st": "the 124M GPT (12 blocks, d = 768), 2 stages, 1200 steps, the key variants",
    "results/h200/wire-paper-ablation-2st": "the 124M GPT (12 blocks, d = 768), 2 stages, 1200 steps",
    "results/h200/wire-paper-ablation-4st": "the 124M GPT, 4 stages, 1200 steps",
}
VARIANTS = {  # record name -> table label, in table order
    "dense": "dense, AdamW (reference)",
    "dense-muon": "dense, Muon",
    "subspace": "subspace as it was (AdamW)",
    "subspace-fixed1": "subspace, fixed embedding at std 1",
    "full-fixed002": "subspace boundary at full rank (no compression), fixed embedding at 0.02",
    "full-fixed1": "subspace boundary at full rank (no compression), fixed embedding at std 1",
    "subspace-zero": "subspace, `W′` from zero",
    "subspace-muon": "subspace, Muon",
    "subspace-paper": "subspace, all three (the paper's recipe)",
    "subspace-zero-muon": "subspace, `W′` from zero and Muon",
    "bottleneck": "bottleneck, linear style as it was (AdamW)",
    "bottleneck-muon": "bottleneck, linear style, Muon",
    "bottleneck-resbm": "bottleneck, `resbm` style (AdamW)",
    "bottleneck-paper": "bottleneck, `resbm` style and Muon (the paper's)",
}


RVQ_FOLDER = "results/cpu/wire-rvq-ablation"
RVQ_VARIANTS = {  # the reference (plain 8-bit codes) first
    "stiefel-8bit": "Stiefel, 8 values in 8-bit codes (reference)",
    "stiefel-rvq": "RVQ as it was: 16 values, 9 levels of 256 rows, every moved row streamed in float32",
    "stiefel-rvq-bounded": "RVQ, the stream bounded to 32 bfloat16 rows a step",
    "stiefel-rvq-bounded-w8": "RVQ bounded, of 8 values (the reference's width)",
    "stiefel-rvq-bounded-k16": "RVQ bounded, 16 levels of 16 rows (4-bit indices)",
    "stiefel-rvq-bounded-k16-bwd8": "the same, its code gradients in 8 bits",
}


def _records(root: Path, folder: str, variants: dict = VARIANTS, need_dense: bool = True) -> dict[str, dict[int, dict]]:
    """{variant: {seed: run}} of a folder's ``NAME-sSEED.json`` records (the run with a modelled link)."""
    got: dict[str, dict[int, dict]] = {}
    for path in sorted((Path(root) / folder).glob("*.json")):
        name, _, seed = path.stem.rpartition("-s")
        if name not in variants or not seed.isdigit():
            continue
        rec = json.loads(path.read_text())
        run = next(r for r in rec["runs"] if r["bandwidth_mbps"] is not None)
        got.setdefault(name, {})[int(seed)] = {**run, "_machine": gpu(rec), "_config": rec["config"]}
    first = next(iter(variants)) if not need_dense else "dense"
    seeds = set(got.get(first, {}))
    if not seeds:
        raise ConfigError(f"figure: {folder} has no {first}-sSEED.json record (the reference of every gap)")
    for name, by_seed in got.items():  # a variant may lack a seed (a run that failed), never have one more
        if not set(by_seed) <= seeds:
            raise ConfigError(f"figure: {folder}: {name} has seeds {sorted(by_seed)}, {first} has {sorted(seeds)}")
    return got


def _table(got: dict[str, dict[int, dict]]) -> list[str]:
    seeds = sorted(got["dense"])
    best = {s: min(got[n][s]["final_loss"] for n in ("dense", "dense-muon") if n in got) for s in seeds}
    lines = ["| entry | forward ratio | gap to dense (AdamW) | gap to the better dense | held-out gap to dense (AdamW) |",
             "|---|---:|---:|---:|---:|"]
    for name, label in VARIANTS.items():
        if name not in got:
            continue
        runs = got[name]
        mine = sorted(runs)  # each gap against the same seed's dense
        ratio = statistics.fmean(runs[s]["measured_ratio_fwd"] for s in mine)
        gap = [runs[s]["final_loss"] / got["dense"][s]["final_loss"] - 1 for s in mine]
        gap_best = [runs[s]["final_loss"] / best[s] - 1 for s in mine]
        held = [runs[s]["val_loss"] / got["dense"][s]["val_loss"] - 1 for s in mine]
        show = mean_range if len(mine) > 1 else (lambda v: f"{v[0]:+.1%}")
        if mine != seeds:
            label += f" (seed{'s' if len(mine) > 1 else ''} {', '.join(map(str, mine))} only)"
        lines.append(f"| {label} | {ratio:.1f} | {show(gap)} | {show(gap_best)} | {show(held)} |")
    return lines


def wire_paper_ablation(root: Path) -> str:
    parts = []
    for i, (folder, what) in enumerate(FOLDERS.items()):
        if i and not (Path(root) / folder).is_dir():
            continue
        got = _records(root, folder)
        seeds = sorted(got["dense"])
        cfg = got["dense"][seeds[0]]["_config"]
        machine = got["dense"][seeds[0]]["_machine"]
        parts.append(
            f"On {what}, at rate {cfg['lr']:g} for every entry, fresh windows, 16-bit codes, on {machine}; mean "
            f"and range over seeds {', '.join(map(str, seeds))} {cite(folder)}:\n\n" + "\n".join(_table(got)))
    return "\n\n".join(parts)


_PROTOCOL = ("model", "stages", "steps", "lr", "batch_size", "dataset_windows", "block_size", "n_embd")


def wire_rvq_ablation(root: Path) -> str:
    got = _records(root, RVQ_FOLDER, RVQ_VARIANTS, need_dense=False)
    dense = _records(root, next(iter(FOLDERS)))["dense"]
    ref = got["stiefel-8bit"]
    seeds = sorted(ref)
    if not set(seeds) <= set(dense):
        raise ConfigError(f"figure: {next(iter(FOLDERS))} lacks dense for seeds {sorted(set(seeds) - set(dense))}")
    mine, theirs = ref[seeds[0]]["_config"], dense[seeds[0]]["_config"]
    differ = [k for k in _PROTOCOL if mine.get(k) != theirs.get(k)]
    if differ:
        raise ConfigError(f"figure: {RVQ_FOLDER} and its dense reference differ in {differ}")
    show = mean_range if len(seeds) > 1 else (lambda v: f"{v[0]:+.1%}")
    lines = ["| entry | forward ratio | backward ratio | RVQ relative error | gap to the 8-bit codes | gap to dense "
             "| held-out gap to the 8-bit codes |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, label in RVQ_VARIANTS.items():
        if name not in got:
            continue
        runs = got[name]
        fwd = statistics.fmean(runs[s]["measured_ratio_fwd"] for s in seeds)
        bwd = statistics.fmean(runs[s]["measured_ratio_fwd"] * runs[s]["bytes_per_token_fwd"]
                               / runs[s]["bytes_per_token_bwd"] for s in seeds)  # dense bytes / backward bytes
        errs = [runs[s].get("rvq_relative_error") for s in seeds]
        err = f"{statistics.fmean(errs):.3f}" if all(e is not None for e in errs) else "-"
        gap = [runs[s]["final_loss"] / ref[s]["final_loss"] - 1 for s in seeds]
        gap_dense = [runs[s]["final_loss"] / dense[s]["final_loss"] - 1 for s in seeds]
        held = [runs[s]["val_loss"] / ref[s]["val_loss"] - 1 for s in seeds]
        lines.append(f"| {label} | {fwd:.1f} | {bwd:.1f} | {err} | {show(gap)} | {show(gap_dense)} | {show(held)} |")
    return (f"On the small GPT on the CPU, the paper ablation's protocol (2 stages, 500 fresh-window steps, rate "
            f"{mine['lr']:g}), Stiefel boundaries with full-rank anchors; mean and range over seeds "
            f"{', '.join(map(str, seeds))} {cite(RVQ_FOLDER, next(iter(FOLDERS)))}:\n\n" + "\n".join(lines))


RENDERERS = {"wire-paper-ablation": wire_paper_ablation, "wire-rvq-ablation": wire_rvq_ablation}
