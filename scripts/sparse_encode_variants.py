"""Single-pass sparse encoder variants (actzip.kernels.sparse_encode_single.OnePass) against the two-pass
encoder and today's single-pass kernel, as fractions of the device's copy bandwidth.

Run from the repo root:  PYTHONPATH=src python3 scripts/sparse_encode_variants.py --out results/h200/sparse-encode-variants.json
CPU check (correctness only, tiny):  TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/sparse_encode_variants.py \
    --device cpu --numel 20000 --tile 256

Every variant is first checked bit for bit against the two-pass encode (mask, tile_offsets, values, total,
nnz; for relu2 also the activation), then all are timed interleaved with triton.testing.do_bench (median;
each twice, the better kept). Bytes counted: the dense input read plus the payload written (relu2: plus the
activation written). The JSON is rewritten after every row, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time

import torch

from actzip.kernels import sparse_encode as E
from actzip.kernels.sparse_encode_single import OnePass, check_one_pass
from actzip_bench.harness import copy_bandwidth, machine_record
from actzip_bench.kernels import sparse_tensor

R = "16B"  # row = vec = 16 bytes of elements a thread (8 bf16, 16 fp8, 4 fp32), as compact_kernel's VEC

# name -> None (two-pass), "one-pass" (today's encode_kernel, row 8), or OnePass knobs (row/vec R: 16 bytes)
VARIANTS = {
    "two-pass": None,
    "one-pass": "one-pass",
    "g1-novec": dict(group=1, row=8, vec=1, num_warps=4),  # today's kernel, through encode_tiles_kernel
    "g1-vec": dict(group=1, row=R, vec=R, num_warps=4),
    "g1-vec-lb32": dict(group=1, row=R, vec=R, lookback=32, num_warps=4),
    "g1-row2vec": dict(group=1, row=2, vec=2, num_warps=4),
    "g2-vec-w8": dict(group=2, row=R, vec=R, num_warps=8),
    "g4-vec-w16": dict(group=4, row=R, vec=R, num_warps=16),
    # Persistent grids of more programs per SM than fit (the surplus waits, then finds no ticket left).
    "p1-vec-w4": dict(group=1, persistent=True, programs_per_sm=8, row=R, vec=R, num_warps=4),
    "p1-vec-w8": dict(group=1, persistent=True, programs_per_sm=4, row=R, vec=R, num_warps=8),
    "p2-vec-w8": dict(group=2, persistent=True, programs_per_sm=4, row=R, vec=R, num_warps=8),
    "p2-vec-w16": dict(group=2, persistent=True, programs_per_sm=2, row=R, vec=R, num_warps=16),
}
# The reference dtypes and the fused ReLU² get a few of them.
SHORT = ["two-pass", "one-pass", "g1-vec", "g2-vec-w8", "p1-vec-w4"]


def one_pass(spec, elem: int, tile: int) -> OnePass | None:
    if not isinstance(spec, dict):
        return None
    knobs = {k: (16 // elem if v == R else v) for k, v in spec.items()}
    return check_one_pass(OnePass(**knobs), tile, 8)


def parse_variant(text: str) -> tuple[str, dict]:
    """``NAME:k=v,k=v`` (v an int, true/false, or 16B) -> a variant of OnePass knobs."""
    name, _, body = text.partition(":")
    knobs = {}
    for item in filter(None, body.split(",")):
        k, v = item.split("=")
        knobs[k] = R if v == R else {"true": True, "false": False}.get(v.lower(), None)
        if knobs[k] is None:
            knobs[k] = int(v)
    return name, knobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--numel", type=int, default=1 << 28)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tile", type=int, default=4096)
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn,float32")
    ap.add_argument("--densities", default="0.5,0.2")
    ap.add_argument("--only", default=None, help="comma-separated variant names (default: all)")
    ap.add_argument("--variant", action="append", default=[], help="extra variant NAME:k=v,... (all dtypes)")
    ap.add_argument("--full", action="store_true", help="every variant for every dtype and for relu2")
    ap.add_argument("--no-relu2", action="store_true")
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--rep", type=int, default=100)
    args = ap.parse_args()
    faulthandler.dump_traceback_later(570, exit=True)  # a hung look-back says where, before the run's limit
    dev = torch.device(args.device)
    timing = dev.type == "cuda"
    variants = dict(VARIANTS)
    extra = dict(parse_variant(v) for v in args.variant)
    variants.update(extra)
    if args.only:
        keep = set(args.only.split(",")) | {"two-pass"}
        variants = {k: v for k, v in variants.items() if k in keep}
    t_start = time.time()
    bw = copy_bandwidth(dev) if timing else None
    result = {"copy_bandwidth": bw, "numel": args.numel, "tile": args.tile, "rows": [],
              "variants": {k: v for k, v in variants.items()}, "machine": machine_record(dev)}

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)

    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        elem = dtype.itemsize
        names = [k for k in variants if args.full or dname == "bfloat16" or k in SHORT or k in extra]
        for density in map(float, args.densities.split(",")):
            x = sparse_tensor(args.numel, dtype, density, dev)
            cases = [("plain", x)]
            if elem == 2 and not args.no_relu2:
                cases.append(("relu2", torch.where(x != 0, x, -x.abs() - 1)))  # same density; negatives at zeros
            for mode, src in cases:
                relu = mode == "relu2"
                kw = dict(relu=True, act="relu2") if relu else {}
                sel = names if not relu or args.full else [k for k in names if k in SHORT or k in extra]
                n = src.numel()
                ref_values = torch.empty(n, dtype=E.bits_dtype(dtype), device=dev)
                ref = E.encode(src, args.tile, values=ref_values, **kw)
                total = int(ref.total)
                payload = ref.mask.numel() + 4 * ref.tile_offsets.numel() + total * elem
                moved = (2 if relu else 1) * n * elem + payload
                fns, rows = {}, {}
                for name in sel:
                    spec = variants[name]
                    values = ref_values if spec is None else torch.empty(n, dtype=ref_values.dtype, device=dev)
                    opt = one_pass(spec, elem, args.tile)
                    p = {} if spec is None else dict(passes=1, one_pass=opt)

                    def fn(values=values, p=p):
                        return E.encode(src, args.tile, values=values, **kw, **p)

                    t0 = time.time()
                    got = fn()
                    exact = (int(got.total) == total and int(got.nnz) == int(ref.nnz) and int(got.ok) == 1
                             and torch.equal(got.mask, ref.mask) and torch.equal(got.tile_offsets, ref.tile_offsets)
                             and torch.equal(values[:total], ref_values[:total]))  # fmt: skip
                    if relu:
                        exact = exact and torch.equal(got.act.view(ref_values.dtype), ref.act.view(ref_values.dtype))
                    del got
                    first_s = time.time() - t0
                    rows[name] = dict(variant=name, dtype=dname, density=density, mode=mode, numel=n, exact=exact,
                                      one_pass=opt._asdict() if opt else spec, first_call_s=first_s,
                                      payload_bytes=payload, moved_bytes=moved)  # fmt: skip
                    if not exact:
                        print(f"NOT EXACT: {name} {dname} {density} {mode}", flush=True)
                    fns[name] = fn
                if timing:
                    import triton.testing

                    for _ in range(2):  # interleaved: each variant twice, the better median kept
                        for name, fn in fns.items():
                            t = triton.testing.do_bench(fn, warmup=args.warmup, rep=args.rep, return_mode="median")
                            r = rows[name]
                            r["ms"] = min(t, r.get("ms", t))
                    for r in rows.values():
                        r["frac_copy"] = r["moved_bytes"] / (r["ms"] / 1e3) / bw
                result["rows"].extend(rows.values())
                save()
                for r in rows.values():
                    ms = f"{r['ms']:8.3f}" if "ms" in r else "       -"
                    frac = f"{r['frac_copy']:6.1%}" if "frac_copy" in r else "     -"
                    print(f"{r['variant']:<14} {dname:<14} {density:4.2f} {mode:<6} {ms} ms {frac}  "
                          f"exact={r['exact']}", flush=True)
                del fns, rows, ref, ref_values
            del x, cases
    result["wall_s"] = time.time() - t_start
    save()
    bad = [r for r in result["rows"] if not r["exact"]]
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "no timing (not CUDA)",
          f"| {len(result['rows'])} rows, {len(bad)} not exact | {result['wall_s']:.0f} s")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
