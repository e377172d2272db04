"""docs/memory.md figure of the sparse kernels' variants (see :mod:`actzip_bench.figures`): the decoders and the
single-pass encoders against today's defaults, each timed in one run of ``scripts/sparse_decode_variants.py`` /
``scripts/sparse_encode_variants.py`` as a fraction of the copy bandwidth measured in the same run."""

from __future__ import annotations

from pathlib import Path

from actzip.errors import ConfigError
from actzip_bench.figure_helpers import cite, gpu, load

DECODE = "results/h200/sparse-decode-variants.json"
ENCODE = "results/h200/sparse-encode-variants.json"
ENCODE_PARTS = "results/h200/sparse-encode-atomic.json"  # scripts/sparse_encode_atomic.py
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


def encode_parts(root: Path) -> str:
    """The two-pass encoder's passes timed apart, and single passes with atomic tile offsets, in one run."""
    rec = load(root, ENCODE_PARTS)
    rows = rec["rows"]
    densities = sorted({r["density"] for r in rows}, reverse=True)
    if not all(r["exact"] for r in rows):
        raise ConfigError(f"figure: {ENCODE_PARTS} has a variant that did not match the two-pass encoder")

    def ms(v):
        return " / ".join(f"{next(r['ms'] for r in rows if r['variant'] == v and r['density'] == d):.3f}"
                          for d in densities)

    atomic = [v for v in dict.fromkeys(r["variant"] for r in rows) if v not in ("two-pass", "count-only",
                                                                                 "compact-only")]
    best = []
    for d in densities:
        b = max((r for r in rows if r["variant"] in atomic and r["density"] == d), key=lambda r: r["frac_copy"])
        best.append((b, f"{b['frac_copy']:.0%} ({b['variant']}, {b['ms']:.3f} ms)"))
    two = " / ".join(f"{_frac(rows, variant='two-pass', density=d):.0%}" for d in densities)
    compact = " / ".join(f"{_frac(rows, variant='compact-only', density=d):.0%}" for d in densities)
    return (f"Where the encoder's time goes ({gpu(rec)}, {rec['numel'] // 2**20}M bfloat16 elements, densities "
            f"{' / '.join(f'{d:g}' for d in densities)}, one run, copy bandwidth {rec['copy_bandwidth'] / 1e12:.2f} "
            f"TB/s): the two passes take {ms('two-pass')} ms ({two} of the copy bandwidth), the count pass alone "
            f"{ms('count-only')} ms and the compaction pass alone {ms('compact-only')} ms, which on its own is "
            f"{compact} of the copy bandwidth counted over the whole encode's bytes. A single pass that takes each "
            f"tile's offset from one atomic add (no look-back; tiles stored in the order they finish, which the "
            f"codec's format does not allow) runs at best at {' / '.join(t for _, t in best)} of {len(atomic)} "
            f"layouts: no faster than the compaction alone, whose scattered 2-byte stores bound every encoder "
            f"that writes the values this way {cite(ENCODE_PARTS)}.")


RENDERERS = {"memory-kernel-variants": kernel_variants, "memory-encode-parts": encode_parts}
