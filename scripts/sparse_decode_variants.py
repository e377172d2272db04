"""Sparse decode variants on one GPU: the original per-element gather decoder against the run decoder
(actzip.kernels.sparse_decode) over its knobs (tiles per program G, warps, layout), as fractions of the copy
bandwidth, the way `actzip bench kernels` counts them (payload + dense bytes over time).

Run from the repo root:  PYTHONPATH=src python3 scripts/sparse_decode_variants.py --out results/h200/sparse-decode-variants.json
Every variant is first checked bit for bit against the original decoder (and that against the tensor's bits);
a variant that fails or raises is reported and not timed. Timing: triton.testing.do_bench medians, the
variants of one tensor interleaved, each twice, the better kept.
CPU check of the script itself (interpreter, correctness only):
  PYTHONPATH=src python3 scripts/sparse_decode_variants.py --device cpu --numel 20000 --out /tmp/dv.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

T0 = time.time()

# (G, warps, layout) per dtype: bf16 is the target, fp8 and fp32 for reference
RUN_KNOBS = {
    "bfloat16": [(1, 4, "rows"), (1, 8, "rows"), (1, 2, "rows"), (2, 4, "rows"), (2, 8, "rows"), (4, 8, "rows"),
                 (1, 4, "flat"), (2, 8, "flat")],
    "float8_e4m3fn": [(1, 4, "rows"), (1, 8, "rows"), (2, 4, "rows"), (2, 8, "rows"), (4, 8, "rows")],
    "float32": [(1, 4, "rows"), (1, 8, "rows"), (2, 8, "rows")],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="decode_variants.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--numel", type=int, default=None, help="elements per tensor (default 2**28 on CUDA, 20000 on CPU)")
    ap.add_argument("--dtypes", default="bfloat16,float8_e4m3fn,float32")
    ap.add_argument("--densities", default="0.5,0.2")
    ap.add_argument("--tile-size", type=int, default=4096)
    ap.add_argument("--warmup-ms", type=int, default=25)
    ap.add_argument("--rep-ms", type=int, default=100)
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

    import torch

    from actzip.core.dtypes import bit_view_dtype
    from actzip.kernels import sparse as K
    from actzip.kernels import sparse_decode as D
    from actzip.kernels import sparse_encode as E
    from actzip.kernels.sparse_launch import values_base
    from actzip_bench.harness import copy_bandwidth, machine_record
    from actzip_bench.kernels import sparse_tensor

    device = torch.device(args.device)
    timing = device.type == "cuda"
    numel = args.numel or ((1 << 28) if timing else 20000)
    T = args.tile_size
    if timing:
        import triton.testing
    bw = copy_bandwidth(device) if timing else None
    rows = []
    print(f"copy bandwidth: {bw / 1e12:.3f} TB/s" if bw else "copy bandwidth: not measured (no timing on CPU)")
    for dname in args.dtypes.split(","):
        dtype = getattr(torch, dname)
        for density in (float(d) for d in args.densities.split(",")):
            x = sparse_tensor(numel, dtype, density, device)
            bits = x.view(bit_view_dtype(dtype))
            n = bits.numel()
            c = E.encode(bits, T, False)
            payload = c.mask.numel() + 4 * c.tile_offsets.numel() + c.values.numel() * c.values.element_size()
            dense = n * x.element_size()
            out = torch.empty_like(bits)
            vbase = values_base(None, device)

            def gather(out=out, c=c):
                return K.decompress(c.mask, c.tile_offsets, c.values, n, dtype, T, out=out, variant="gather")

            variants = {"gather": (gather, {})}
            for g, w, lay in RUN_KNOBS.get(dname, RUN_KNOBS["bfloat16"]):
                def fn(out=out, c=c, g=g, w=w, lay=lay):
                    return D.decode_run(c.mask, c.tile_offsets, c.values, vbase, out, n, T, tiles=g, warps=w,
                                        layout=lay)
                variants[f"run_g{g}_w{w}" + ("_flat" if lay == "flat" else "")] = (fn, {"tiles": g, "warps": w,
                                                                                          "layout": lay})
            ref = gather().clone()
            ref_ok = bool(torch.equal(ref, bits))
            status = {}
            for key, (fn, _) in list(variants.items()):
                try:
                    out.fill_(0x55)
                    got = fn()
                    status[key] = bool(torch.equal(got, ref)) and ref_ok
                except Exception as e:  # noqa: BLE001 - reported, not timed
                    status[key] = f"{type(e).__name__}: {str(e)[:400]}"
                    traceback.print_exc()
                if status[key] is not True:
                    print(f"  {dname} {density} {key}: NOT EXACT ({status[key]})", flush=True)
            del ref
            timed = {}
            if timing:
                for _ in range(2):  # interleaved: every variant once per round, the better median kept
                    for key, (fn, _) in variants.items():
                        if status[key] is True:
                            t = triton.testing.do_bench(fn, warmup=args.warmup_ms, rep=args.rep_ms,
                                                        return_mode="median") / 1e3
                            timed[key] = min(t, timed.get(key, t))
            for key, (_, knobs) in variants.items():
                s = timed.get(key)
                rows.append({"dtype": dname, "density": density, "variant": key, "knobs": knobs, "numel": n,
                             "exact": status[key], "s": s, "frac_copy": (payload + dense) / s / bw if s else None,
                             "payload_bytes": payload, "dense_bytes": dense})
            best = min(timed, key=timed.get) if timed else None
            print(f"{dname} density {density}: payload {payload / 1e6:.1f} MB, dense {dense / 1e6:.1f} MB"
                  + (f", best {best}" if best else "") + f" ({time.time() - T0:.0f} s in)", flush=True)
            for r in rows:
                if r["dtype"] == dname and r["density"] == density:
                    ms = f"{r['s'] * 1e3:8.3f}" if r["s"] else "       -"
                    frac = f"{100 * r['frac_copy']:5.1f}%" if r["frac_copy"] else "     -"
                    print(f"  {r['variant']:18s} {dname:14s} {density:4.2f} {ms} ms {frac}  exact={r['exact']}")
            del x, bits, c, out
            if timing:
                torch.cuda.empty_cache()
    try:
        machine = machine_record(device)
    except Exception as e:  # noqa: BLE001 - a record without it is still useful
        machine = {"error": f"{type(e).__name__}: {e}"}
    result = {"config": {**vars(args), "numel": numel}, "copy_bandwidth": bw, "rows": rows, "machine": machine,
              "elapsed_s": time.time() - T0}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    bad = [r for r in rows if r["exact"] is not True]
    print(f"wrote {args.out} ({len(rows)} rows, {len(bad)} not exact) in {time.time() - T0:.0f} s")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
