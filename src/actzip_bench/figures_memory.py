"""README figures of the memory benchmarks (fused FFN stack, reference GPT, activation-cache presets), each
rendered from committed results and naming them. Every headline is a range over what was measured."""

from __future__ import annotations

from pathlib import Path

from actzip_bench.figure_helpers import cite, gpu, load, pct, rows_k, span, span_where, times

FFN = "results/h200/ffn.json"
GPT_CHUNKED = "results/h200/gpt-chunk1024.json"
GPT_CHECKPOINT = "results/h200/gpt.json"
CACHE_WIDE = "results/h200/cache-d4096x4.json"
CACHE_124M = "results/h200/cache-chunk1024.json"
CACHE_WIDE_2BIT = "results/h200/cache-d4096x4-2bit.json"
CACHE_124M_2BIT = "results/h200/cache-chunk1024-2bit.json"

FFN_STRATEGIES = {  # benchmark strategy -> what the README calls it
    "fused": "fused MLPs",
    "fused-arena": "fused, arena",
    "fused-arena-signpack": "fused, arena, sign packing",
    "relu-only": "hand-written, keeps relu(h) only",
    "checkpoint": "checkpointing",
}
RELU_ONLY = "relu-only"  # the strongest hand-written alternative: the fused rows are also given against it


def _ffn_rows(recs: list[dict], against_relu_only: bool) -> list[str]:
    """One table row per strategy: its best and worst peak (and peak against relu-only) and step time."""
    lines = []
    for strategy, name in FFN_STRATEGIES.items():
        peak, vs_relu, step = [], [], []
        for rec in recs:
            runs = {x["strategy"]: x for x in rec["runs"]}
            if strategy not in runs:
                continue
            where = f"{rows_k(rec['config']['rows'])}, {rec['config']['density']}"
            run = runs[strategy]
            peak.append((run["peak_vs_none"] - 1, where))
            step.append((run["time_vs_none"] - 1, where))
            if against_relu_only and RELU_ONLY in runs and strategy.startswith("fused"):
                vs_relu.append((run["peak_vs_none"] / runs[RELU_ONLY]["peak_vs_none"] - 1, where))
        if peak:
            cells = [name, span_where(peak)] + ([span_where(vs_relu) if vs_relu else "—"] if against_relu_only else [])
            lines.append(f"| {' | '.join(cells)} | {span_where(step)} |")
    return lines


def _grad_note(recs: list[dict]) -> str:
    runs = [x for r in recs for x in r["runs"] if x["strategy"] != "none"]
    off = sum(1 for x in runs if x.get("max_grad_abs_diff") != 0)
    return ("gradients bit-identical to plain PyTorch's in every run" if not off
            else f"gradients differ from plain PyTorch's in {off} of {len(runs)} runs")


def ffn_stack(root: Path) -> str:
    """The fused ReLU² FFN stack: peak and step time against plain PyTorch and peak against the hand-written
    function that keeps only relu(h), best to worst over every row count and density measured, with the gradient
    check of every run."""
    recs = load(root, FFN)
    recs = recs if isinstance(recs, list) else [recs]
    c0 = recs[0]["config"]
    rows = sorted({r["config"]["rows"] for r in recs})
    densities = sorted({f"{r['density']:.2f}" for r in recs})
    lines = [
        f"{c0['n_blocks']} residual ReLU² FFN blocks (hidden {c0['hidden_ratio']:g}·d, {c0['dtype']}) on an "
        f"{gpu(recs[0])}, {rows_k(rows[0])} to {rows_k(rows[-1])} rows, relu(h) densities "
        f"{' and '.join(densities)}; each figure against plain PyTorch in the same run (the fused ones also against "
        "the hand-written function), its best and its worst with where they were measured:",
        "",
        "| d | strategy | peak memory | peak against hand-written | step time |",
        "|---:|---|---|---|---|",
    ]
    for d in sorted({r["config"]["d"] for r in recs}, reverse=True):
        lines += [f"| {d} {row}" for row in _ffn_rows([r for r in recs if r["config"]["d"] == d], True)]
    lines += [
        "",
        f"Rows in thousands (k), density low or mid; the hand-written function is a dense autograd function keeping "
        f"only relu(h) for backward; {_grad_note(recs)} {cite(FFN)}.",
    ]
    return "\n".join(lines)


def gpt_peak(root: Path) -> str:
    """The 124M ReLU² GPT: per-token peak and step time per strategy against plain PyTorch over the sequence
    lengths measured, and checkpointing for comparison."""
    rec = load(root, GPT_CHUNKED)
    c = rec["config"]
    ckpt = load(root, GPT_CHECKPOINT)
    lines = [
        f"A {c['preset']} ReLU² GPT on an {gpu(rec)}, {c['dtype']}, {c['tokens_per_step']:,} tokens per step at "
        f"sequence lengths {', '.join(str(s) for s in c['seq_lens'])}, its loss computed {c['loss_chunk']} tokens "
        "at a time; against plain PyTorch in the same run, over those lengths:",
        "",
        "| strategy | peak memory per token | step time |",
        "|---|---|---|",
    ]
    for strategy in (s for s in c["strategies"] if s != "none"):
        runs = [r for r in rec["runs"] if r["strategy"] == strategy]
        lines.append(f"| {strategy} | {span(r['peak_vs_none'] - 1 for r in runs)} | "
                     f"{span(r['time_vs_none'] - 1 for r in runs)} |")
    runs = [r for r in ckpt["runs"] if r["strategy"] == "checkpoint"]
    cc = ckpt["config"]
    lines += ["", f"`rebuild`: layer-norm outputs (`-ln2`: only the MLP's input) made again in backward instead of kept "
              f"{cite(GPT_CHUNKED)}. Checkpointing every block, measured with the loss in chunks of "
              f"{cc['loss_chunk']} at sequence lengths {', '.join(str(s) for s in cc['seq_lens'])}: "
              f"{span(r['peak_vs_none'] - 1 for r in runs)} peak per token at "
              f"{span(r['time_vs_none'] - 1 for r in runs)} step time {cite(GPT_CHECKPOINT)}."]
    return "\n".join(lines)


def _preset_at(rec: dict, preset: str) -> tuple[list[float], list[float], list[float], str]:
    """Ratios, step-time changes and peak changes of ``preset`` over the record's models, and the models."""
    ratio, step, peak, names, sizes = [], [], [], [], []
    for m in rec["models"]:
        run = next(r for r in m["runs"] if r["strategy"] == preset)
        ratio.append(run["x_smaller"])
        step.append(run["time_vs_none"] - 1)
        peak.append(run["peak_vs_none"] - 1)
        names.append(m["model"])
        sizes.append(f"{m['params'] / 1e9:.2f}B" if m["params"] >= 1e9 else f"{m['params'] / 1e6:.0f}M")
    n_layer = {m.get("n_layer") for m in rec["models"]}
    layers = f"{n_layer.pop()} layers, " if len(n_layer) == 1 else ""
    return ratio, step, peak, f"{' and '.join(names)}, {layers}{' and '.join(sizes)} params"


def _preset_sentence(root: Path, preset: str, wide_rel: str, small_rel: str) -> str:
    wide, small = load(root, wide_rel), load(root, small_rel)
    rw, tw, pw, mw = _preset_at(wide, preset)
    rs, ts, ps, ms = _preset_at(small, preset)
    d = {m["n_embd"] for m in wide["models"]}
    return (f"`\"{preset}\"` saves {span(rw + rs, times)} fewer bytes; at d={max(d)} ({mw}) it costs {span(tw)} "
            f"step time and {span(pw)} peak memory, at the smaller size ({ms}) {span(ts)} step time and "
            f"{span(ps)} peak {cite(wide_rel, small_rel)}")


def cache_presets(root: Path) -> str:
    """The 4bit and 2bit presets: bytes, step time and peak against plain PyTorch at both model sizes measured."""
    rec = load(root, CACHE_WIDE)
    c = rec["config"]
    return (f"Against plain PyTorch ({c['dtype']}) on an {gpu(rec)}, {c['batch_size']} x {c['seq_len']} tokens per "
            f"step, loss in chunks of {c['loss_chunk']}: " + _preset_sentence(root, "4bit", CACHE_WIDE, CACHE_124M)
            + "; " + _preset_sentence(root, "2bit", CACHE_WIDE_2BIT, CACHE_124M_2BIT) + ". "
            + _checkpoint_sentence(rec, CACHE_WIDE)
            + ("" if _has_checkpoint(load(root, CACHE_124M)) else " It was not run beside the smaller models."))


def _has_checkpoint(rec: dict) -> bool:
    return all(any(r["strategy"] == "checkpoint" for r in m["runs"]) for m in rec["models"])


def _checkpoint_sentence(rec: dict, rel: str) -> str:
    """Activation checkpointing on the same models in the same run, the baseline a user would otherwise pick."""
    step, peak = [], []
    for m in rec["models"]:
        run = next((r for r in m["runs"] if r["strategy"] == "checkpoint"), None)
        if run is None:
            return "Checkpointing was not measured beside them."
        step.append(run["time_vs_none"] - 1)
        peak.append(run["peak_vs_none"] - 1)
    return (f"Checkpointing every block, in the same run at d={max(m['n_embd'] for m in rec['models'])}: "
            f"{span(peak)} peak memory at {span(step)} step time {cite(rel)}.")


RENDERERS = {"ffn-stack": ffn_stack, "gpt-peak": gpt_peak, "cache-presets": cache_presets}
