"""Figures of docs/lora.md rendered from the committed LoRA benchmark results and naming them (see
:mod:`actzip_bench.figures`). Peak memory and step time come from each method's first, timed run; test accuracy
is the mean ± standard deviation over the fine-tuning runs a file records, in points."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load, pct, span_where

H200 = "results/h200/lora.json"
H200_SECOND = "results/h200/lora-cosine.json"
H200_CONSTANT = "results/h200/lora-seeds.json"
QUICK = "results/cpu/lora-quick.json"

NAMES = {"lora": "LoRA", "lora+checkpoint": "LoRA + checkpointing", "fa": "LoRA-FA", "care": "CARE-LoRA"}

TARGETS = {  # the benchmark's target keys -> what they ask of CARE-LoRA
    "peak_at_most_0.7x_lora": "peak at most 0.7× LoRA's",
    "time_at_most_1.1x_lora": "step time at most 1.1× LoRA's",
    "accuracy_within_1_point": "mean test accuracy within 1 point of LoRA's",
}


def _name(method: str) -> str:
    return NAMES.get(method, f"`{method}`")


def _run(rec: dict, method: str, rel: str) -> dict:
    """The run of ``method`` in the record at ``rel``; a ConfigError naming the file when it has none."""
    run = next((r for r in rec.get("runs", []) if r.get("method") == method), None)
    if run is None:
        raise ConfigError(f"figure: results file {rel} has no run of method {method!r}")
    return run


def _acc(run: dict, rel: str) -> str:
    """Mean test accuracy ± its standard deviation over the runs, in points: ``75.0% ± 0.8``."""
    if "test_accuracy_mean" not in run or "test_accuracy_std" not in run:
        raise ConfigError(f"figure: results file {rel} has no test accuracy over several runs for {run['method']!r}")
    return f"{run['test_accuracy_mean']:.1%} ± {100 * run['test_accuracy_std']:.1f}"


def _points(v: float) -> str:
    return f"{v:+.1f} points"


def _grad_a(run: dict, rel: str) -> dict:
    if "grad_a_rel_error" not in run:
        raise ConfigError(f"figure: results file {rel} has no grad_A error for {run['method']!r}")
    return run["grad_a_rel_error"]


def _runs_of(rec: dict) -> int:
    return int(rec["config"].get("seeds", 1))


def _count(n: int) -> str:
    return {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}.get(n, str(n))


def h200_table(root: Path) -> str:
    """The H200 fine-tuning table (peak, step time, test accuracy over the runs, against LoRA) of
    results/h200/lora.json, whether CARE-LoRA meets the benchmark's targets, the second run of the same
    configuration (results/h200/lora-cosine.json), and the gap between LoRA and LoRA with checkpointing as the
    accuracy's noise floor."""
    rec, second = load(root, H200), load(root, H200_SECOND)
    c, n = rec["config"], _runs_of(rec)
    lines = [
        f"What they show on the {gpu(rec)} (Llama d={c['hidden']}, {c['layers']} layers, {c['dtype']}, "
        f"r={c['rank']}, batch {c['batch_size']}, {c['steps']} steps, {c.get('lr_schedule', 'constant')} "
        f"learning-rate schedule, {_count(n)} fine-tuning runs per method; peak and step time of the first run, "
        f"accuracy as mean ± standard deviation in points over the {_count(n)}) {cite(H200)}:",
        "",
        f"| method | peak vs LoRA | step time vs LoRA | test accuracy ({n} runs) | vs LoRA |",
        "|---|---:|---:|---:|---:|",
    ]
    for method in c["methods"]:
        run = _run(rec, method, H200)
        if method == "lora":
            lines.append(f"| {_name(method)} | — | — | {_acc(run, H200)} | — |")
            continue
        cells = [pct(run["peak_vs_lora"] - 1), pct(run["time_vs_lora"] - 1), _acc(run, H200),
                 _points(run["mean_accuracy_vs_lora_points"])]
        if method == "care":
            cells = [f"**{x}**" if i != 2 else x for i, x in enumerate(cells)]
        lines.append(f"| {_name(method)} | " + " | ".join(cells) + " |")

    targets = rec.get("targets") or {}
    unknown = sorted(set(targets) - set(TARGETS))
    if not targets or unknown:
        raise ConfigError(f"figure: results file {H200} has no targets, or ones this page cannot name: {unknown}")
    met = [TARGETS[k] for k, v in targets.items() if v is True]
    missed = [TARGETS[k] for k, v in targets.items() if v is not True]  # False, or None: not measured
    if not missed:
        verdict = f"CARE-LoRA meets all {_count(len(met))} of the benchmark's targets ({', '.join(met)})"
    else:
        verdict = f"CARE-LoRA misses {', '.join(missed)}" + (f", and meets {', '.join(met)}" if met else "")
    grad_b = _grad_a(_run(rec, "care", H200), H200).get("grad_b_bit_identical")
    verdict += "; grad_B is bit-identical to LoRA's." if grad_b else "; grad_B is not bit-identical to LoRA's."

    care2, lora2 = _run(second, "care", H200_SECOND), _run(second, "lora", H200_SECOND)
    day = ("the same day" if rec["machine"]["date"][:10] == second["machine"]["date"][:10]
           else f"on {second['machine']['date'][:10]}")
    again = (f"A second run of the same configuration {day} {cite(H200_SECOND)} gave CARE-LoRA "
             f"{_points(care2['mean_accuracy_vs_lora_points'])} ({_acc(care2, H200_SECOND)} against "
             f"{_acc(lora2, H200_SECOND)}) at {pct(care2['peak_vs_lora'] - 1)} peak and "
             f"{pct(care2['time_vs_lora'] - 1)} step time.")
    ckpt = _run(rec, "lora+checkpoint", H200)
    floor = ("Read the accuracy with its noise floor in mind: LoRA with checkpointing computes the same numbers as "
             "LoRA in exact arithmetic (the CPU test checks its losses are equal), yet on the GPU, where attention's "
             "backward and some matmuls add in a run-dependent order, its mean landed "
             f"{abs(ckpt['mean_accuracy_vs_lora_points']):.1f} points away. A 1-point target is at the edge of what "
             f"{_count(n)} runs can resolve.")
    return "\n".join(lines + ["", " ".join([verdict, again, floor])])


def schedule(root: Path) -> str:
    """The run-to-run spread of test accuracy with a constant learning rate (results/h200/lora-seeds.json)
    against the range of spreads with the cosine decay (results/h200/lora.json, results/h200/lora-cosine.json)."""
    const = load(root, H200_CONSTANT)
    c = const["config"]
    if c.get("lr_schedule", "constant") != "constant":
        raise ConfigError(f"figure: results file {H200_CONSTANT} was not run with a constant learning rate")
    each = []
    for method in c["methods"]:
        run = _run(const, method, H200_CONSTANT)
        gap = "" if method == "lora" else f" ({_points(run['mean_accuracy_vs_lora_points'])})"
        each.append(f"{_name(method)} {_acc(run, H200_CONSTANT)}{gap}")
    spreads = []
    for rel, label in ((H200, "first run"), (H200_SECOND, "second run")):
        rec = load(root, rel)
        for method in rec["config"]["methods"]:
            run = _run(rec, method, rel)
            if "test_accuracy_std" not in run:
                raise ConfigError(f"figure: results file {rel} has no accuracy spread for {method!r}")
            spreads.append((100 * run["test_accuracy_std"], f"{_name(method)}, {label}"))
    return (f"The learning-rate schedule matters for that resolution. With a constant rate (the bench's earlier "
            f"default; {c['steps']} steps, {_count(_runs_of(const))} runs per method) test accuracy was "
            f"{'; '.join(each)} {cite(H200_CONSTANT)}: each run's accuracy was read wherever a large step size left "
            "it. With the cosine decay (now the default, `--lr-schedule constant` for "
            "the old behaviour) every method's standard deviation is "
            f"{span_where(spreads, lambda v: f'{v:.1f}')} points {cite(H200, H200_SECOND)}.")


def grad_a(root: Path) -> str:
    """CARE-LoRA's grad_A relative error on the H200 (over all layers, median and per-layer range) in both runs
    of the configuration, and the extra-rank lever `care+48p1` of results/h200/lora-cosine.json with its peak,
    step time and accuracy."""
    rec, second = load(root, H200), load(root, H200_SECOND)
    parts = []
    for r, rel in ((rec, H200), (second, H200_SECOND)):
        e = _grad_a(_run(r, "care", rel), rel)
        parts.append(f"{e['global']:.1%} over all layers (median {e['median']:.1%}, per layer {e['min']:.1%} to "
                     f"{e['max']:.1%}) {cite(rel)}")
    out = [f"Measured against exact LoRA on one training batch after the first run's fine-tuning, CARE-LoRA's "
           f"grad_A relative error was {parts[0]}, and {parts[1]} in the second run."]
    for method in second["config"]["methods"]:
        if not method.startswith("care") or method == "care":
            continue
        run = _run(second, method, H200_SECOND)
        e = _grad_a(run, H200_SECOND)
        out.append(f"`{method}` brings it to {e['global']:.1%} "
                   f"(median {e['median']:.1%}) at {pct(run['peak_vs_lora'] - 1)} peak, but "
                   f"{pct(run['time_vs_lora'] - 1)} step time and accuracy {_acc(run, H200_SECOND)} "
                   f"({_points(run['mean_accuracy_vs_lora_points'])} from LoRA) {cite(H200_SECOND)}.")
    return " ".join(out)


def quick_extra_rank(root: Path) -> str:
    """One line: grad_A's relative error over all layers of every CARE method of the quick CPU run."""
    rec = load(root, QUICK)
    cares = [m for m in rec["config"]["methods"] if m.startswith("care")]
    if not cares:
        raise ConfigError(f"figure: results file {QUICK} has no CARE run")
    each = [f"{_grad_a(_run(rec, m, QUICK), QUICK)['global']:.1%} for `{m}`" for m in cares]
    c = rec["config"]
    return (f"on the quick CPU benchmark (r={c['rank']}, d={c['hidden']}) the error over all layers was "
            f"{' and '.join(each)} {cite(QUICK)}")


def quick_chance(root: Path) -> str:
    """One line: the quick CPU run's test accuracy over every method against chance."""
    rec = load(root, QUICK)
    accs = [_run(rec, m, QUICK)["test_accuracy"] for m in rec["config"]["methods"]]
    lo, hi = f"{min(accs):.1%}", f"{max(accs):.1%}"
    acc = lo if lo == hi else f"{lo} to {hi}"
    n = _runs_of(rec)
    runs = "one run" if n == 1 else f"{n} runs"
    return (f"every method at {acc} test accuracy, {runs} each, against {rec['task']['chance_accuracy']:.1%} "
            f"by chance {cite(QUICK)}")


RENDERERS = {"lora-h200": h200_table, "lora-schedule": schedule, "lora-grad-a": grad_a,
             "lora-quick-extra-rank": quick_extra_rank, "lora-quick-chance": quick_chance}
