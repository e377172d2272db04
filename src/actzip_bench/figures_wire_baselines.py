"""README figure of the wire against the baselines a user would pick (see :mod:`actzip_bench.figures`): dense
sent as float32 and as bf16, 8- and 4-bit quantized dense, AQ-SGD's delta, beside subspace and the anchored
Stiefel boundary with its control (dense plus the same anchors), over every seed measured.

Each seed's entry is its own run (``seedS-NAME.json``), trained on past the equal-token point until it reached
the dense loss of its seed; step times come from each entry run alone on the GPU (``time-*.json``), since the
seeds' runs shared it. The time to dense's loss is the steps a run needed times its step time alone.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load_folder, mean_range, span, times
from actzip_bench.wire import first_reach

FOLDER = "results/h200/wire-baselines"
# file name after "seedS-" -> what the table calls it; the first is the reference, the next ones the baselines
ENTRIES = {
    "dense": "float32 dense",
    "bf16": "bf16 dense",
    "quant-4": "8-bit quantized dense",
    "quant-8": "4-bit quantized dense",
    "delta-8": "AQ-SGD delta (4-bit)",
    "subspace-100": "subspace",
    "anchored30": "Stiefel with anchors (8-bit codes)",
    "control": "float32 dense plus the same anchors (control)",
}
BASELINES = ("bf16", "quant-4", "quant-8", "delta-8")  # what a user would send instead of float32 dense
ANCHORED, CONTROL = "anchored30", "control"


def _key(rec: dict, run: dict) -> tuple:
    c = rec["config"]
    return run["entry"], c.get("boundary") or "", c.get("stage_codec") or ""


def _run(rec: dict) -> dict:
    return next(r for r in rec["runs"] if r["bandwidth_mbps"] is not None)


def _seeds(root: Path) -> dict[str, dict[int, dict]]:
    """{entry name: {seed: record}} from the folder's ``seedS-NAME.json`` files; a ConfigError for a missing one."""
    got: dict[str, dict[int, dict]] = {name: {} for name in ENTRIES}
    for rel, rec in load_folder(root, FOLDER):
        stem = Path(rel).stem
        if not stem.startswith("seed"):
            continue
        seed, _, name = stem[4:].partition("-")
        if name in got:
            got[name][int(seed)] = rec
    seeds = set(got["dense"])
    for name, by_seed in got.items():
        if not seeds or set(by_seed) != seeds:
            raise ConfigError(f"figure: {FOLDER} lacks {name} for seeds {sorted(seeds - set(by_seed)) or 'any'}")
    return got


def _alone_step_s(root: Path) -> dict[tuple, float]:
    """Median step time at the link's bandwidth of each entry measured alone, by (entry, boundary, stage codec)."""
    out = {}
    for rel, rec in load_folder(root, FOLDER):
        if Path(rel).stem.startswith("time-"):
            for run in rec["runs"]:
                if run["bandwidth_mbps"] is not None:
                    out[_key(rec, run)] = run["step_time_s"]
    return out


def _loss(v: float) -> str:
    return f"{v:.3f}"


def _steps_to(rec: dict, target: float) -> int | None:
    """Steps the record's run needed for its smoothed training loss to reach ``target`` (None: never)."""
    curve = next(iter(rec["curves"].values()))
    if curve["every"] != 1:
        raise ConfigError("figure: wire-baselines needs every step's loss in the curves")
    hit = first_reach(curve["loss"], max(1, round(rec["config"]["smooth"] * rec["config"]["steps"])), target)
    return None if hit is None else hit + 1


def wire_baselines(root: Path) -> str:
    """The table: bytes, loss at equal tokens (mean and range over seeds), gaps to dense and to the control, and
    the time to dense's loss against float32 dense; then the anchored boundary against the best baseline."""
    runs = _seeds(root)
    alone = _alone_step_s(root)
    seeds = sorted(runs["dense"])
    dense = {s: _run(runs["dense"][s]) for s in seeds}
    ttt: dict[str, list[float | None]] = {}
    for name, by_seed in runs.items():
        ttt[name] = []
        for s in seeds:
            rec = by_seed[s]
            step_s = alone.get(_key(rec, _run(rec)))
            if step_s is None:
                raise ConfigError(f"figure: {FOLDER} has no time-*.json run of {_run(rec)['entry']} alone")
            n = _steps_to(rec, dense[s]["final_loss"])
            ttt[name].append(None if n is None else n * step_s)
    rec0 = runs["dense"][seeds[0]]
    c, g = rec0["config"], rec0["gpt"]
    versions = {rec["machine"].get("code_version") for by_seed in runs.values() for rec in by_seed.values()}
    version = (f"code version {next(iter(versions))[:10]}" if len(versions) == 1 and None not in versions
               else f"{len(versions)} code versions")
    lines = [
        f"A {g['n_layer']}-layer GPT (d={g['n_embd']}) in {c['stages']} stages on an {gpu(rec0)}: {c['steps']} "
        f"steps of {c['batch_size']}×{g['block_size']} tokens from a fixed set of {c['dataset_windows']:,} windows "
        f"(samples repeat, as when fine-tuning: AQ-SGD's delta needs them to), {len(seeds)} seeds, every run of "
        f"{version}, each entry at one learning rate (the best of earlier sweeps). The link is simulated: each "
        f"step's compute, measured with the entry alone on the GPU, replayed over {_run(rec0)['bandwidth_mbps']:g} "
        f"Mbit/s with {_run(rec0)['latency_ms']:g} ms latency. Loss: training loss at equal tokens, mean (lowest "
        "to highest) over the seeds; time: to dense's loss, each seed against its own dense run:",
        "",
        "| sends | bytes per token forward | training loss | against dense | against the control | "
        "time to dense's loss, sooner than float32 dense |",
        "|---|---:|---|---|---|---|",
    ]
    for name, label in ENTRIES.items():
        finals = [_run(runs[name][s])["final_loss"] for s in seeds]
        gap = span(f / dense[s]["final_loss"] - 1 for f, s in zip(finals, seeds))
        ctrl = (span(f / _run(runs[CONTROL][s])["final_loss"] - 1 for f, s in zip(finals, seeds))
                if name in (ANCHORED, CONTROL) else "—")
        got = ttt[name]
        sooner = ("not reached in every seed" if None in got
                  else span((d / t for d, t in zip(ttt["dense"], got)), lambda v: times(v, 1)))
        bpt = _run(runs[name][seeds[0]])["bytes_per_token_fwd"]
        lines.append(f"| {label} | {bpt:,.0f} | {mean_range(finals, _loss)} | {'—' if name == 'dense' else gap} | {ctrl} "
                     f"| {sooner} |")
    reached = [b for b in BASELINES if None not in ttt[b]]
    best = min(reached, key=lambda b: statistics.fmean(ttt[b])) if reached else None
    vs_best = ("does not reach dense's loss in every seed" if None in ttt[ANCHORED]
               else "reaches dense's loss in every seed, and none of them does" if best is None
               else f"reaches dense's loss {span((b / a for a, b in zip(ttt[ANCHORED], ttt[best])), lambda v: times(v, 1))} "
                    f"sooner than the best of them ({ENTRIES[best]})")
    vs_control = ("" if None in ttt[ANCHORED] or None in ttt[CONTROL] else
                  f", and {span((c / a for a, c in zip(ttt[ANCHORED], ttt[CONTROL])), lambda v: times(v, 1))} sooner "
                  "than the control")
    lines += [
        "",
        f"Of the baselines a user would pick ({', '.join(ENTRIES[b] for b in BASELINES)}), the Stiefel boundary "
        f"with anchors {vs_best}{vs_control}. The anchors (a learned table indexed by each position's token id and "
        "the one before it, the ids sent beside the codes, added back on the far side) change the model, and make it better at equal tokens: the fair "
        "reference for the anchored boundary's loss is the control, which sends float32 dense activations plus those "
        f"anchors, and which the anchored boundary trails at equal tokens {cite(FOLDER)}.",
    ]
    return "\n".join(lines)


RENDERERS = {"wire-baselines": wire_baselines}
