"""docs/memory.md figure of ``compress_(model, SparseMLPConfig())`` alone on whole models (see
:mod:`actzip_bench.figures`): the reference GPT (two runs of the same command, ``GPT_RUNS``) and the
Nemotron-H-style hybrid (``HYBRID_RUNS``), each an ``actzip bench gpt`` record."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load, pct, span

GPT_RUNS = ("results/h200/gpt-compress-lc1024.json", "results/h200/gpt-compress-lc1024-b.json")
HYBRID_RUNS = ("results/h200/gpt-nemotron-h-1024.json", "results/h200/gpt-nemotron-h-4096.json")
# the hybrid with mamba_ssm's and causal_conv1d's kernels: today's code, and the same command on earlier code
KERNEL_RUN = "results/h200/gpt-nemotron-h-compress.json"
KERNEL_RUNS_BEFORE = {
    "results/h200/gpt-nemotron-h-kernels-norms-kept.json": "with the norms keeping float32 copies of their inputs",
    "results/h200/gpt-nemotron-h-kernels.json": "keeping their bf16 inputs instead, their outputs rebuilt through "
                                                "transformers' own forward",
    "results/h200/gpt-nemotron-h-exact-norms.json": "with ExactRMSNorm in their place, the Mamba in-projection "
                                                    "outputs still kept",
}
# recorded before the gradient check ran its reference twice: its "none" row compares the reference with itself
NO_FLOOR = {"results/h200/gpt-compress-lc1024.json"}
LABELS = {"fused-arena": "fused arena MLPs only (hand-wired)", "compress": "`compress_(model, SparseMLPConfig())`",
          "compress-signpack": "the same, sign packed", "checkpoint": "activation checkpointing"}


def _rows(rec: dict, rel: str) -> dict[tuple[str, int], dict]:
    rows = {(r["strategy"], r["seq_len"]): r for r in rec["runs"]}
    for (s, seq), r in rows.items():
        floor = rows[("none", seq)].get("max_grad_abs_diff")
        if r.get("max_grad_abs_diff") is None or floor is None:
            raise ConfigError(f"figure: {rel} has no gradient check")
        # where plain PyTorch repeats itself bit for bit, any difference is the strategy's own
        if s != "none" and rel not in NO_FLOOR and floor == 0 and r["max_grad_abs_diff"] != 0:
            raise ConfigError(f"figure: {rel}: {s} at {seq} changes the gradients (max |Δ| {r['max_grad_abs_diff']}) "
                              "where plain PyTorch repeats itself exactly")
    return rows


def _spread(rec: dict) -> float:
    """The largest gap between a strategy's median step and its fastest, relative to the fastest."""
    return max(r["median_ms"] / r["min_ms"] - 1 for r in rec["runs"])


def one_liner(root: Path) -> str:
    """Per-token peak and step time against plain PyTorch for the one-liner on both models."""
    gpt = [(rel, load(root, rel)) for rel in GPT_RUNS]
    rows = [_rows(rec, rel) for rel, rec in gpt]
    c = gpt[0][1]["config"]
    seqs = sorted(set.intersection(*({seq for (_, seq) in r} for r in rows)))
    only_first = sorted({seq for (_, seq) in rows[0]} - set(seqs))
    strategies = [s for s in LABELS if all((s, seq) in r for r in rows for seq in seqs)]
    head = " / ".join(str(s) for s in seqs)
    out = [f"On an {gpu(gpt[0][1])} ({c['preset']} ReLU² GPT, {c['dtype']}, {c['tokens_per_step']:,} tokens a step, loss "
           f"over chunks of {c['loss_chunk']} tokens, AdamW; strategies interleaved step by step, medians), against "
           f"plain PyTorch in the same run, sequence length {head}, two runs of the same command:", "",
           "| strategy | per-token peak, run 1 | run 2 | step time, run 1 | run 2 |", "|---|---:|---:|---:|---:|"]
    for s in strategies:
        peaks = [" / ".join(pct(r[(s, q)]["peak_vs_none"] - 1) for q in seqs) for r in rows]
        steps = [" / ".join(pct(r[(s, q)]["time_vs_none"] - 1) for q in seqs) for r in rows]
        out.append(f"| {LABELS[s]} | {peaks[0]} | {peaks[1]} | {steps[0]} | {steps[1]} |")
    floors = [r[("none", q)]["max_grad_abs_diff"] for rel, r in zip(GPT_RUNS, rows) if rel not in NO_FLOOR
              for q in seqs]
    diffs = [r[(s, q)]["max_grad_abs_diff"] for r in rows for s in strategies for q in seqs]
    extra = "; ".join(f"{LABELS[s]} {pct(rows[0][(s, q)]['peak_vs_none'] - 1)} at "
                      f"{pct(rows[0][(s, q)]['time_vs_none'] - 1)}" for q in only_first for s in strategies)
    if only_first:
        out += ["", f"Run 1 also measured sequence length {', '.join(map(str, only_first))}: {extra}."]
    out += ["", f"Run 1 was noisy: a strategy's median step sat up to {pct(_spread(gpt[0][1]))} above its fastest "
            f"step (run 2: up to {pct(_spread(gpt[1][1]))}). Gradients after one step from the same weights differ "
            f"from plain PyTorch's by {span(diffs, lambda v: f'{v:.3g}')} (max |Δ|), as much as plain PyTorch's "
            f"differ from themselves between two of its own runs ({span(floors, lambda v: f'{v:.3g}')}, measured "
            "in run 2): attention's backward is not deterministic on the GPU; the exactness tests check "
            "bit-identity with deterministic kernels. Sources: " + cite(*GPT_RUNS) + ".", ""]
    out += _hybrid(root) + [""] + _hybrid_kernels(root)
    return "\n".join(out)


def _hybrid(root: Path) -> list[str]:
    recs = [(rel, load(root, rel)) for rel in HYBRID_RUNS]
    m, c = recs[0][1]["model"], recs[0][1]["config"]
    cells, grads = [], []
    for rel, rec in recs:
        rows = _rows(rec, rel)
        seq = rec["config"]["seq_lens"][0]
        for s in ("compress", "compress-signpack", "checkpoint"):
            r = rows[(s, seq)]
            cells.append((seq, s, r["peak_vs_none"] - 1, r["time_vs_none"] - 1))
        kept = {b["strategy"]: b["saved_bytes_per_token"] for b in rec["saved_by_kind"]}
        grads.append((rows[("none", seq)]["max_grad_abs_diff"],
                      max(r["max_grad_abs_diff"] for (s, _), r in rows.items() if s != "none")))
    none, comp = kept["none"], kept["compress"]
    total = sum(none.values())
    seqs = sorted({seq for seq, *_ in cells})
    by = "; ".join(f"sequence {q}: " + ", ".join(f"{LABELS[s]} {pct(p)} at {pct(t)}" for seq, s, p, t in cells if seq == q)
                   for q in seqs)
    return [f"On a Nemotron-H-style hybrid (transformers NemotronH from a local config, {m['params'] / 1e6:.0f}M "
            f"parameters, layers `{m['pattern']}`: M Mamba-2, * attention, - ReLU² MLP; d={m['hidden_size']}, MLP "
            f"{m['intermediate_size']}; {c['tokens_per_step']:,} tokens a step) the per-token peak against plain "
            f"PyTorch was: {by}. The Mamba mixers ran {m['mamba_path']}: they keep "
            f"{none['mamba'] / 1024:,.0f} KiB a token for backward, {none['mamba'] / total:.0%} of what the model "
            f"keeps, against {none['mlp'] / 1024:,.0f} KiB for the MLPs, which `compress_` takes to "
            f"{comp['mlp'] / 1024:,.0f} KiB ({comp['mlp'] / none['mlp'] - 1:+.0%}); within the step the reference "
            f"scan's temporaries raise the peak further, so the MLPs' saving is a small part of it here. Gradients "
            f"differ from plain PyTorch's by at most {max(g for _, g in grads):.3g} (max |Δ|; plain PyTorch's own two "
            f"runs: up to {max(f for f, _ in grads):.3g}). Sources: {cite(*HYBRID_RUNS)}."]


def _hybrid_kernels(root: Path) -> list[str]:
    rec = load(root, KERNEL_RUN)
    rows = _rows(rec, KERNEL_RUN)
    m, c = rec["model"], rec["config"]
    seqs = sorted({q for (_, q) in rows})
    head = " / ".join(map(str, seqs))
    out = [f"With the Mamba mixers on {m['mamba_path']} (the path a Nemotron-H user trains on), the same hybrid at "
           f"{c['tokens_per_step']:,} tokens a step, sequence length {head}, against plain PyTorch in the same run "
           f"({gpu(rec)}, one interleaved run, medians):", "",
           "| strategy | per-token peak | step time |", "|---|---:|---:|"]
    for s in ("compress", "compress-signpack", "checkpoint"):
        if all((s, q) in rows for q in seqs):
            peaks = " / ".join(pct(rows[(s, q)]["peak_vs_none"] - 1) for q in seqs)
            steps = " / ".join(pct(rows[(s, q)]["time_vs_none"] - 1) for q in seqs)
            out.append(f"| {LABELS[s]} | {peaks} | {steps} |")
    none = {q: rows[("none", q)]["peak_bytes_per_token"] / 1024 for q in seqs}
    kept = {b["strategy"]: b["saved_bytes_per_token"] for b in rec["saved_by_kind"] if b["seq_len"] == seqs[-1]}
    floors = [rows[("none", q)]["max_grad_abs_diff"] for q in seqs]
    diffs = [r["max_grad_abs_diff"] for (s, _), r in rows.items() if s != "none"]
    earlier = []
    for rel, what in KERNEL_RUNS_BEFORE.items():
        old = _rows(load(root, rel), rel)
        cells = [(old[("compress", q)]["peak_vs_none"] - 1, old[("compress", q)]["time_vs_none"] - 1)
                 for q in seqs if ("compress", q) in old]
        earlier.append(f"{what}, {' / '.join(pct(p) for p, _ in cells)} at {' / '.join(pct(t) for _, t in cells)} "
                       f"{cite(rel)}")
    out += ["", f"Plain PyTorch peaks at {span(none.values(), lambda v: f'{v:,.0f}')} KiB a token and keeps "
            f"{kept['none']['mamba'] / 1024:,.0f} KiB a token in the Mamba layers "
            f"({kept['none']['mamba'] / sum(kept['none'].values()):.0%} of what the model keeps), most of it the "
            f"fused scan's saved in-projection output; with the one line they keep {kept['compress']['mamba'] / 1024:,.0f} "
            f"KiB (the in-projection output rebuilt in backward, one matmul per mixer), and the model as a whole "
            f"{sum(kept['compress'].values()) / 1024:,.0f} KiB against {sum(kept['none'].values()) / 1024:,.0f} "
            "(the MLPs' sparse payloads in the arena apart). The same command on earlier code: "
            + "; ".join(earlier) + f". The kernels' backward is not deterministic: plain PyTorch's gradients "
            f"differ between two of its own runs by up to {max(floors):.3g}, the strategies' from plain PyTorch's "
            f"by up to {max(diffs):.3g} (max |Δ|). Source: {cite(KERNEL_RUN)}."]
    return out


RENDERERS = {"memory-one-liner": one_liner}
