"""docs/memory.md figures of the lossy presets' price in loss over several seeds of one code version (see
:mod:`actzip_bench.figures`): ``results/cpu/presets-seeds/MODEL-seedS.json`` (the tiny models on a CPU) and
``results/h100/presets-124m/MODEL-seedS.json`` (the 124M GPT under bf16 autocast), each a ``bench presets`` run of
``lossless``, ``4bit`` and ``2bit`` from seed S's weights and batches."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load_folder, mean_range, pct

FOLDER = "results/cpu/presets-seeds"
FOLDER_124M = "results/h100/presets-124m"
MODELS = {"gelu": "GELU GPT", "relu2": "ReLU² GPT", "swiglu": "SwiGLU Llama"}
PRESETS = ("4bit", "2bit")


def presets_seeds(root: Path, folder: str = FOLDER, models: dict[str, str] = MODELS) -> str:
    """Per model and preset: the final training-loss gap and the validation gap to ``lossless``, mean and range
    over the seeds, with the seed count and the code version the runs share."""
    by_model: dict[str, list[dict]] = {m: [] for m in models}
    for rel, rec in load_folder(root, folder):
        act = rec["config"]["activation"]
        if act not in by_model:
            raise ConfigError(f"figure: {rel} is a {act!r} model; {folder} holds {', '.join(models)}")
        by_model[act].append(rec)
    missing = [m for m, recs in by_model.items() if not recs]
    if missing:
        raise ConfigError(f"figure: {folder} has no run of {', '.join(missing)}")
    counts = {m: len({r["config"]["seed"] for r in recs}) for m, recs in by_model.items()}
    versions = {r["machine"].get("code_version") for recs in by_model.values() for r in recs}
    version = (f"code version {next(iter(versions))[:10]}" if len(versions) == 1 and None not in versions
               else f"{len(versions)} code versions")
    first = next(iter(by_model.values()))[0]
    c, ref = first["config"], first.get("reference", "lossless")  # the run every gap is against
    seeds = min(counts.values())
    shape = ""
    if c.get("dtype", "float32") != "float32":  # the runs a user's training resembles: say their shape
        shape = (f"{c['model']} size, {first['tokens_per_step']:,} tokens a step, forwards under {c['dtype']} "
                 f"autocast, so `{ref}` is the {c['dtype']} step"
                 + (", every step after the third a CUDA graph's replay; " if c.get("graphs") else "; "))
    lines = [
        f"Over {seeds} seeds (weights and batches; {shape}{c['steps']} steps each, every run of {version}), the "
        f"gap to `{ref}` in the final training loss, and in validation loss after it, as mean (lowest to "
        "highest):",
        "",
        f"| preset | {' | '.join(models.values())} |",
        "|---|" + "---|" * len(models),
    ]
    for preset in PRESETS:
        row = []
        for recs in by_model.values():
            runs = [next((r for r in rec["runs"] if r["preset"] == preset), None) for rec in recs]
            if None in runs:
                raise ConfigError(f"figure: a run in {folder} lacks the {preset!r} preset")
            row.append(f"{mean_range(r['train_loss_gap'] for r in runs)}; validation "
                       f"{mean_range(r['val_loss_gap'] for r in runs)}")
        lines.append(f"| {preset} | {' | '.join(row)} |")
    worst4 = max(r["train_loss_gap"] for recs in by_model.values() for rec in recs for r in rec["runs"]
                 if r["preset"] == "4bit")
    lines += ["", f"The 4bit preset's training-loss gap is at most {pct(worst4)} in every run {cite(folder)}."]
    return "\n".join(lines)


def presets_124m(root: Path) -> str:
    """The same for the 124M GELU GPT on the GPU, bf16 forwards (the cache's 2000-step loss target)."""
    return presets_seeds(root, FOLDER_124M, {"gelu": "GELU GPT, 124M"})


RENDERERS = {"memory-presets-seeds": presets_seeds, "memory-presets-124m": presets_124m}
