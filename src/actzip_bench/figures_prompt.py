"""docs/prompt.md figures (see :mod:`actzip_bench.figures`) from the merged ``actzip bench prompt`` record, and the
bench's PNG (accuracy per method and split, with each seed's value)."""

from __future__ import annotations

import statistics
from pathlib import Path

from actzip_bench.figure_helpers import cite, load

__all__ = ["METHOD_NAMES", "RENDERERS", "SPLIT_NAMES", "plot_accuracy", "prompt_section"]

RUN = "results/h200/prompt.json"
METHOD_NAMES = {"full": "full prompt", "vector": "prompt vector", "none": "no prompt", "task_vector": "task vector",
                "soft_prompt": "soft prompt (1 token)", "i2cl": "I2CL-style"}
SPLIT_NAMES = {"train": "seen", "heldout_paraphrase": "held-out wording", "heldout_labels": "held-out labels",
               "heldout_family": "held-out family", "held_out": "all held-out"}
ONE_SLOT = ("task_vector", "soft_prompt")


def _cell(entry: dict | None) -> str:
    if entry is None:
        return ""
    lo, hi = min(entry["per_seed"]), max(entry["per_seed"])
    return f"{entry['mean']:.1%} ({lo:.1%}–{hi:.1%})"


def _positions(rec: dict, method: str) -> str:
    rows = [r["prompt_positions"] for r in rec["rows"] if r["method"] == method]
    return f"{statistics.mean(rows):.1f}" if rows else ""


def accuracy(root: Path) -> str:
    return _accuracy(load(root, RUN), RUN)


def prompt_section(path: Path, root: Path) -> str:
    """docs/RESULTS.md's section of one ``bench prompt`` record (a sweep alone has none)."""
    import json

    from actzip_bench.report_provenance import provenance

    rec = json.loads(path.read_text())
    if not rec.get("summary"):
        return ""
    rel = path.relative_to(root).as_posix()
    return ("\n## Prompt vectors: an instruction prompt against one vector in its place\n\n"
            + provenance(rec, path, root) + "\n\n" + _accuracy(rec, rel) + "\n")


def _accuracy(rec: dict, rel: str) -> str:
    summary, c = rec["summary"], rec["config"]
    splits = [s for s in SPLIT_NAMES if s in summary]
    methods = [m for m in METHOD_NAMES if m in summary[splits[0]]]
    lines = ["| method | prompt positions | " + " | ".join(SPLIT_NAMES[s] for s in splits) + " |",
             "|---|---:|" + "---:|" * len(splits)]
    for m in methods:
        lines.append(f"| {METHOD_NAMES[m]} | {_positions(rec, m)} | "
                     + " | ".join(_cell(summary[s].get(m)) for s in splits) + " |")
    held = summary["held_out"]
    gap = (held["vector"]["mean"] - held["full"]["mean"]) * 100
    best = max((m for m in ONE_SLOT if m in held), key=lambda m: held[m]["mean"])
    over = (held["vector"]["mean"] - held[best]["mean"]) * 100
    model, fit = c["model"], c["fit"]
    n_tasks = len({(r["seed"], r["split"], r["instance"], r["task"]) for r in rec["rows"]})
    lines += ["", f"Exact-match accuracy, mean of {len(c['seeds'])} seeds (their range in brackets), {n_tasks} tasks "
              f"in all, {c['n_fit']} fit examples and {c['n_test']} test queries a task. Reference model: "
              f"{model['n_layer']} blocks, width {model['n_embd']}, {model['steps']} training steps; vector "
              f"L_e = {fit['extract_layer']}, L_i = {fit['inject_layer']}, {fit['steps']} Adam steps for every "
              f"fitted method. On the held-out splits the vector is {gap:+.1f} points from the full prompt (target: "
              f"within 1) and {over:+.1f} points from the best one-slot baseline, {METHOD_NAMES[best]} (target: "
              f"+3) {cite(rel)}."]
    return "\n".join(lines)


def sweep(root: Path) -> str:
    rec = load(root, RUN)
    rows = rec["sweep"]
    settings = sorted({(r["extract_layer"], r["inject_layer"]) for r in rows})
    splits = sorted({r["split"] for r in rows})
    done = {s: {(r["extract_layer"], r["inject_layer"]) for r in rows if r["split"] == s} for s in splits}
    complete = [s for s in splits if done[s] == set(settings)]
    les = sorted({le for le, _ in settings})
    lis = sorted({li for _, li in settings})
    kept = [r for r in rows if r["split"] in complete]
    lines = ["| L_e \\ L_i | " + " | ".join(str(i) for i in lis) + " |", "|---:|" + "---:|" * len(lis)]
    for le in les:
        cells = []
        for li in lis:
            acc = [r["accuracy"] for r in kept if r["extract_layer"] == le and r["inject_layer"] == li]
            cells.append(f"{statistics.mean(acc):.1%}" if acc else "")
        lines.append(f"| {le} | " + " | ".join(cells) + " |")
    n = len({(r["split"], r["task"]) for r in kept})
    note = (f"Prompt-vector accuracy over (L_e, L_i): {len(settings)} settings on {n} tasks of the "
            f"{' and '.join(SPLIT_NAMES[s] for s in complete)} splits, on a seed-{rec['config']['seeds'][0]} "
            "reference model trained again for the sweep (same config; GPU training is not bit-reproducible), "
            "read on test queries, so the best cell is optimistic")
    cut = [s for s in splits if s not in complete]
    if cut:
        note += ("; the run reached its time limit before the " + ", ".join(
            f"{SPLIT_NAMES[s]} split ({len(done[s])} of {len(settings)} settings done, left out)" for s in cut))
    lines += ["", note + f" {cite(RUN)}."]
    return "\n".join(lines)


def cost(root: Path) -> str:
    rec = load(root, RUN)
    cst, probe = rec["cost"], rec["probe"]
    alone = sorted(x["seconds"] for x in rec["single_fit_seconds"])
    shared = statistics.median(r["fit_seconds"] for r in rec["rows"] if r["method"] == "vector")
    lines = [f"Per query, the prompt's {cst['mean_prompt_positions']:.1f} positions (bytes) become one: with a typical "
             f"{cst['query_positions']:g}-position query, {cst['flops_ratio']:.1f}x fewer prefill FLOPs and "
             f"{cst['kv_ratio']:.1f}x fewer KV-cache bytes. One vector fitted alone from {rec['config']['n_fit']} "
             f"examples ({rec['config']['fit']['steps']} steps) takes {statistics.median(alone):.1f} s (median of "
             f"{len(alone)} fits, at most {alone[-1]:.1f} s) on the "
             f"{rec['machine'].get('gpu') or rec['machine'].get('host_cpu')}, with three other benchmark processes "
             f"sharing the GPU; fitted in one batch with its split's other tasks (`PromptVector.fit_many`), "
             f"{shared:.2f} s each."]
    if probe.get("task_identity_accuracy") is not None:
        lines.append(f"Probes (seed {rec['config']['seeds'][0]}): the task family is read back from the vectors "
                     f"by leave-one-out nearest centroid {probe['task_identity_accuracy']:.0%} of the time "
                     f"({probe['task_identity_vectors']} vectors, chance {probe['task_identity_chance']:.0%}); on "
                     f"the bijection tasks {probe['bijection_answers_in_prompt_labels']:.0%} of the vector's answers "
                     f"are one of the prompt's own label words ({probe['bijection_accuracy']:.0%} right).")
    return " ".join(lines) + f" {cite(RUN)}"


def plot_accuracy(record: dict, path) -> None:
    """Bars: mean accuracy per method and split; dots: each seed (one PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = record["summary"]
    splits = [s for s in SPLIT_NAMES if s in summary and s != "held_out"]
    methods = [m for m in METHOD_NAMES if m in summary[splits[0]]]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(splits))]
        ax.bar(xs, [summary[s][m]["mean"] for s in splits], width, label=METHOD_NAMES[m])
        for x, s in zip(xs, splits):
            ax.scatter([x] * len(summary[s][m]["per_seed"]), summary[s][m]["per_seed"], s=6, color="black")
    ax.set_xticks(range(len(splits)), [SPLIT_NAMES[s] for s in splits])
    ax.set_ylabel("exact-match accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"instruction prompt vs one vector ({len(record['config']['seeds'])} seeds)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


RENDERERS = {"prompt-accuracy": accuracy, "prompt-sweep": sweep, "prompt-cost": cost}
