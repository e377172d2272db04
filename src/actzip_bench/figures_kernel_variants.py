"""docs/memory.md figure of the sparse kernels' variants (see :mod:`actzip_bench.figures`): the decoders and the
single-pass encoders against today's defaults, each timed in one run of ``scripts/sparse_decode_variants.py`` /
``scripts/sparse_encode_variants.py`` as a fraction of the copy bandwidth measured in the same run."""

from __future__ import annotations

from pathlib import Path

from actzip_bench.figure_helpers import cite, gpu, load

DECODE = "results/h200/sparse-decode-variants.json"
ENCODE = "results/h200/sparse-encode-variants.json"
DEFAULT_RUN = "run_g1_w4"  # decode_run's defaults: one tile a program, the sparse kernels' warps for 4096


def _frac(rows, **where) -> float | None:
    hit = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    return hit[0]["frac_copy"] if hit else None


def kernel_variants(root: Path) -> str:
    dec, enc = load(root, DECODE), load(root, ENCODE)
    densities = sorted({r["density"] for r in dec["rows"]}, reverse=True)
    dtypes = list(dict.fromkeys(r["dtype"] for r in dec["rows"]))
    head = " / ".join(f"{d:g}" for d in densities)
    out = [f"Decoders on an {gpu(dec)} ({dec['config']['numel'] // 2**20}M elements, densities {head}; fraction of "
           f"the copy bandwidth, {dec['copy_bandwidth'] / 1e12:.2f} TB/s, measured in the same run; every variant "
           "bit-identical to the gather decoder):", "",
           "| dtype | gather (one load per value) | run (the default) | best run variant |", "|---|---:|---:|---:|"]
    for dt in dtypes:
        cells = []
        for v in ("gather", DEFAULT_RUN):
            cells.append(" / ".join(f"{_frac(dec['rows'], dtype=dt, density=d, variant=v):.0%}" for d in densities))
        best = []
        for d in densities:
            rs = [r for r in dec["rows"] if r["dtype"] == dt and r["density"] == d and r["variant"] != "gather"]
            b = max(rs, key=lambda r: r["frac_copy"])
            best.append(f"{b['frac_copy']:.0%} ({b['variant']})")
        out.append(f"| {dt} | {cells[0]} | {cells[1]} | {' / '.join(best)} |")
    tried = {r["variant"] for r in dec["rows"] if r["variant"] != "gather"}
    out += ["", f"{len(tried)} run variants were timed (tiles a program, warps, layout) {cite(DECODE)}.", ""]
    rows = [r for r in enc["rows"] if r["dtype"] == "bfloat16" and r["mode"] == "plain"]
    variants = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "two-pass"]
    two = " / ".join(f"{_frac(rows, variant='two-pass', density=d):.0%}" for d in densities)
    best = []
    for d in densities:
        b = max((r for r in rows if r["variant"] != "two-pass" and r["density"] == d), key=lambda r: r["frac_copy"])
        best.append(f"{b['frac_copy']:.0%} ({b['variant']})")
    out += [f"Encoders (bfloat16, same densities, same measure): the two passes run at {two} of the copy bandwidth; "
            f"the best of {len(variants)} single-pass variants (super-tiles of 1–4 tiles a look-back, a persistent "
            f"grid, layouts, look-back windows) at {' / '.join(best)}, so the two passes stay the default "
            f"{cite(ENCODE)}."]
    return "\n".join(out)


RENDERERS = {"memory-kernel-variants": kernel_variants}
