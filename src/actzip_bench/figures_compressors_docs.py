"""Figures of docs/wire-compressors.md (learned stage boundaries) rendered from committed results and naming them
(see :mod:`actzip_bench.figures`).

Two kinds of record are read: the boundary study of ``python -m actzip_bench.wire_compressors`` (a ``runs`` list with
``run``, ``fwd_ratio``, ``train_loss_gap``, ...) and ``actzip bench wire`` records (a ``runs`` list with ``entry``,
``final_loss``, ``measured_ratio_fwd``, ... and the ``--boundary`` options in ``config``). Gaps are training-loss
gaps at equal tokens, ``loss / reference loss - 1``.
"""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip.wire.boundaries import parse_boundary_options
from actzip_bench.figure_helpers import cite, gpu, load, load_folder, pct, span, times

STUDY = "results/cpu/wire-compressors.json"
STUDY_RVQ = "results/cpu/wire-compressors-rvq.json"
SMALL_1E3 = "results/cpu/wire-stiefel-small.json"
SMALL_1E3_ANCHORS = "results/cpu/wire-stiefel-small-anchors.json"
ANCHORS_124M = "results/h200/wire-anchors-124m.json"
NCCL_124M = "results/h200x2/wire-nccl.json"
CONTEXT_124M = ("results/h200/wire-long-context", "results/h200/wire-long-context-seed1")
CONTEXT_CPU = ("results/cpu/wire-small-anchor-context",
               *(f"results/cpu/wire-small-anchor-context-seed{s}" for s in range(1, 5)))
SMALL_2400 = "results/cpu/wire-small-2400"
ONE_TOKEN_124M = ("results/h200/wire-long-code-bits", "results/h200/wire-longer-code-bits",
                  "results/h200/wire-longest-code-bits")
LONG_MORE_124M = "results/h200/wire-long-124m-more.json"
CODE_BITS_CPU = ("results/cpu/wire-small-fresh-code-bits", "results/cpu/wire-small-fresh-code-bits-seed1",
                 "results/cpu/wire-small-fresh-code-bits-seed2")
ONE_TOKEN_CONTROL_CPU = "results/cpu/wire-small-anchor-context/dense-plus-anchors-6e-4.json"
TIE = ("results/h200/wire-long-stage-lr/wire-long-stage-lr-stiefel.json",
       "results/h200/wire-long-stage-lr/wire-long-stage-lr-stiefel-tie.json")
FULL_CPU = {"anchor_rank": 256, "lr": 1e-4}  # full-rank anchors of the small model, their own projection rate


# ---- the boundary study (python -m actzip_bench.wire_compressors) ----------------------------------------------

def _lr(v: float) -> str:
    """A learning rate as the commands spell it (0.0003 -> 3e-4)."""
    return f"{v:.0e}".replace("e-0", "e-")


def _fmt(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _study_table(root: Path, rel: str) -> str:
    rec = load(root, rel)
    m, c = rec["machine"], rec["config"]
    head = (f"{c['steps']} steps of {rec['tokens_per_step']} tokens, {c['n_stages']} stages, lr {_lr(c['lr'])}, seed "
            f"{c['seed']}, link modelled at {c['bandwidth_mbps']:g} Mbit/s; on {gpu(rec)}, {m.get('cores', '?')} cores, "
            f"torch {m['torch']}, {m['date']} {cite(rel)}:")
    rows = ["| run | width | fwd B/token | fwd × | bwd × | loss at equal tokens | gap | val gap | steps to dense loss "
            "| modelled speed-up (CPU compute + link) | link-only speed-up |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rec["runs"]:
        rows.append(f"| `{r['run']}` | {r['width']} | {r['fwd_bytes_per_token']:.2f} | {r['fwd_ratio']:.1f} | "
                    f"{r['bwd_ratio']:.1f} | {r['final_train_loss']:.4f} | {r['train_loss_gap']:+.2%} | "
                    f"{r['val_loss_gap']:+.2%} | {_fmt(r['steps_to_target'], 'd')} of {r['steps_run']} | "
                    f"{_fmt(r.get('speedup_vs_dense'), '.2f')} | {_fmt(r.get('link_speedup_vs_dense'), '.1f')} |")
    return head + "\n\n" + "\n".join(rows)


def compressors_study(root: Path) -> str:
    """The whole table of the default boundary study on the CPU, with its setup and machine."""
    return _study_table(root, STUDY)


def compressors_rvq(root: Path) -> str:
    """The whole table of the RVQ study whose codebook streams every update (bounded and unbounded)."""
    return _study_table(root, STUDY_RVQ)


def _study_runs(root: Path) -> list[dict]:
    return load(root, STUDY)["runs"] + [r for r in load(root, STUDY_RVQ)["runs"] if r["compressor"] != "dense"]


def compressors_first(root: Path) -> str:
    """Two bullets on the boundary study (both files): every run at 95x or more forward with its gaps, and the
    steps, link-only and compute-plus-link speed-ups of the runs that reach dense's loss."""
    study = load(root, STUDY)
    steps, runs = study["config"]["steps"], _study_runs(root)
    dense = next(r for r in runs if r["compressor"] == "dense")
    high = sorted((r for r in runs if r["fwd_ratio"] >= 95), key=lambda r: r["train_loss_gap"])
    listed = "; ".join(f"`{r['run']}` ({times(r['fwd_ratio'], 0)} forward, {times(r['bwd_ratio'], 0)} backward) "
                       f"{pct(r['train_loss_gap'])} (held-out {pct(r['val_loss_gap'])})" for r in high)
    reached = [r for r in runs if r["compressor"] != "dense" and r["steps_to_target"] is not None]
    missed = [f"`{r['run']}`" for r in runs if r["steps_to_target"] is None]
    link = sorted(reached, key=lambda r: -r["link_speedup_vs_dense"])
    compute = [r["step_compute_s"] for r in runs]
    met = any(r["fwd_ratio"] >= 100 and r["train_loss_gap"] <= 0.02 for r in runs)
    first = (f"- **100× or more within 2% of dense at equal tokens: {'reached' if met else 'not reached'} in {steps} "
             f"steps with these boundaries.** Every run at 95× or more forward, best first: {listed} {cite(STUDY, STUDY_RVQ)}.")
    by_link = max(r["link_speedup_vs_dense"] for r in reached) >= 3
    by_both = max(r["speedup_vs_dense"] for r in reached) >= 3
    verdict = ("reached" if by_both else "reached when the link dominates, not with this CPU's compute" if by_link
               else "not reached")
    second = (f"- **Time to the dense run's loss at 200 Mbit/s ≥ 3× shorter: {verdict}.** {len(reached)} of the {len(runs) - 1} compressed runs reached dense's step-{steps} "
              f"loss ({', '.join(missed)} did not), after "
              f"{span([r['steps_to_target'] / steps for r in reached], lambda v: times(v))} as many steps. With link "
              f"time only they take {span([r['link_speedup_vs_dense'] for r in reached], lambda v: times(v, 1))} less "
              f"time than dense (highest: `{link[0]['run']}`). Adding the measured CPU compute "
              f"({min(compute):.2f}–{max(compute):.2f} s per step, against {dense['step_link_s']:.3f} s of dense link "
              f"time) leaves {span([r['speedup_vs_dense'] for r in reached], lambda v: times(v))} {cite(STUDY, STUDY_RVQ)}.")
    return first + "\n" + second


# ---- actzip bench wire records ------------------------------------------------------------------------------------

def _runs(rec: dict) -> list[dict]:
    """One run per entry (the 200 Mbit/s one where the record has several links: the loss is the same)."""
    at = [r for r in rec["runs"] if r["bandwidth_mbps"] == 200.0]
    return at or rec["runs"]


def _entry(rec: dict, entry: str) -> dict:
    try:
        return next(r for r in _runs(rec) if r["entry"].split("@")[0] == entry)
    except StopIteration:
        raise ConfigError(f"figure: no run {entry!r} in a record of `{rec.get('command', '?')}`") from None


def _pick(records, want) -> dict:
    """The lowest-loss run among the records' runs for which ``want(run, boundary options)`` holds."""
    found = [r for rec in records for r in _runs(rec)
             if want(r, parse_boundary_options(rec["config"].get("boundary") or ""))]
    if not found:
        raise ConfigError("figure: no run of the records matches")
    return min(found, key=lambda r: r["final_loss"])


def _dense(run, opts) -> bool:
    return run["compressor"] == "dense"


def _stiefel(width: int, codec: str = "none", **opts):
    def want(run, got):
        return (run["compressor"] == "stiefel" and run["ratio"] == width and run.get("fwd_codec", "none") == codec
                and all(got.get(k) == v for k, v in opts.items()) and got.get("anchor_whole") is not True)
    return want


def _control(context=None):
    def want(run, opts):
        return opts.get("anchor_whole") is True and opts.get("anchor_context") == context
    return want


def _gap(run: dict, ref: dict) -> float:
    return run["final_loss"] / ref["final_loss"] - 1


def _val_gap(run: dict, ref: dict) -> float:
    return run["val_loss"] / ref["val_loss"] - 1


def _folder(root: Path, rel: str) -> list[dict]:
    return [rec for _, rec in load_folder(root, rel)]


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def compressors_16x(root: Path) -> str:
    """The 16x bullet: stiefel:16 with default and full-rank anchors in the study, on the small model at the bench's
    default rate, and on the 124M GPT (anchors against defaults), with the 124M run's steps and time to dense's loss."""
    study = {r["run"]: r for r in load(root, STUDY)["runs"]}
    small, small_a = load(root, SMALL_1E3), load(root, SMALL_1E3_ANCHORS)
    big, big_default = load(root, ANCHORS_124M), load(root, NCCL_124M)
    s16 = _entry(big, "stiefel:16")
    reach = (f"It reaches dense's loss after {s16['steps_to_target']} steps, {times(s16['speedup_to_target'], 1)} "
             f"sooner than dense at 200 Mbit/s" if s16["steps_to_target"] else "It does not reach dense's loss")
    return (f"- **`stiefel` at 16× within 1%: not reached with one-token anchors** (anchors over two tokens: see "
            f"above; {pct(study['stiefel@16']['train_loss_gap'])} with the default anchors, "
            f"{pct(study['stiefel@16,anchor_rank=256']['train_loss_gap'])} with full-rank anchors, `anchor_rank=256`, "
            f"{study['stiefel@16']['width']} values per token and boundary {cite(STUDY)}). The same holds at the "
            f"bench's default model learning rate ({_lr(small['config']['lr'])}, {small['config']['steps']} steps, "
            f"`actzip bench wire --model small`): {pct(_entry(small, 'stiefel:16')['loss_gap'])} with the defaults "
            f"{cite(SMALL_1E3)}, {pct(_entry(small_a, 'stiefel:16')['loss_gap'])} with `--boundary "
            f"{small_a['config']['boundary']}` {cite(SMALL_1E3_ANCHORS)}. At d = {big['gpt']['n_embd']} they help "
            f"less: the 124M GPT in {big['config']['stages']} stages on the {gpu(big)} "
            f"({big['config']['steps']} steps) gives stiefel:16 {pct(s16['loss_gap'])} with "
            f"`{big['config']['boundary']}`, against {pct(_entry(big_default, 'stiefel:16')['loss_gap'])} with the "
            f"defaults {cite(ANCHORS_124M, NCCL_124M)}. {reach}.")


def compressors_targets(root: Path) -> str:
    """What the two-token anchors' control (dense given the same anchors) gains on the 124M GPT per seed, and the
    small model's gaps to that control over every seed, with the longest run of each."""
    gains = []
    for rel in CONTEXT_124M:
        recs = _folder(root, rel)
        gains.append(_gap(_pick(recs, _control(2)), _pick(recs, _dense)))
    q8, f16, r28, r16 = [], [], None, None
    for rel in CONTEXT_CPU:
        recs = _folder(root, rel)
        control = _pick(recs, _control(2))
        r28, r16 = _pick(recs, _stiefel(28, "quant:bits=8", anchor_context=2)), _pick(recs, _stiefel(16, anchor_context=2))
        q8.append(_gap(r28, control))
        f16.append(_gap(r16, control))
    long = _folder(root, SMALL_2400)
    lcontrol = _pick(long, _control(2))
    l28 = _gap(_pick(long, _stiefel(28, "quant:bits=8", anchor_context=2)), lcontrol)
    l16 = _gap(_pick(long, _stiefel(16, anchor_context=2)), lcontrol)
    over = sum(g > 0.01 for g in f16)
    steps = long[0]["config"]["steps"]
    return (f"On the 124M GPT the control itself, dense given the same anchors, is {span(gains)} against plain dense "
            f"({len(gains)} seeds) {cite(*CONTEXT_124M)}, which is why it is the stricter reference. On the small model "
            f"on the CPU over {len(CONTEXT_CPU)} seeds, against that control: `stiefel:28` with 8-bit codes "
            f"({times(r28['measured_ratio_fwd'], 1)}) is {span(q8)} (mean {pct(_mean(q8))}), `stiefel:16` with "
            f"float32 codes ({times(r16['measured_ratio_fwd'], 1)}) {span(f16)} (mean {pct(_mean(f16))}; {over} of "
            f"{len(f16)} seeds above 1%) {cite('results/cpu/wire-small-anchor-context*/')}. After {steps} steps (one "
            f"seed) they are {pct(l28)} and {pct(l16)} {cite(SMALL_2400)}.")


def _best_dense_by_seed(root: Path) -> list[tuple[list[dict], dict]]:
    out = []
    for rel in CODE_BITS_CPU:
        recs = _folder(root, rel)
        out.append((recs, _pick(recs, _dense)))
    return out


def compressors_one_token(root: Path) -> str:
    """The best 100x run with one-token anchors on the 124M GPT at every length measured (train and held-out gaps to
    the best dense run of that length), stiefel:16 with full-rank anchors at 1200 steps, and the small model's
    one-token 106x run over its seeds against plain dense and against dense given one-token anchors."""
    parts = []
    for rel in ONE_TOKEN_124M:
        recs = _folder(root, rel)
        run, dense = _pick(recs, _stiefel(30, "quant:bits=8")), _pick(recs, _dense)
        parts.append((recs[0]["config"]["steps"], _gap(run, dense), _val_gap(run, dense), run))
    at = ", ".join(f"{pct(g)} at {s} steps" for s, g, _, _ in parts)
    held = ", ".join(pct(v) for _, _, v, _ in parts)
    more = _entry(load(root, LONG_MORE_124M), "stiefel:16")
    seeds = _best_dense_by_seed(root)
    small = [_gap(_pick(recs, _stiefel(28, "quant:bits=8", **FULL_CPU)), dense) for recs, dense in seeds]
    r28 = _pick(seeds[0][0], _stiefel(28, "quant:bits=8", **FULL_CPU))
    control = _gap(r28, _pick([load(root, ONE_TOKEN_CONTROL_CPU)], _control(None)))
    met = "met" if max(small) <= 0.02 else "did not meet"
    return (f"Without them the loss targets are not met at 124M: the best 100× figure there, `stiefel:30` with 8-bit "
            f"codes ({times(parts[0][3]['measured_ratio_fwd'], 1)}) and one-token anchors, each length at its best "
            f"rate against dense's best, is {at} (held-out {held}; one seed) {cite(*ONE_TOKEN_124M)}; stiefel:16 with "
            f"full-rank one-token anchors is {pct(more['loss_gap'])} at {load(root, LONG_MORE_124M)['config']['steps']} steps "
            f"{cite(LONG_MORE_124M)}. On the small model the one-token setting "
            f"({times(r28['measured_ratio_fwd'], 1)}) {met} the 100× target against plain dense at its better rate "
            f"({span(small)} over {len(small)} seeds, mean {pct(_mean(small))}) {cite(*CODE_BITS_CPU)} but is "
            f"{pct(control)} against dense given one-token anchors (seed 0) {cite(ONE_TOKEN_CONTROL_CPU)}.")


# rows of the small model's code-bits table: label, boundary width, codec, boundary options (exactly), fwd kind
CODE_BITS_ROWS = (
    ("stiefel:28 + 8-bit codes, full-rank anchors", "stiefel", 28, "quant:bits=8", FULL_CPU),
    ("stiefel:16, full-rank anchors (float32 codes)", "stiefel", 16, "none", FULL_CPU),
    ("stiefel:16 + 8-bit codes, full-rank anchors", "stiefel", 16, "quant:bits=8", FULL_CPU),
    ("stiefel:8 + 8-bit codes, full-rank anchors", "stiefel", 8, "quant:bits=8", FULL_CPU),
    ("stiefel:4 + 8-bit codes, full-rank anchors", "stiefel", 4, "quant:bits=8", FULL_CPU),
    ("stiefel:4 + 8-bit codes", "stiefel", 4, "quant:bits=8", {}),
    ("stiefel:16 (float32, default anchors)", "stiefel", 16, "none", {}),
    ("subspace:28 + 8-bit codes", "subspace", 28, "quant:bits=8", {}),
    ("subspace:100 (float32)", "subspace", 100, "none", {}),
)


def _row_run(recs, kind, width, codec, opts, lr=3e-4):
    found = [r for rec in recs for r in _runs(rec)
             if r["compressor"] == kind and r["ratio"] == width and r.get("fwd_codec", "none") == codec
             and r["lr"] == lr and parse_boundary_options(rec["config"].get("boundary") or "") == opts]
    return min(found, key=lambda r: r["final_loss"]) if found else None


def compressors_code_bits(root: Path) -> str:
    """The whole table of the small model's code-bits study over 1200 fresh-window steps: each entry's training-loss
    gap per seed against that seed's best dense run (3e-4 or 6e-4), with the mean and held-out mean where every seed
    ran it."""
    seeds = _best_dense_by_seed(root)
    rates = sorted({_rate(d) for _, d in seeds})
    rows = ["| entry (at 3e-4) | fwd ratio | " + " | ".join(f"seed {i}" for i in range(len(seeds)))
            + " | mean | held-out, mean |", "|---|---:|" + "---:|" * (len(seeds) + 2),
            "| best dense (" + ", ".join(rates) + ") | 1 | " + " | ".join(f"{d['final_loss']:.4f}" for _, d in seeds)
            + " | | |"]
    for label, kind, width, codec, opts in CODE_BITS_ROWS:
        runs = [(_row_run(recs, kind, width, codec, opts), dense) for recs, dense in seeds]
        have = [(r, d) for r, d in runs if r is not None]
        if not have:
            raise ConfigError(f"figure: no run for {label!r} in {', '.join(CODE_BITS_CPU)}")
        cells = [pct(_gap(r, d)) if r is not None else "" for r, d in runs]
        full = len(have) == len(runs)
        mean = f"**{pct(_mean(_gap(r, d) for r, d in have))}**" if full else ""
        val = pct(_mean(_val_gap(r, d) for r, d in have)) if full else ""
        rows.append(f"| {label} | {have[0][0]['measured_ratio_fwd']:.1f} | {' | '.join(cells)} | {mean} | {val} |")
    steps = seeds[0][0][0]["config"]["steps"]
    return (f"Training loss over {steps} fresh-window steps against the same seed's best dense run "
            f"{cite(*CODE_BITS_CPU)}:\n\n" + "\n".join(rows))


def _rate(run: dict) -> str:
    return run["entry"].split("@", 1)[1] if "@" in run["entry"] else f"{run['lr']:g}"


def compressors_tie_cost(root: Path) -> str:
    """Inline: what a tied projection adds to the 16x code's forward bytes on the 124M GPT, and the ratio it leaves."""
    untied, tied = (_entry(load(root, rel), "stiefel:16") for rel in TIE)
    rec = load(root, TIE[1])
    tokens = rec["config"]["batch_size"] * rec["gpt"]["block_size"]
    more = tied["bytes_per_token_fwd"] / untied["bytes_per_token_fwd"] - 1
    return (f"{pct(more)} on the 16× code's forward bytes at {tokens:,} tokens per step on the 124M GPT: ratio "
            f"{untied['measured_ratio_fwd']:.1f} → {tied['measured_ratio_fwd']:.1f} {cite(*TIE)}")


RENDERERS = {"compressors-study": compressors_study, "compressors-rvq": compressors_rvq,
             "compressors-first": compressors_first, "compressors-16x": compressors_16x,
             "compressors-targets": compressors_targets, "compressors-one-token": compressors_one_token,
             "compressors-code-bits": compressors_code_bits, "compressors-tie-cost": compressors_tie_cost}
