"""docs/memory.md figures of where the 2bit preset's saved bytes go, by role, and the ratio the preset could reach
if every role but nonlinear inputs went to 2 bits (see :mod:`actzip_bench.figures`), from a committed
``bench cache`` record at 124M (its ``by_rule`` account of each strategy); and the loss of that treatment on the
tiny GPT over three seeds (``bench presets`` runs of ``lossless``, ``2bit`` and the 2bit preset with attention and
norm tensors at 2 bits too)."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, load, load_folder, mean_range
from actzip_bench.figures_memory_docs import PROSE_NAMES as MODEL_NAMES

ROLES_GPU = "results/h100/cache-norms/all.json"  # the full norms stage: both models, 2bit with and without norms
STRATEGIES = ("2bit", "2bit+norms")
FLOOR_ROLE = "nonlinear_input"  # the role the presets keep at 4 bits or more
COLUMNS = ("linear_input", "nonlinear_input", "attention", "norm", "rebuilt", "other")
ACTNN_BF16 = 6.0  # ActNN's 12x over float32, taken to bf16


def _shares(run: dict, rel: str) -> dict[str, tuple[float, float]]:
    """Per role (the account's ``role:treatment`` names folded by role): share of the dense bytes and the
    fraction of them stored."""
    dense = run["bytes_dense"]
    out: dict[str, list[int]] = {}
    for name, s in run["by_rule"].items():
        if name == "leaf":
            continue
        role = name.split(":")[0]
        acc = out.setdefault(role, [0, 0])
        acc[0] += s["dense_bytes"]
        acc[1] += s["stored_bytes"]
    if not out or dense <= 0:
        raise ConfigError(f"figure: {rel}: strategy {run['strategy']!r} has no account by rule")
    return {role: (d / dense, (st / d) if d else 0.0) for role, (d, st) in out.items()}


def _two_bit_fraction(shares: dict[str, tuple[float, float]], rel: str) -> float:
    """The stored fraction of a role at 2 bits in this record: the linear inputs' (the 2bit preset's own)."""
    if "linear_input" not in shares:
        raise ConfigError(f"figure: {rel}: no linear inputs in the 2bit account")
    return shares["linear_input"][1]


def _bound(shares: dict[str, tuple[float, float]], two: float) -> float:
    """The dense bytes over what would be stored with every role at 2 bits but the floor role (as measured) and
    what the strategy rebuilds or keeps (as measured)."""
    stored = 0.0
    for role, (share, frac) in shares.items():
        moved = role not in (FLOOR_ROLE, "rebuilt") and 0 < frac < 1
        stored += share * (min(frac, two) if moved else frac)
    return 1 / stored


def two_bit_roles(root: Path) -> str:
    """Per model and 2-bit strategy: the measured ratio over bf16, each role's share of the dense bytes, and the
    ratio with every role but nonlinear inputs at 2 bits."""
    rec = load(root, ROLES_GPU)
    lines = ["| model | strategy | smaller than bf16 | " + " | ".join(f"{c} share" for c in COLUMNS)
             + " | all but nonlinear inputs at 2 bits |", "|---|---|---:|" + "---:|" * (len(COLUMNS) + 1)]
    bounds = []
    for m in rec["models"]:
        runs = {r["strategy"]: r for r in m["runs"]}
        for strategy in STRATEGIES:
            if strategy not in runs:
                raise ConfigError(f"figure: {ROLES_GPU} has no {strategy!r} run of {m['model']}")
            run = runs[strategy]
            shares = _shares(run, ROLES_GPU)
            bound = _bound(shares, _two_bit_fraction(shares, ROLES_GPU))
            name = f"{MODEL_NAMES.get(m['model'], m['model'])} {m['params'] / 1e6:.0f}M"
            bounds.append((name, strategy, bound))
            cells = " | ".join(f"{shares[c][0]:.0%}" if c in shares else "-" for c in COLUMNS)
            lines.append(f"| {name} | `{strategy}` | {run['x_smaller']:.2f}× | {cells} | {bound:.2f}× |")
    best = max(bounds, key=lambda b: b[2])
    c = rec["config"]
    return "\n".join([
        f"On an {rec['machine']['gpu']}, {c['batch_size']} x {c['seq_len']} tokens, {c['dtype']}: each role's "
        "share of the bytes "
        "autograd would keep, and what the strategy would store with every role but nonlinear inputs (the "
        "presets' floor of 4 bits) taken to the 2-bit groups' stored fraction of the same record, rebuilt norms "
        f"and kept tensors as measured {cite(ROLES_GPU)}:", "", *lines, "",
        f"The highest such ratio is {best[2]:.2f}× ({best[0]}, `{best[1]}`), "
        + ("at or above" if best[2] >= ACTNN_BF16 else "below")
        + f" ActNN's {ACTNN_BF16:.1f}× over bf16."])


BOUND_PROBE = "results/cpu/presets-2bit-bound"  # gelu-seedS.json: lossless, 2bit and 2bit with more roles at 2 bits


def _gap_rows(recs: list[dict], folder: str) -> list[str]:
    """A row per preset of ``recs`` (one record a seed, the same presets): bytes kept against the reference and
    the loss gaps, mean and range over the seeds."""
    names = [r["preset"] for r in recs[0]["runs"] if r["preset"] != recs[0]["reference"]]
    lines = ["| preset | bytes kept, of the reference's | training loss gap | validation loss gap |",
             "|---|---:|---:|---:|"]
    for name in names:
        runs = []
        for rec in recs:
            ref = next(r for r in rec["runs"] if r["preset"] == rec["reference"])
            run = next((r for r in rec["runs"] if r["preset"] == name), None)
            if run is None:
                raise ConfigError(f"figure: a run in {folder} lacks {name!r}")
            runs.append((run, run["saved_bytes_per_token"] / ref["saved_bytes_per_token"]))
        kept = sum(k for _, k in runs) / len(runs)
        lines.append(f"| `{name}` | {kept:.1%} | {mean_range(r['train_loss_gap'] for r, _ in runs)} | "
                     f"{mean_range(r['val_loss_gap'] for r, _ in runs)} |")
    return lines


def _about_runs(recs: list[dict], folder: str) -> str:
    c = recs[0]["config"]
    seeds = sorted(rec["config"]["seed"] for rec in recs)
    model = "Llama (HF, SwiGLU)" if c["activation"] == "swiglu" else f"{c['activation']} GPT"
    return (f"The {c['model']}-size {model}, {c['steps']} steps, {c['dtype']}, seeds {', '.join(map(str, seeds))}, "
            f"each preset from the reference's (`{recs[0]['reference']}`) weights and batches; gaps as mean (lowest "
            f"to highest) {cite(folder)}:")


def two_bit_probe(root: Path) -> str:
    """Per preset of the probe's runs: bytes kept against ``lossless`` and the loss gaps, mean and range over the
    seeds."""
    recs = [rec for _, rec in load_folder(root, BOUND_PROBE)]
    return "\n".join([_about_runs(recs, BOUND_PROBE), "", *_gap_rows(recs, BOUND_PROBE)])


DERIVATIVES_PROBE = "results/cpu/presets-derivatives"  # {gelu,swiglu}-seedS.json: lossless, 2bit, 2bit+derivatives


def derivatives_probe(root: Path) -> str:
    """``2bit`` with and without the activations keeping their derivative, per model family."""
    recs = [rec for _, rec in load_folder(root, DERIVATIVES_PROBE)]
    parts = []
    for activation in sorted({rec["config"]["activation"] for rec in recs}):
        mine = [rec for rec in recs if rec["config"]["activation"] == activation]
        parts += [_about_runs(mine, DERIVATIVES_PROBE), "", *_gap_rows(mine, DERIVATIVES_PROBE), ""]
    return "\n".join(parts).rstrip("\n")


DERIVATIVES_124M = "results/cpu/cache-derivatives-124m.json"  # bench cache at 124M on the CPU: bytes only
DERIVATIVE_STRATEGIES = ("2bit", "2bit+derivatives", "2bit+norms", "2bit+norms+derivatives")


def derivatives_124m(root: Path) -> str:
    """Per 124M model: the 2-bit strategies' ratio over bf16 with and without the activations keeping their
    derivative (a CPU record: bytes only), beside the GPU record's ratios of the same strategies it has."""
    rec, gpu = load(root, DERIVATIVES_124M), load(root, ROLES_GPU)
    on_gpu = {m["model"]: {r["strategy"]: r["x_smaller"] for r in m["runs"]} for m in gpu["models"]}
    lines = ["| model | " + " | ".join(f"`{s}`" for s in DERIVATIVE_STRATEGIES) + " |",
             "|---|" + "---:|" * len(DERIVATIVE_STRATEGIES)]
    best = (0.0, "", "")
    for m in rec["models"]:
        runs = {r["strategy"]: r for r in m["runs"]}
        missing = [s for s in DERIVATIVE_STRATEGIES if s not in runs]
        if missing:
            raise ConfigError(f"figure: {DERIVATIVES_124M} has no {missing[0]!r} run of {m['model']}")
        name = f"{MODEL_NAMES.get(m['model'], m['model'])} {m['params'] / 1e6:.0f}M"
        cells = []
        for s in DERIVATIVE_STRATEGIES:
            x = runs[s]["x_smaller"]
            best = max(best, (x, name, s))
            there = on_gpu.get(m["model"], {}).get(s)
            cells.append(f"{x:.2f}×" + (f" ({there:.2f}×)" if there is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    c = rec["config"]
    g = gpu["config"]
    return "\n".join([
        f"Smaller than bf16, the bytes autograd keeps at {c['batch_size']} x {c['seq_len']} tokens, {c['dtype']}, "
        f"measured on the CPU ({rec['machine'].get('host_cpu', 'CPU')}: bytes only, no time or peak); in brackets "
        f"the same strategy on the {gpu['machine']['gpu']} at {g['batch_size']} x {g['seq_len']} tokens where "
        f"that record has it {cite(DERIVATIVES_124M, ROLES_GPU)}:", "", *lines, "",
        f"The highest is {best[0]:.2f}× ({best[1]}, `{best[2]}`), "
        + ("at or above" if best[0] >= ACTNN_BF16 else "below") + f" ActNN's {ACTNN_BF16:.1f}× over bf16."])


RENDERERS = {"memory-2bit-roles": two_bit_roles, "memory-2bit-probe": two_bit_probe,
             "memory-2bit-derivatives": derivatives_probe, "memory-2bit-derivatives-124m": derivatives_124m}
