"""Sparse-codec kernel throughput as a fraction of the device's measured copy bandwidth.

For each dtype, density and packing: the two-pass encode (count pass, device scan, compact pass into a
preallocated buffer; with sign packing a packing pass after it), the single-pass encode (decoupled look-back;
no sign packing), for 16-bit floats the fused ReLU² encode the fused MLPs run (reads h, writes relu(h)² and
the payload of relu(h); two passes, and one for comparison), and the decode, timed with
``triton.testing.do_bench`` (median of the better of two interleaved rounds). Throughput counts the fewest
bytes each must move: encode reads the tensor and writes the payload, decode reads the payload and writes
the tensor. The copy bandwidth (bytes read + written by a large device-to-device copy) is measured in the
same run.
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import torch

from actzip.core.dtypes import bit_view_dtype


@dataclass
class KernelBenchConfig:
    numel: int = 1 << 28  # elements per tensor (256M: far larger than the L2 cache)
    dtypes: tuple[str, ...] = ("bfloat16", "float8_e4m3fn", "float32")
    densities: tuple[float, ...] = (0.5, 0.2)
    tile_size: int = 4096


def sparse_tensor(numel: int, dtype: torch.dtype, density: float, device) -> torch.Tensor:
    """``numel`` elements of ``dtype``, a ``density`` share of them nonzero (positive), the rest zero; seeded."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(numel, device=device, generator=g) + 0.01
    keep = torch.rand(numel, device=device, generator=g) < density
    return torch.where(keep, x, 0.0).to(dtype)


def run_kernels(cfg: KernelBenchConfig, device: torch.device) -> dict:
    import triton.testing

    from actzip_bench.harness import copy_bandwidth, machine_record
    from actzip.kernels import sparse as K
    from actzip.kernels import sparse_encode as E

    bw = copy_bandwidth(device)
    decoder = inspect.signature(K.decompress).parameters["variant"].default  # what every row's decode ran
    rows = []
    for dname in cfg.dtypes:
        dtype = getattr(torch, dname)
        for density in cfg.densities:
            x = sparse_tensor(cfg.numel, dtype, density, device)
            bits = x.view(bit_view_dtype(dtype))
            n = bits.numel()
            for sign_pack in (False, True):
                c = E.encode(bits, cfg.tile_size, sign_pack)
                payload = c.mask.numel() + 4 * c.tile_offsets.numel() + c.values.numel() * c.values.element_size()
                dense = n * x.element_size()

                one_pass = torch.empty(E.values_capacity(n, cfg.tile_size, dtype, sign_pack), dtype=c.values.dtype,
                                       device=device)

                def enc():
                    E.encode(bits, cfg.tile_size, sign_pack, values=one_pass)

                def enc1():
                    E.encode(x, cfg.tile_size, sign_pack, values=one_pass, passes=1)

                def dec():
                    K.decompress(c.mask, c.tile_offsets, c.values, n, dtype, cfg.tile_size, sign_pack)

                variants = {"enc": enc, "dec": dec}
                out = K.decompress(c.mask, c.tile_offsets, c.values, n, dtype, cfg.tile_size, sign_pack)
                exact = bool(torch.equal(out, bits))
                if not sign_pack:  # the single-pass encoder does not sign-pack
                    variants["enc1"] = enc1
                    e1 = E.encode(x, cfg.tile_size, sign_pack, values=one_pass, passes=1)
                    exact = exact and bool(torch.equal(one_pass[: c.values.numel()], c.values))
                    exact = exact and bool(torch.equal(e1.mask, c.mask) and torch.equal(e1.tile_offsets, c.tile_offsets))
                if x.element_size() == 2 and not sign_pack:
                    h = torch.where(x != 0, x, -x.abs() - 1)  # same density; negatives where x is zero
                    # the fused MLP's encoder: relu(h) encoded, relu(h)² written, one or two passes over h
                    variants["relu2"] = lambda: E.encode(h, cfg.tile_size, relu=True, act="relu2", values=one_pass)
                    variants["relu2_1"] = lambda: E.encode(h, cfg.tile_size, relu=True, act="relu2", values=one_pass,
                                                           passes=1)
                timed = {}
                for _ in range(2):  # interleaved: each variant twice, the best median kept
                    for key, fn in variants.items():
                        t = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") / 1e3
                        timed[key] = min(t, timed.get(key, t))
                moved = dense + payload
                moved_relu = 2 * dense + payload  # h read, relu(h)² written, the payload written

                def frac(key, nbytes):
                    return nbytes / timed[key] / bw if key in timed else None

                rows.append({
                    "dtype": dname, "density": density, "sign_pack": sign_pack, "numel": n, "exact": exact,
                    "payload_bytes": payload, "dense_bytes": dense, "decoder": decoder,
                    "encode_s": timed["enc"], "decode_s": timed["dec"],
                    "encode_bw": moved / timed["enc"], "decode_bw": moved / timed["dec"],
                    "encode_frac_copy": frac("enc", moved), "decode_frac_copy": frac("dec", moved),
                    "encode_single_pass_s": timed.get("enc1"), "encode_single_pass_frac_copy": frac("enc1", moved),
                    "encode_relu2_s": timed.get("relu2"), "encode_relu2_frac_copy": frac("relu2", moved_relu),
                    "encode_relu2_single_pass_s": timed.get("relu2_1"),
                    "encode_relu2_single_pass_frac_copy": frac("relu2_1", moved_relu),
                })
                del c, out, one_pass
            del x, bits
    return {"config": asdict(cfg), "copy_bandwidth": bw, "runs": rows, "machine": machine_record(device)}
