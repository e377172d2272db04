"""Where the sparse encoder's time goes: its two passes apart, and single-pass encoders whose tile offsets come
from one atomic add (tiles in the order they arrive, no look-back), as fractions of the copy bandwidth.

Run from the repo root:  PYTHONPATH=src python3 scripts/sparse_encode_atomic.py cuda 268435456 OUT.json
CPU check (correctness only):  TRITON_INTERPRET=1 PYTHONPATH=src python3 scripts/sparse_encode_atomic.py cpu 20000

The atomic variants are not the codec's format (its tiles' values follow each other in tile order, which the
decoders rely on): each is checked by reading every tile's values at its own offset against the two-pass
encoder's. Rows: ``two-pass`` (the default encoder), ``count-only`` and ``compact-only`` (its two passes alone;
bytes counted as for the whole encode, so their fractions only compare with each other), and the atomic
single-pass layouts (``row8``/``row2``: a tile as [T/8, 8] or [T/2, 2]; ``flat-vecV``: one scan over the tile
with a store-offset hint of V elements; ``-wN``: warps).
"""
import json
import os
import sys

import torch
import triton
import triton.language as tl
from actzip.kernels import sparse as K, sparse_encode as E
from actzip_bench.harness import copy_bandwidth, machine_record
from actzip_bench.kernels import sparse_tensor


@triton.jit
def atomic_kernel(src_ptr, mask_ptr, offs_ptr, values_ptr, counter_ptr, n, T: tl.constexpr, ROW: tl.constexpr,
                  FLAT: tl.constexpr, VEC: tl.constexpr):
    tile = tl.program_id(0).to(tl.int64)
    if FLAT:
        idx = tl.arange(0, T)
        inb = idx < tl.minimum(n - tile * T, T).to(tl.int32)
        x = tl.load(src_ptr + tile * T + idx, mask=inb, other=0)
        f = (x != 0).to(tl.int32)
        f8 = tl.reshape(f, (T // 8, 8))
        tl.store(mask_ptr + tile * (T // 8) + tl.arange(0, T // 8),
                 tl.sum(f8 << tl.arange(0, 8)[None, :], axis=1).to(tl.uint8))
        size = tl.sum(f, axis=0)
        base = tl.atomic_add(counter_ptr, size.to(tl.int64), sem="relaxed")
        rank = tl.cumsum(f, axis=0) - f
        off = base + rank
        if VEC > 1:
            off = tl.max_contiguous(tl.multiple_of(off, VEC), VEC)
        tl.store(values_ptr + off, x, mask=f != 0)
    else:
        rows = tl.arange(0, T // ROW)
        cols = tl.arange(0, ROW)
        local = rows[:, None] * ROW + cols[None, :]
        inb = local < tl.minimum(n - tile * T, T).to(tl.int32)
        x = tl.load(src_ptr + tile * T + local, mask=inb, other=0)
        f = (x != 0).to(tl.int32)
        f8 = tl.reshape(f, (T // 8, 8))
        tl.store(mask_ptr + tile * (T // 8) + tl.arange(0, T // 8),
                 tl.sum(f8 << tl.arange(0, 8)[None, :], axis=1).to(tl.uint8))
        per = tl.sum(f, axis=1)
        size = tl.sum(per, axis=0)
        base = tl.atomic_add(counter_ptr, size.to(tl.int64), sem="relaxed")
        rank = (tl.cumsum(per, axis=0) - per)[:, None] + (tl.cumsum(f, axis=1) - f)
        tl.store(values_ptr + base + rank, x, mask=f != 0)
    tl.store(offs_ptr + tile, base.to(tl.int32))


def atomic_encode(bits, T, row, flat, vec, warps, values, counter, mask, offs):
    counter.zero_()
    n = bits.numel()
    atomic_kernel[(triton.cdiv(n, T),)](bits, mask, offs, values, counter, n, T=T, ROW=row, FLAT=flat, VEC=vec,
                                        num_warps=warps)


def main():
    dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    numel = int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 28
    out = sys.argv[3] if len(sys.argv) > 3 else None
    T = int(os.environ.get("TILE", 4096))
    timing = dev.type == "cuda"
    bw = copy_bandwidth(dev) if timing else None
    res = {"copy_bandwidth": bw, "numel": numel, "tile": T, "machine": machine_record(dev), "rows": [],
           "command": "python3 scripts/sparse_encode_atomic.py " + " ".join(sys.argv[1:])}
    variants = {"row8-w4": (8, False, 1, 4), "row8-w8": (8, False, 1, 8), "row2-w4": (2, False, 1, 4),
                "flat-vec8-w4": (8, True, 8, 4), "flat-vec8-w8": (8, True, 8, 8), "flat-vec1-w4": (8, True, 1, 4),
                "flat-vec8-w16": (8, True, 8, 16)}
    for density in (0.5, 0.2):
        x = sparse_tensor(numel, torch.bfloat16, density, dev)
        bits = x.view(torch.int16)
        n = bits.numel()
        ref_values = torch.empty(n, dtype=torch.int16, device=dev)
        ref = E.encode(x, T, values=ref_values)
        total = int(ref.total)
        payload = ref.mask.numel() + 4 * ref.tile_offsets.numel() + total * 2
        moved = n * 2 + payload
        counts = torch.diff(torch.cat([ref.tile_offsets.long(), torch.tensor([total], device=dev)]))
        fns = {"two-pass": lambda: E.encode(x, T, values=ref_values)}
        c = K.count(bits, n, T, False)
        fns["count-only"] = lambda: K.count(bits, n, T, False)
        fns["compact-only"] = lambda: K.compact(bits, n, c, ref_values, T)
        exact = {}
        for name, (row, flat, vec, warps) in variants.items():
            values = torch.full((n,), 7, dtype=torch.int16, device=dev)
            counter = torch.zeros(1, dtype=torch.int64, device=dev)
            mask = torch.empty_like(ref.mask)
            offs = torch.empty_like(ref.tile_offsets)
            fn = (lambda row=row, flat=flat, vec=vec, warps=warps, values=values, counter=counter, mask=mask,
                  offs=offs: atomic_encode(bits, T, row, flat, vec, warps, values, counter, mask, offs))
            fn()
            ok = torch.equal(mask, ref.mask) and int(counter) == total
            # every tile's values at its own offset equal the reference's
            idx = torch.repeat_interleave(offs.long(), counts) + (
                torch.arange(total, device=dev) - torch.repeat_interleave(ref.tile_offsets.long(), counts))
            ok = ok and torch.equal(values[idx], ref_values[:total])
            exact[name] = ok
            fns[name] = fn
        rows = {k: {"variant": k, "density": density, "exact": exact.get(k, True), "moved_bytes": moved} for k in fns}
        if timing:
            import triton.testing
            for _ in range(2):
                for k, fn in fns.items():
                    t = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                    rows[k]["ms"] = min(t, rows[k].get("ms", t))
            for r in rows.values():
                r["frac_copy"] = r["moved_bytes"] / (r["ms"] / 1e3) / bw
        for r in rows.values():
            print(f"{r['variant']:<16} d={density} exact={r['exact']} ms={r.get('ms', 0):.3f} frac={r.get('frac_copy', 0):.3f}",
                  flush=True)
        res["rows"].extend(rows.values())
    if out:
        json.dump(res, open(out, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
