"""README figures of the wire benchmarks (pipeline stages over a slow link), rendered from committed results and
naming them. Gaps are training-loss gaps at equal tokens; dense, the baseline, sends float32 activations."""

from __future__ import annotations

from pathlib import Path

from actzip.wire.boundaries import parse_boundary_options
from actzip_bench.figure_helpers import cite, gpu, load, load_folder, pct, span, times
from actzip_bench.wire import first_reach

BEST_300 = "results/h200/wire-best-124m.json"
LONG_1200 = "results/h200/wire-long-124m.json"
LR_SWEEP = "results/h200/wire-lr"
SEEDS_300 = ("results/h200/wire-seed1-124m.json", "results/h200/wire-seed2-124m.json")
RECHECK = "results/h200/recheck/recheck-wire-seed1.json"
RECHECK_SOURCE = "results/h200/recheck/SOURCE.md"
CONTEXT_124M = ("results/h200/wire-long-context", "results/h200/wire-long-context-seed1")
CONTEXT_CPU = ("results/cpu/wire-small-anchor-context",
               *(f"results/cpu/wire-small-anchor-context-seed{s}" for s in range(1, 5)))


def _at(rec: dict, compressor: str, bandwidth=200.0) -> dict:
    """The record's run of ``compressor`` over the link of ``bandwidth`` Mbit/s."""
    return next(r for r in rec["runs"] if r["compressor"] == compressor and r["bandwidth_mbps"] == bandwidth)


def _best(records, want) -> dict:
    """The lowest-loss run among the records' runs for which ``want(run, boundary_options)`` holds (a sweep keeps
    each entry's best rate)."""
    runs = [(r, rec["config"].get("boundary") or "") for rec in records for r in rec["runs"]]
    return min((r for r, opts in runs if want(r, parse_boundary_options(opts))), key=lambda r: r["final_loss"])


def _dense(run, opts) -> bool:
    return run["compressor"] == "dense"


def _control(run, opts) -> bool:  # dense plus the same anchors: the fair reference for an anchored boundary
    return opts.get("anchor_whole") is True


def _anchored(ratio: int, codec: str):
    def want(run, opts):
        return (run["compressor"] == "stiefel" and run["ratio"] == ratio and run.get("fwd_codec", "none") == codec
                and opts.get("anchor_context") == 2 and opts.get("anchor_whole") is not True)
    return want


def _rate(run: dict) -> str:
    """A run's learning rate as its entry spells it (``dense@1.5e-4`` -> ``1.5e-4``)."""
    return run["entry"].split("@", 1)[1] if "@" in run["entry"] else f"{run['lr']:g}"


def _link(rec: dict) -> str:
    c = rec["config"]
    how = "all stages in one process, the link simulated" if rec["mode"] == "simulated" else rec["mode"]
    dense = _at(rec, "dense")
    width = dense["bytes_per_token_fwd"] / rec["gpt"]["n_embd"]  # bytes per value sent, headers included
    return (f"{rec['gpt']['n_layer']}-layer GPT (d={rec['gpt']['n_embd']}) in {c['stages']} stages on an "
            f"{gpu(rec)} ({how}: each run's measured compute replayed over a modelled link of {c['latency_ms']:g} ms "
            f"latency); the baseline, dense, sends {'float32' if round(width) == 4 else f'{width:.1f}-byte'} "
            f"activations ({dense['bytes_per_token_fwd']:,.0f} B/token forward)")


def wire_subspace(root: Path) -> str:
    """The subspace boundary on the 124M GPT: its byte ratio, its time to dense's loss at 200 Mbit/s over 300 and
    1200 steps, and its loss gap at equal tokens over every seed and length measured at the best rates."""
    best, long = load(root, BEST_300), load(root, LONG_1200)
    sub300, sub1200 = _at(best, "subspace"), _at(long, "subspace")
    sweep = [rec for _, rec in load_folder(root, LR_SWEEP)]
    gap0 = _best(sweep, lambda r, o: r["compressor"] == "subspace")["final_loss"] / _best(sweep, _dense)["final_loss"] - 1
    seeds = [load(root, rel) for rel in SEEDS_300]
    gaps300 = [gap0] + [_at(s, "subspace")["loss_gap"] for s in seeds]
    n_seeds = 1 + len(seeds)
    return (f"Measured on a {_link(best)}. At 200 Mbit/s the subspace boundary, {times(sub300['measured_ratio_fwd'], 1)} "
            f"fewer bytes forward, reaches dense's final loss {times(sub300['speedup_to_target'])} sooner over "
            f"{best['config']['steps']} steps (both at {_rate(sub300)}, one seed) and "
            f"{times(sub1200['speedup_to_target'])} sooner over {long['config']['steps']} (at {_rate(sub1200)}) "
            f"{cite(BEST_300, LONG_1200)}. At equal tokens it is behind dense, each at its best rate: "
            f"{span(gaps300)} over {best['config']['steps']} steps ({n_seeds} seeds: "
            f"{', '.join(pct(g) for g in gaps300)}) and {pct(sub1200['loss_gap'])} over {long['config']['steps']} "
            f"(one seed) {cite(LR_SWEEP, *SEEDS_300, LONG_1200)}.")


def wire_recheck(root: Path) -> str:
    """What a re-run with the current code changed in the committed wire figures (seed 1, 300 steps), and which of
    the cited runs predate it."""
    new, old = load(root, RECHECK), load(root, SEEDS_300[0])
    same = _at(new, "dense")["final_loss"] == _at(old, "dense")["final_loss"]
    entry = next(r for r in new["runs"] if r["compressor"] != "dense")
    before = next(r for r in old["runs"] if r["entry"] == entry["entry"] and r["bandwidth_mbps"] == 200.0)
    cited = [load(root, rel) for rel in (BEST_300, LONG_1200, *SEEDS_300)]
    cited += [rec for rel in CONTEXT_124M for _, rec in load_folder(root, rel)]
    when = new["machine"]["date"]
    runs = {(rec["machine"]["date"], rec.get("command")) for rec in cited}  # a folder may link a run it shares
    older = sum(1 for date, _ in runs if date < when)
    who = "All" if older == len(runs) else f"{older} of the"
    return (f"{who} {len(runs)} runs on the 124M GPT above ran code older than the library's current layout; a re-run "
            f"of seed 1 with it gives dense's loss {'to the bit' if same else 'differently'} and "
            f"{entry['entry'].split('@')[0]}'s gap {pct(entry['loss_gap'])} where the committed run has "
            f"{pct(before['loss_gap'])} {cite(RECHECK, RECHECK_SOURCE)}.")


def _reach_speedup(compressed: dict, dense_rec: dict) -> float | None:
    """How many times sooner than dense a run reaches dense's final loss at 200 Mbit/s, by the benchmark's rule
    applied to the recorded curve (a point every few steps); None if it never does."""
    curve = next(iter(compressed["curves"].values()))
    hit = first_reach(curve["loss"], max(1, round(0.1 * len(curve["loss"]))), dense_rec["target_loss"])
    if hit is None:
        return None
    return _at(dense_rec, "dense")["time_to_target_s"] / curve["time_s"]["200"][hit]


def _seed_rows(folders, root: Path):
    """Per seed folder: (records, the best dense run, the best control run, the folder's dense record)."""
    out = []
    for rel in folders:
        files = load_folder(root, rel)
        recs = [rec for _, rec in files]
        dense_rec = next(rec for rec in recs if any(r["compressor"] == "dense" for r in rec["runs"]))
        out.append((files, _best(recs, _dense), _best(recs, _control), dense_rec))
    return out


def wire_anchors(root: Path) -> str:
    """The Stiefel boundary with 8-bit codes and anchors over two tokens on the 124M GPT, per seed: gaps to dense
    and to dense given the same anchors, stiefel at 16x against that control, and the time to dense's loss."""
    seeds = _seed_rows(CONTEXT_124M, root)
    q8, f16, to_dense, to_ctrl, ctrl16, sooner = None, None, [], [], [], []
    for files, dense, control, dense_rec in seeds:
        recs = [rec for _, rec in files]
        q8 = _best(recs, _anchored(30, "quant:bits=8"))
        f16 = _best(recs, _anchored(16, "none"))
        to_dense.append(q8["final_loss"] / dense["final_loss"] - 1)
        to_ctrl.append(q8["final_loss"] / control["final_loss"] - 1)
        ctrl16.append(f16["final_loss"] / control["final_loss"] - 1)
        rec = next(r for _, r in files if q8 in r["runs"])
        sooner.append(_reach_speedup(rec, dense_rec))
    steps = seeds[0][3]["config"]["steps"]
    reach = ("does not reach dense's final loss in every seed" if None in sooner
             else f"reaches dense's final loss {span(sooner, lambda v: times(v, 1))} sooner at 200 Mbit/s (from "
                  "the recorded curves; compute timed while other runs may have shared the GPU)")
    return (f"With 8-bit codes the Stiefel boundary with these anchors is {times(q8['measured_ratio_fwd'], 1)} "
            f"smaller forward. Over {steps} steps at {_rate(q8)} ({len(seeds)} seeds) its training loss is "
            f"{span(to_dense)} against dense ({', '.join(pct(g) for g in to_dense)}) and {span(to_ctrl)} against "
            f"dense given the same anchors ({', '.join(pct(g) for g in to_ctrl)}); at "
            f"{times(f16['measured_ratio_fwd'], 1)} with float32 codes it is {span(ctrl16)} against that control "
            f"({', '.join(pct(g) for g in ctrl16)}). The {times(q8['measured_ratio_fwd'], 0)} boundary {reach} "
            f"{cite(*CONTEXT_124M)}.")


def wire_small_cpu(root: Path) -> str:
    """The same boundaries on the small GPT on the CPU, over every seed: gaps to dense given the same anchors."""
    seeds = _seed_rows(CONTEXT_CPU, root)
    q8_gaps, f16_gaps, q8, f16 = [], [], None, None
    for files, _dense_run, control, _ in seeds:
        recs = [rec for _, rec in files]
        q8 = _best(recs, _anchored(28, "quant:bits=8"))
        q8_gaps.append(q8["final_loss"] / control["final_loss"] - 1)
        f16 = _best(recs, _anchored(16, "none"))
        f16_gaps.append(f16["final_loss"] / control["final_loss"] - 1)
    rec = seeds[0][0][0][1]
    mean = sum(q8_gaps) / len(q8_gaps)
    return (f"On the small {rec['gpt']['n_layer']}-layer GPT (d={rec['gpt']['n_embd']}) on the CPU over "
            f"{rec['config']['steps']} steps and {len(seeds)} seeds, against dense given the same anchors: "
            f"{times(q8['measured_ratio_fwd'], 1)} with 8-bit codes {span(q8_gaps)} (mean {pct(mean)}), "
            f"{times(f16['measured_ratio_fwd'], 1)} with float32 codes {span(f16_gaps)} "
            f"{cite('results/cpu/wire-small-anchor-context*/')}.")


RENDERERS = {"wire-subspace": wire_subspace, "wire-recheck": wire_recheck, "wire-anchors": wire_anchors,
             "wire-small-cpu": wire_small_cpu}
