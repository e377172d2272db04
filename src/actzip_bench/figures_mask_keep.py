"""docs/wire.md figure of the boundary masks' keep against their loss (see :mod:`actzip_bench.figures`): one
``bench decentralized`` run per keep, the same methods, tasks and seeds in each; per task, method and keep the
final loss against dense's and the pipeline bytes against the bf16 wire's."""

from __future__ import annotations

from pathlib import Path

from actzip_bench.figure_helpers import cite, load, pct

KEEPS = ("0.125", "0.25", "0.5")
RUNS = tuple(f"results/cpu/decentralized-keep-{k}.json" for k in KEEPS)
# run after the first sweep, for the method added after it: the same protocol, its own files
SPLIT_RUNS = tuple(f"results/cpu/decentralized-split-keep-{k}.json" for k in KEEPS)
MASKED = ("mask", "topk-mask", "mask-backward", "split-mask-backward")


def mask_keep(root: Path) -> str:
    recs = [load(root, rel) for rel in RUNS]
    splits = [load(root, rel) for rel in SPLIT_RUNS]
    c = recs[0]["config"]
    lines = ["| task | method | " + " | ".join(f"keep {float(k):g}: loss vs dense, pipeline bytes vs bf16"
                                                for k in KEEPS) + " |",
             "|---|---|" + "---:|" * len(KEEPS)]
    closest = None
    for task in c["tasks"]:
        for method in MASKED:
            cells = []
            for k, rec, split in zip(KEEPS, recs, splits):
                by = {a["method"]: a for a in rec["aggregate"] if a["task"] == task}
                if method not in by:  # in the later run, beside its own dense and bf16
                    by = {a["method"]: a for a in split["aggregate"] if a["task"] == task}
                a, bf16 = by[method], by["bf16"]
                lo, hi = a["final_loss_range"]
                dense = by["dense"]["final_loss"]
                ratio = bf16["pp_bytes_per_step"] / a["pp_bytes_per_step"]
                cells.append(f"{pct(a['loss_vs_dense'])} ({pct(lo / dense - 1)} to {pct(hi / dense - 1)}), "
                             f"{ratio:.2f}x fewer")
                if closest is None or a["loss_vs_dense"] < closest[0]:
                    closest = (a["loss_vs_dense"], task, method, k, ratio)
            lines.append(f"| {task} | {method} | " + " | ".join(cells) + " |")
    gap, task, method, k, ratio = closest
    lines += ["", f"{len(c['seeds'])} seeds each, `--quick` model and steps; of the {len(MASKED) * len(KEEPS)} "
              f"masked settings per task the closest to dense is {method} at keep {float(k):g} on the {task} task: "
              f"{pct(gap)} at {ratio:.2f}x fewer pipeline bytes than bf16 {cite(*RUNS, *SPLIT_RUNS)}."]
    return "\n".join(lines)


FORWARD_RUN = "results/cpu/decentralized-fwd-codecs-0.125.json"
FORWARD_METHODS = ("delta", "mask-backward", "int2-mask-backward", "delta-mask-backward", "delta2-mask-backward")


def forward_codecs(root: Path) -> str:
    """The gradient mask under cheaper forwards, beside the 4-bit delta baseline, one run."""
    rec = load(root, FORWARD_RUN)
    c = rec["config"]
    lines = ["| task | method | loss vs dense (range over seeds) | pipeline bytes vs bf16 |", "|---|---|---:|---:|"]
    for task in c["tasks"]:
        by = {a["method"]: a for a in rec["aggregate"] if a["task"] == task}
        dense, bf16 = by["dense"]["final_loss"], by["bf16"]["pp_bytes_per_step"]
        for method in FORWARD_METHODS:
            a = by[method]
            lo, hi = a["final_loss_range"]
            lines.append(f"| {task} | {method} | {pct(a['loss_vs_dense'])} ({pct(lo / dense - 1)} to "
                         f"{pct(hi / dense - 1)}) | {bf16 / a['pp_bytes_per_step']:.2f}x fewer |")
    lines += ["", f"{len(c['seeds'])} seeds, `--quick` model and steps, mask keep {c['mask_keep']:g} "
              f"{cite(FORWARD_RUN)}."]
    return "\n".join(lines)


RENDERERS = {"wire-mask-keep": mask_keep, "wire-forward-codecs": forward_codecs}
