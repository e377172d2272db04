"""docs/memory.md figure of the lossy presets' price in loss over several seeds of one code version (see
:mod:`actzip_bench.figures`): ``results/cpu/presets-seeds/MODEL-seedS.json``, each a ``bench presets`` run of
``lossless``, ``4bit`` and ``2bit`` from seed S's weights and batches."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load_folder, mean_range, pct

FOLDER = "results/cpu/presets-seeds"
MODELS = {"gelu": "GELU GPT", "relu2": "ReLU² GPT", "swiglu": "SwiGLU Llama"}
PRESETS = ("4bit", "2bit")


def presets_seeds(root: Path) -> str:
    """Per model and preset: the final training-loss gap and the validation gap to ``lossless``, mean and range
    over the seeds, with the seed count and the code version the runs share."""
    by_model: dict[str, list[dict]] = {m: [] for m in MODELS}
    for rel, rec in load_folder(root, FOLDER):
        act = rec["config"]["activation"]
        if act not in by_model:
            raise ConfigError(f"figure: {rel} is a {act!r} model; {FOLDER} holds {', '.join(MODELS)}")
        by_model[act].append(rec)
    missing = [m for m, recs in by_model.items() if not recs]
    if missing:
        raise ConfigError(f"figure: {FOLDER} has no run of {', '.join(missing)}")
    counts = {m: len({r["config"]["seed"] for r in recs}) for m, recs in by_model.items()}
    versions = {r["machine"].get("code_version") for recs in by_model.values() for r in recs}
    version = (f"code version {next(iter(versions))[:10]}" if len(versions) == 1 and None not in versions
               else f"{len(versions)} code versions")
    c = next(iter(by_model.values()))[0]["config"]
    seeds = min(counts.values())
    lines = [
        f"Over {seeds} seeds (weights and batches; {c['steps']} steps each, every run of {version}), the gap to "
        "`lossless` in the final training loss, and in validation loss after it, as mean (lowest to highest):",
        "",
        f"| preset | {' | '.join(MODELS.values())} |",
        "|---|" + "---|" * len(MODELS),
    ]
    for preset in PRESETS:
        row = []
        for recs in by_model.values():
            runs = [next((r for r in rec["runs"] if r["preset"] == preset), None) for rec in recs]
            if None in runs:
                raise ConfigError(f"figure: a run in {FOLDER} lacks the {preset!r} preset")
            row.append(f"{mean_range(r['train_loss_gap'] for r in runs)}; validation "
                       f"{mean_range(r['val_loss_gap'] for r in runs)}")
        lines.append(f"| {preset} | {' | '.join(row)} |")
    worst4 = max(r["train_loss_gap"] for recs in by_model.values() for rec in recs for r in rec["runs"]
                 if r["preset"] == "4bit")
    lines += ["", f"The 4bit preset's training-loss gap is at most {pct(worst4)} in every run {cite(FOLDER)}."]
    return "\n".join(lines)


RENDERERS = {"memory-presets-seeds": presets_seeds}
