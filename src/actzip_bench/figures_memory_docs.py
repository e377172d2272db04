"""Figures of docs/memory.md rendered from committed results and naming them (see :mod:`actzip_bench.figures`).

Each renderer reads the results files it names, gives a range wherever several runs, sizes or sequence lengths
were measured, and cites every file it read. Targets (a fraction of the copy bandwidth, a step-time budget) are
thresholds, not measurements: the benchmark records its own where it has them; the two kept here are marked.
"""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load, pct, span, times

CACHE_BEFORE = "results/h200/cache.json"  # the default rules before they remembered their decisions
CACHE_RECHECK = "results/h200/cache-recheck.json"
GPT_CHUNKED = "results/h200/gpt-chunk1024.json"
GPT_RERUN = "results/h200/recheck/recheck-gpt-chunk1024.json"
GPT_DEFAULT_CHUNK = "results/h200/gpt-chunk4096.json"
KERNELS = "results/h200/kernels.json"
QUANT = "results/h200/quant.json"
CACHE_WIDE = "results/h200/cache-d4096x4.json"
CACHE_WIDE_2BIT = "results/h200/cache-d4096x4-2bit.json"
CACHE_WIDE_BEFORE = "results/h200/cache-d4096x4-before-shapes.json"
CACHE_124M = "results/h200/cache-chunk1024.json"
CACHE_124M_2BIT = "results/h200/cache-chunk1024-2bit.json"
# Later runs of the 124M command (recheck: both models; ab-...-new: the GELU GPT, 4bit only), same code as now.
CACHE_124M_RERUNS = ("results/h200/recheck/recheck-cache-chunk1024.json", "results/h200/recheck/ab-cache-new-1.json",
                     "results/h200/recheck/ab-cache-new-2.json")
PRESETS = tuple(f"results/cpu/presets-tiny-{n}.json" for n in ("gelu", "gelu-2bit", "relu2", "swiglu", "swiglu-more"))
PRESETS_SKETCH = "results/cpu/presets-tiny-gelu-sketch.json"

COPY_TARGET = 0.70  # target of the sparse codec's kernels, as a fraction of the measured copy bandwidth
SIGNPACK_TARGET = 0.03  # target step-time cost of sign packing in the fused MLPs

GPT_STRATEGIES = {  # benchmark strategy -> what docs/memory.md calls it, in the page's order
    "fused-arena": "fused arena",
    "fused-arena-rebuild-ln2": "fused arena + `ln_2` rebuilt",
    "fused-arena-rebuild": "fused arena + all three rebuilt",
    "fused-arena-signpack": "fused arena, sign packed",
}
MODEL_NAMES = {"gpt-gelu": "GPT-GELU", "gpt-relu2": "GPT-ReLU²", "llama-swiglu": "Llama SwiGLU"}  # in tables
PROSE_NAMES = {"gpt-gelu": "GELU GPT", "gpt-relu2": "ReLU² GPT", "llama-swiglu": "Llama"}  # in sentences
PRESET_COLUMNS = {"gelu": "GELU GPT", "relu2": "ReLU² GPT", "swiglu": "SwiGLU Llama"}
PRESET_ROWS = ("conservative", "balanced", "aggressive", "4bit", "2bit")


def pct2(v: float) -> str:
    """A relative change as a signed percentage with two decimals (small loss gaps)."""
    return f"{v:+.2%}"


def _ms(v: float) -> str:
    return f"{v:.1f}"


def _model(rec: dict, name: str, rel: str) -> dict:
    """The model ``name`` of a cache-bench record; a ConfigError naming the file when it is not there."""
    for m in rec["models"]:
        if m["model"] == name:
            return m
    raise ConfigError(f"figure: {rel} has no model {name!r}")


def _run(runs: list[dict], strategy: str, rel: str, **where) -> dict:
    """The run of ``strategy`` (and ``where``'s fields) among ``runs``; a ConfigError naming the file if absent."""
    for r in runs:
        if r["strategy"] == strategy and all(r.get(k) == v for k, v in where.items()):
            return r
    raise ConfigError(f"figure: {rel} has no {strategy!r} run{' at ' + str(where) if where else ''}")


# --- 1. the generic cache -------------------------------------------------------------------------------------

def recheck(root: Path) -> str:
    """One line: the default rules' step-time overhead on the 124M GPTs before the rules remembered their
    decisions per save site and after, and the ReLU² GPT's peak."""
    before, after = load(root, CACHE_BEFORE), load(root, CACHE_RECHECK)
    parts = []
    for name in ("gpt-gelu", "gpt-relu2"):
        b = _run(_model(before, name, CACHE_BEFORE)["runs"], "sparse", CACHE_BEFORE)
        a = _run(_model(after, name, CACHE_RECHECK)["runs"], "sparse", CACHE_RECHECK)
        if a["bytes_saved"] == a["bytes_dense"]:
            why = "nothing compressed: only the looks are left"
        else:
            why = (f"{pct(a['peak_vs_none'] - 1)} peak: the two-pass codec's one synchronization per compressed "
                   "tensor remains")
        parts.append(f"from {pct(b['time_vs_none'] - 1)} to {pct(a['time_vs_none'] - 1)} on the "
                     f"{PROSE_NAMES[name]} ({why})")
    m = _model(after, "gpt-gelu", CACHE_RECHECK)
    return (f"On an {gpu(after)} ({m['params'] / 1e6:.0f}M-parameter GPTs, {m['tokens_per_step']:,} tokens a step) "
            f"the remembered decisions took the default rules' step-time overhead {' and '.join(parts)}. Before: "
            f"{cite(CACHE_BEFORE)[1:-1]}; after: {cite(CACHE_RECHECK)[1:-1]}.")


# --- 2. the fused MLPs on the reference GPT ---------------------------------------------------------------------

def _per_seq(rec: dict, strategy: str, key: str, rel: str) -> list[float]:
    return [_run(rec["runs"], strategy, rel, seq_len=s)[key] - 1 for s in rec["config"]["seq_lens"]]


def _slash(values, fmt=pct) -> str:
    return " / ".join(fmt(v) for v in values)


def gpt_table(root: Path) -> str:
    """The 124M ReLU² GPT with 1024-token loss chunks: per-token peak and step time of each fused-arena strategy
    against plain PyTorch at every sequence length, the step time of a later re-run of the same command beside
    it, and how far medians and single steps moved."""
    rec, rerun = load(root, GPT_CHUNKED), load(root, GPT_RERUN)
    c = rec["config"]
    seqs = " / ".join(str(s) for s in c["seq_lens"])
    lines = [f"Measured on an {gpu(rec)} ({c['preset']} ReLU² GPT, {c['dtype']}, {c['tokens_per_step']:,} tokens a "
             f"step, strategies interleaved step by step; loss over chunks of {c['loss_chunk']} tokens, so that the "
             "head's float32 logits, the same for every strategy, do not hide the activations), against plain "
             f"PyTorch in the same run, sequence length {seqs}:", "",
             "| strategy | per-token peak | step time | step time, re-run |", "|---|---:|---:|---:|"]
    moved, worst = [], []
    for strategy, name in GPT_STRATEGIES.items():
        t, t2 = _per_seq(rec, strategy, "time_vs_none", GPT_CHUNKED), _per_seq(rerun, strategy, "time_vs_none",
                                                                                 GPT_RERUN)
        moved += [abs(a - b) for a, b in zip(t, t2)]
        lines.append(f"| {name} | {_slash(_per_seq(rec, strategy, 'peak_vs_none', GPT_CHUNKED))} | {_slash(t)} | "
                     f"{_slash(t2)} |")
        for s in c["seq_lens"]:
            r = _run(rec["runs"], strategy, GPT_CHUNKED, seq_len=s)
            worst.append((r["max_ms"] / r["median_ms"] - 1, r, name))
    none = [_run(rec["runs"], "none", GPT_CHUNKED, seq_len=s) for s in c["seq_lens"]]
    spread, r, name = max(worst, key=lambda w: w[0])
    lines += ["", f"Source: {cite(GPT_CHUNKED)[1:-1]}; the re-run is the same command on a later day "
              f"{cite(GPT_RERUN)}. Between "
              f"the two runs the step-time medians moved by up to {max(moved) * 100:.1f} points. Within a run of "
              f"{c['rounds']} timed steps a strategy's slowest step is up to {pct(spread)} above its median ({name} "
              f"at sequence length {r['seq_len']}: {_ms(r['min_ms'])}–{_ms(r['max_ms'])} ms), while plain PyTorch's "
              f"stay within {max((n['max_ms'] - n['min_ms']) for n in none):.1f} ms of each other."]
    return "\n".join(lines)


def gpt_default_chunk(root: Path) -> str:
    """The same GPT with the bench's default loss chunks: peak and step time per strategy at every sequence
    length, and the spread of single steps at the shortest length."""
    rec = load(root, GPT_DEFAULT_CHUNK)
    c = rec["config"]
    parts = []
    for strategy, name in GPT_STRATEGIES.items():
        if strategy in c["strategies"]:
            parts.append(f"{name} {_slash(_per_seq(rec, strategy, 'peak_vs_none', GPT_DEFAULT_CHUNK))} at "
                         f"{_slash(_per_seq(rec, strategy, 'time_vs_none', GPT_DEFAULT_CHUNK))}")
    s0 = c["seq_lens"][0]
    runs = [r for r in rec["runs"] if r["seq_len"] == s0 and r["strategy"] != "none"]
    none = _run(rec["runs"], "none", GPT_DEFAULT_CHUNK, seq_len=s0)
    lo = span((r["min_ms"] for r in runs), _ms)
    hi = span((r["max_ms"] for r in runs), _ms)
    return (f"With the bench's default loss chunks of {c['loss_chunk']} tokens {cite(GPT_DEFAULT_CHUNK)} the head's "
            f"logits take a larger share of the peak (per-token peak at step time, sequence length "
            f"{' / '.join(str(s) for s in c['seq_lens'])}): {', '.join(parts)}. The sequence-length-{s0} times of "
            f"that run are noisy: the compressed strategies' fastest steps took {lo.replace(' to ', '–')} ms and "
            f"their slowest {hi.replace(' to ', '–')} ms, while `none` stayed within "
            f"{_ms(none['min_ms'])}–{_ms(none['max_ms'])} ms.")


# --- encoder speed ----------------------------------------------------------------------------------------------

KERNEL_ROWS = (  # (what the page calls it, the record's time field, its fraction-of-copy field, sign packed)
    ("encode, two passes", "encode_s", "encode_frac_copy", False),
    ("encode, one pass (decoupled look-back)", "encode_single_pass_s", "encode_single_pass_frac_copy", False),
    ("fused ReLU² encode, two passes (what the MLPs run)", "encode_relu2_s", "encode_relu2_frac_copy", False),
    ("fused ReLU² encode, one pass", "encode_relu2_single_pass_s", "encode_relu2_single_pass_frac_copy", False),
    ("decode", "decode_s", "decode_frac_copy", False),
    ("encode with sign packing", "encode_s", "encode_frac_copy", True),
)


def kernels(root: Path) -> str:
    """The sparse codec's kernels on bf16 at each density measured: time and fraction of the copy bandwidth,
    and which kernels of any dtype reach the target fraction at every density."""
    rec = load(root, KERNELS)
    c = rec["config"]
    dens = c["densities"]

    def row(dtype, density, packed):
        for r in rec["runs"]:
            if r["dtype"] == dtype and r["density"] == density and r["sign_pack"] == packed:
                return r
        raise ConfigError(f"figure: {KERNELS} has no {dtype} run at density {density} (sign_pack={packed})")

    lines = [f"On an {gpu(rec)} (`actzip bench kernels`, {c['numel'] >> 20}M bfloat16 elements, densities "
             f"{' / '.join(f'{d:g}' for d in dens)}):", "", "| kernel | ms | of copy bandwidth |", "|---|---:|---:|"]
    for name, t, frac, packed in KERNEL_ROWS:
        rs = [row("bfloat16", d, packed) for d in dens]
        if t == "decode_s":  # records made before the run decoder was the default hold no "decoder": gather's
            name = f"{name} ({rs[0].get('decoder', 'gather')} decoder)"
        lines.append(f"| {name} | {' / '.join(f'{r[t] * 1e3:.3f}' for r in rs)} | "
                     f"{' / '.join(f'{r[frac]:.0%}' for r in rs)} |")
    reached = []
    for dtype in c["dtypes"]:
        for name, _, frac, packed in KERNEL_ROWS:
            rs = [row(dtype, d, packed) for d in dens]
            if all(r[frac] is not None and r[frac] >= COPY_TARGET for r in rs):
                reached.append(f"the {dtype} {name} ({' / '.join(f'{r[frac]:.0%}' for r in rs)})")
    who = ("none of them" if not reached else reached[0] + " only" if len(reached) == 1 else ", ".join(reached))
    lines += ["", f"{cite(KERNELS)}. The target of {COPY_TARGET:.0%} of the copy bandwidth is reached by {who}."]
    return "\n".join(lines)


def signpack(root: Path) -> str:
    """One line: sign packing's step-time cost on the GPT at every sequence length, against plain PyTorch and
    against the unpacked arena, checked against its target."""
    rec = load(root, GPT_CHUNKED)
    vs_none = _per_seq(rec, "fused-arena-signpack", "time_vs_none", GPT_CHUNKED)
    vs_arena = [_run(rec["runs"], "fused-arena-signpack", GPT_CHUNKED, seq_len=s)["median_ms"]
                / _run(rec["runs"], "fused-arena", GPT_CHUNKED, seq_len=s)["median_ms"] - 1
                for s in rec["config"]["seq_lens"]]
    met = "within" if max(vs_none) <= SIGNPACK_TARGET else "over"
    return (f"On the GPT above {cite(GPT_CHUNKED)} the sign-packed arena runs {_slash(vs_none)} against "
            f"uncompressed and {_slash(vs_arena)} against the unpacked arena: {met} the target of "
            f"{pct(SIGNPACK_TARGET)} step time.")


# --- 4. quantization kernels ------------------------------------------------------------------------------------

def quant(root: Path) -> str:
    """One line: the launch-shape sweep's range for 4-bit bf16 encode and decode (with the shapes at either end),
    and the default shape's throughput for 4-bit bf16 and float32."""
    rec = load(root, QUANT)

    def at(dtype, variant):
        for r in rec["runs"]:
            if r["dtype"] == dtype and r["variant"] == variant:
                return r
        raise ConfigError(f"figure: {QUANT} has no {dtype} {variant} run")

    sweep = [s for s in rec["sweep"] if s["variant"] == "quant4-sr"]
    if not sweep:
        raise ConfigError(f"figure: {QUANT} has no quant4-sr launch-shape sweep")

    def ends(key):
        lo, hi = min(sweep, key=lambda s: s[key]), max(sweep, key=lambda s: s[key])
        return " to ".join(f"{s[key]:.1%} ({s['tile']} elements, {s['warps']} warp{'s' * (s['warps'] > 1)}, "
                           f"{s['group_threads']} threads a group)" for s in (lo, hi))

    sr, rn = at("bfloat16", "quant4-sr"), at("bfloat16", "quant4-rn")
    f32 = [at("float32", v)["encode_frac_copy"] for v in ("quant4-sr", "quant4-rn", "quant4-absmax-sr")]
    return (f"Over the sweep's {len(sweep)} shapes on an {gpu(rec)}, 4-bit bf16 encode with stochastic rounding "
            f"ran at {ends('encode_frac_copy')} of the copy bandwidth and its decode at {ends('decode_frac_copy')}; "
            f"with the defaults, 4-bit bf16 encodes at {sr['encode_frac_copy']:.1%} ({rn['encode_frac_copy']:.1%} "
            f"with nearest rounding) and decodes at {sr['decode_frac_copy']:.1%}, 4-bit float32 encodes at "
            f"{span(f32, lambda v: f'{v:.1%}')} {cite(QUANT)}.")


# --- the lossy cache's step time --------------------------------------------------------------------------------

def _label(m: dict, wide: bool) -> str:
    name = MODEL_NAMES.get(m["model"], m["model"])
    if wide:
        return f"{name}, {m['n_layer']} blocks of d={m['n_embd']} ({m['params'] / 1e9:.1f}B params)"
    return f"{name} {m['params'] / 1e6:.0f}M"


def _gather(root: Path, rels, name: str, strategy: str, found: list | None = None) -> list[dict]:
    """Every run of ``strategy`` on model ``name`` in the files ``rels`` that hold one (their names appended to
    ``found``)."""
    out = []
    for rel in rels:
        rec = load(root, rel)
        m = next((m for m in rec["models"] if m["model"] == name), None)
        r = None if m is None else next((r for r in m["runs"] if r["strategy"] == strategy), None)
        if r is not None:
            out.append(r)
            if found is not None and rel not in found:
                found.append(rel)
    if not out:
        raise ConfigError(f"figure: no {strategy!r} run of {name!r} in {', '.join(rels)}")
    return out


def _cells(runs: list[dict]) -> str:
    return (f"{span((r['x_smaller'] for r in runs), lambda v: f'{v:.2f}')} | "
            f"{span(r['peak_vs_none'] - 1 for r in runs)} | {span(r['time_vs_none'] - 1 for r in runs)}")


def _target(rec: dict, key: str, rel: str) -> list[dict]:
    found = [t for t in rec.get("targets", []) if t["target"] == key]
    if not found:
        raise ConfigError(f"figure: {rel} records no {key!r} target")
    return found


def cache_table(root: Path) -> str:
    """The 4bit and 2bit presets at d=4096 and at 124M: bytes ratio, peak and step time against plain PyTorch,
    each a range over every committed run of that configuration; then the step-time target at d=4096 and the
    same run before the quant kernels' launch shapes."""
    wide = load(root, CACHE_WIDE)
    c = wide["config"]
    lines = [f"`actzip bench cache`, {c['dtype']}, {c['batch_size']} × {c['seq_len']} tokens per step, "
             f"{c['loss_chunk']}-token loss chunks, on an {gpu(wide)}; each figure against plain PyTorch in the same "
             "run, a range where several runs measured it:", "",
             "| model | 4bit: × smaller | peak | step time | 2bit: × smaller | peak | step time |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    sizes = ((True, (CACHE_WIDE, CACHE_WIDE_2BIT), (CACHE_WIDE_2BIT,), CACHE_WIDE),
             (False, (CACHE_124M, CACHE_124M_2BIT, *CACHE_124M_RERUNS), (CACHE_124M_2BIT,), CACHE_124M))
    for is_wide, four, two, main in sizes:
        for m in load(root, main)["models"]:
            lines.append(f"| {_label(m, is_wide)} | {_cells(_gather(root, four, m['model'], '4bit'))} | "
                         f"{_cells(_gather(root, two, m['model'], '2bit'))} |")
    budget = _target(wide, "time_4bit", CACHE_WIDE)
    runs = [r for m in wide["models"] for r in _gather(root, (CACHE_WIDE, CACHE_WIDE_2BIT), m["model"], "4bit")]
    cost = [r["time_vs_none"] - 1 for r in runs]
    met = "met" if max(cost) <= budget[0]["threshold"] else "not met"
    before = load(root, CACHE_WIDE_BEFORE)
    old = [_run(_model(before, m["model"], CACHE_WIDE_BEFORE)["runs"], "4bit", CACHE_WIDE_BEFORE)["time_vs_none"] - 1
           for m in wide["models"]]
    lines += ["", f"Files: {cite(CACHE_WIDE, CACHE_WIDE_2BIT, CACHE_124M, CACHE_124M_2BIT, *CACHE_124M_RERUNS)[1:-1]}.",
              "", f"**At d={wide['models'][0]['n_embd']}, a 7B model's width, the 4bit preset costs {span(cost)} per "
              f"step: the target of at most {pct(budget[0]['threshold'])} is {met} there.** Before the kernels' launch "
              "shapes, the in-place q/k/v reads and the single decode of shared payloads, the same run gave "
              f"{_slash(old)} ({' / '.join(MODEL_NAMES[m['model']] for m in wide['models'])}; "
              f"{cite(CACHE_WIDE_BEFORE)[1:-1]})."]
    return "\n".join(lines)


def _floor(rec: dict, bw: float, rel: str) -> tuple[dict, dict, float, float]:
    m = _model(rec, "gpt-gelu", rel)
    q = _run(m["runs"], "4bit", rel)
    secs = 2 * (q["bytes_dense"] + q["bytes_saved"]) / bw  # encode reads dense, writes codes; decode the reverse
    return m, q, secs, secs / (_run(m["runs"], "none", rel)["median_ms"] / 1e3)


def cache_floor(root: Path) -> str:
    """One line: the GELU GPT's 4bit activation traffic at the measured copy bandwidth, as time and as a share
    of the plain step, at 124M and at d=4096."""
    bw = load(root, QUANT)["copy_bandwidth"]
    small = load(root, CACHE_124M)
    _, q, secs, share = _floor(small, bw, CACHE_124M)
    step = _run(_model(small, "gpt-gelu", CACHE_124M)["runs"], "none", CACHE_124M)["median_ms"]
    mw, _, _, share_w = _floor(load(root, CACHE_WIDE), bw, CACHE_WIDE)
    return (f"Reading {q['bytes_dense'] / 1e9:.1f} GB of bf16 activations and writing {q['bytes_saved'] / 1e9:.1f} GB "
            f"of codes, then the reverse, is {secs * 1e3:.1f} ms at the measured copy bandwidth: {share:.1%} of the "
            f"{step:.0f} ms step of the 124M GELU GPT even with kernels at full copy speed, and {share_w:.1%} at "
            f"d={mw['n_embd']} {cite(CACHE_124M, CACHE_WIDE, QUANT)}.")


def cache_saves(root: Path) -> str:
    """One line: how many activation tensors a 124M GELU GPT step saves (leaves excepted)."""
    m = _model(load(root, CACHE_124M), "gpt-gelu", CACHE_124M)
    r = _run(m["runs"], "none", CACHE_124M)
    n = sum(v["tensors"] for k, v in r["by_rule"].items() if k != "leaf")
    return f"{n} tensors in forward {cite(CACHE_124M)}"


def two_bit(root: Path) -> str:
    """The 2bit preset's bytes ratio at both sizes against ActNN's ratio taken to bf16 (as the bench records it),
    and its loss gap on the tiny GELU GPT beside 4bit's in the same run."""
    wide, small = load(root, CACHE_WIDE_2BIT), load(root, CACHE_124M_2BIT)

    def ratios(rec, rel):
        return " and ".join(f"{_run(m['runs'], '2bit', rel)['x_smaller']:.2f}× ({PROSE_NAMES[m['model']]})"
                            for m in rec["models"])

    actnn = _target(wide, "cache_2bit_x", CACHE_WIDE_2BIT)[0]["threshold"]  # ActNN's ratio, taken to bf16
    runs = {r["preset"]: r for r in load(root, PRESETS[1])["runs"]}
    p = load(root, PRESETS[1])["config"]
    for need in ("2bit", "4bit"):
        if need not in runs:
            raise ConfigError(f"figure: {PRESETS[1]} has no {need!r} run")
    return (f"It reaches {ratios(wide, CACHE_WIDE_2BIT)} over bf16 at d={wide['models'][0]['n_embd']} and "
            f"{ratios(small, CACHE_124M_2BIT)} at 124M, against {actnn:.1f}× for ActNN's ratio taken to bf16 "
            f"{cite(CACHE_WIDE_2BIT, CACHE_124M_2BIT)}. On the "
            f"tiny GELU GPT over {p['steps']} steps {cite(PRESETS[1])}, its final training loss is "
            f"{pct(runs['2bit']['train_loss_gap'])} (validation {pct(runs['2bit']['val_loss_gap'])}), against "
            f"{pct(runs['4bit']['train_loss_gap'])} ({pct(runs['4bit']['val_loss_gap'])}) for 4bit in the same run; "
            "one seed each.")


# --- the presets' price in loss ---------------------------------------------------------------------------------

def presets(root: Path) -> str:
    """The presets' final training-loss gap (validation gap after it) against `lossless` on the three tiny models,
    every run of a preset listed; how validation relates to training loss; and the ranges the page concludes."""
    cells: dict[tuple[str, str], list[dict]] = {}
    ratio = []
    for rel in PRESETS:
        rec = load(root, rel)
        act = rec["config"]["activation"]
        for r in rec["runs"]:
            ratio.append(r["val_loss"] / r["final_train_loss"])
            if r["preset"] != "lossless":
                cells.setdefault((r["preset"], act), []).append(r)
    twice = next(((k, v) for k, v in cells.items() if len(v) > 1), None)
    lines = [f"Validation loss is {span(ratio, times)} the training loss"]
    if twice:
        (preset, act), runs = twice
        lines[0] += (f", and its gap moves between runs of the same preset ({preset} on the {PRESET_COLUMNS[act]}: "
                     f"{', then '.join(pct(r['val_loss_gap']) for r in runs)})")
    lines[0] += ". Each figure is one run of one seed; a preset run twice has both listed."
    lines += ["", f"| preset | {' | '.join(PRESET_COLUMNS.values())} |", "|---|" + "---:|" * len(PRESET_COLUMNS)]
    for preset in PRESET_ROWS:
        row = []
        for act in PRESET_COLUMNS:
            runs = cells.get((preset, act), [])
            row.append("—" if not runs else f"{', '.join(pct2(r['train_loss_gap']) for r in runs)} "
                                            f"({', '.join(pct(r['val_loss_gap']) for r in runs)})")
        lines.append(f"| {preset} | {' | '.join(row)} |")
    four = [r["train_loss_gap"] for (p, _), rs in cells.items() if p == "4bit" for r in rs]
    two = [r["train_loss_gap"] for (p, _), rs in cells.items() if p in ("aggressive", "2bit") for r in rs]
    lines += ["", f"Files: {cite(*PRESETS)[1:-1]}, with their loss curves. In these single runs the 4bit preset's training-loss "
              f"gap is at most {pct2(max(four))} on all three models. 2-bit linear inputs (`aggressive`, `2bit`) cost "
              f"{span(two, pct2)}."]
    return "\n".join(lines)


# --- the sketch -------------------------------------------------------------------------------------------------

def sketch(root: Path) -> str:
    """The rank-d/8 sketch at 124M and at d=4096: bytes ratio, peak and step time against plain PyTorch (a range
    over the committed runs), the recorded peak target and where it is met."""
    small, wide = load(root, CACHE_124M), load(root, CACHE_WIDE)
    lines = ["| rank d/8, every linear but the head | saved bytes | peak memory | step time |", "|---|---:|---:|---:|"]
    verdict, found = [], []
    for rec, rels, rel, is_wide in ((small, (CACHE_124M, *CACHE_124M_RERUNS), CACHE_124M, False),
                                    (wide, (CACHE_WIDE,), CACHE_WIDE, True)):
        for i, m in enumerate(rec["models"]):
            runs = _gather(root, rels, m["model"], "sketch-d8", found)
            label = _label(m, is_wide)
            if not is_wide:
                label += f", {rec['config']['loss_chunk']}-token loss chunks" if i == 0 else ", same"
            x = span((r["x_smaller"] for r in runs), lambda v: f"{v:.2f}×")
            lines.append(f"| {label} | {x}{' smaller' if i == 0 and not is_wide else ''} | "
                         f"{span(r['peak_vs_none'] - 1 for r in runs)} | {span(r['time_vs_none'] - 1 for r in runs)} |")
            t = next(t for t in _target(rec, "peak_sketch", rel) if t["model"] == m["model"])
            name = PROSE_NAMES[m["model"]]
            verdict.append((t, f"the d={m['n_embd']} {name}" if is_wide else f"the {m['params'] / 1e6:.0f}M {name}"))
    threshold = verdict[0][0]["threshold"]
    lines.append(f"| target | | at least {threshold:.0%} lower | |")
    met = [f"{name} ({pct(-t['value'])})" for t, name in verdict if t["met"]]
    missed = [name for t, name in verdict if not t["met"]]
    head = f"met on {', '.join(met)}" if met else "met on none of them"
    tail = f", not on {', '.join(missed[:-1])} and {missed[-1]}" if len(missed) > 1 else (
        f", not on {missed[0]}" if missed else "")
    lines += ["", f"Files: {cite(*found)[1:-1]}; a range where several runs measured it. "
              f"**The target of a peak at least {threshold:.0%} lower is {head}{tail}.**"]
    return "\n".join(lines)


def sketch_resident(root: Path) -> str:
    """One line: the resident bytes (weights, gradients, AdamW state) of the d=4096 models."""
    rec = load(root, CACHE_WIDE)
    return (", ".join(f"{m['resident_bytes'] / 2**30:.1f} GiB for the {PROSE_NAMES[m['model']]}"
                      for m in rec["models"]) + f" {cite(CACHE_WIDE)}")


def sketch_loss(root: Path) -> str:
    """The sketch's price in loss on the tiny GELU GPT against `lossless`, 4bit's beside it, and the sketch's
    weight-gradient error on the 124M GPT."""
    sk, pre = load(root, PRESETS_SKETCH), load(root, PRESETS[0])
    s = {r["preset"]: r for r in sk["runs"]}
    q = {r["preset"]: r for r in pre["runs"]}
    for rel, runs, need in ((PRESETS_SKETCH, s, ("lossless", "sketch-d8")), (PRESETS[0], q, ("4bit",))):
        for n in need:
            if n not in runs:
                raise ConfigError(f"figure: {rel} has no {n!r} run")
    r, base, four = s["sketch-d8"], s["lossless"], q["4bit"]
    m = _model(load(root, CACHE_124M), "gpt-gelu", CACHE_124M)
    err = _run(m["runs"], "sketch-d8", CACHE_124M)["grad_rel_error"]
    return (f"{1 - r['saved_bytes_per_token'] / r['dense_bytes_per_token']:.1%} fewer saved bytes per token, and a "
            f"final training loss of {r['final_train_loss']:.3f} against {base['final_train_loss']:.3f} "
            f"({pct(r['train_loss_gap'])}), validation {pct(r['val_loss_gap'])}, one seed {cite(PRESETS_SKETCH)}. "
            f"The 4bit preset, with {1 - four['saved_bytes_per_token'] / four['dense_bytes_per_token']:.1%} fewer "
            f"bytes, costs {pct(four['train_loss_gap'])} / {pct(four['val_loss_gap'])} from the same weights and "
            f"batches {cite(PRESETS[0])}. A rank-8 sketch is an unbiased but very noisy weight gradient: its relative "
            f"error against the exact one is {err:.2f} on the 124M GELU GPT as well {cite(CACHE_124M)}.")


RENDERERS = {
    "memory-recheck": recheck,
    "memory-gpt-table": gpt_table,
    "memory-gpt-default-chunk": gpt_default_chunk,
    "memory-kernels": kernels,
    "memory-signpack": signpack,
    "memory-quant": quant,
    "memory-cache-table": cache_table,
    "memory-cache-floor": cache_floor,
    "memory-cache-saves": cache_saves,
    "memory-2bit": two_bit,
    "memory-presets": presets,
    "memory-sketch": sketch,
    "memory-sketch-resident": sketch_resident,
    "memory-sketch-loss": sketch_loss,
}
