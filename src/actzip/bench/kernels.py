"""Sparse-codec kernel throughput as a fraction of the device's measured copy bandwidth.

For each dtype, density and packing: the encode (count pass, device scan, compact pass into a preallocated
buffer: the arena path, no host synchronization) and the decode, timed with ``triton.testing.do_bench``
(median). Throughput counts the fewest bytes each must move: encode reads the tensor and writes the payload,
decode reads the payload and writes the tensor. The copy bandwidth (bytes read + written by a large
device-to-device copy) is measured in the same run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from actzip.core.dtypes import bit_view_dtype


@dataclass
class KernelBenchConfig:
    numel: int = 1 << 28  # elements per tensor (256M: far larger than the L2 cache)
    dtypes: tuple[str, ...] = ("bfloat16", "float8_e4m3fn", "float32")
    densities: tuple[float, ...] = (0.5, 0.2)
    tile_size: int = 4096


def _tensor(numel: int, dtype: torch.dtype, density: float, device) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(numel, device=device, generator=g) + 0.01
    keep = torch.rand(numel, device=device, generator=g) < density
    return torch.where(keep, x, 0.0).to(dtype)


def run_kernels(cfg: KernelBenchConfig, device: torch.device) -> dict:
    import triton.testing

    from actzip.bench.harness import copy_bandwidth, machine_record
    from actzip.kernels import sparse_triton as K

    bw = copy_bandwidth(device)
    rows = []
    for dname in cfg.dtypes:
        dtype = getattr(torch, dname)
        for density in cfg.densities:
            x = _tensor(cfg.numel, dtype, density, device)
            bits = x.view(bit_view_dtype(dtype))
            n = bits.numel()
            for sign_pack in (False, True):
                c = K.compress(bits, n, cfg.tile_size, sign_pack)
                values = torch.empty_like(c.values)
                payload = c.mask.numel() + 4 * c.tile_offsets.numel() + c.values.numel() * c.values.element_size()
                dense = n * x.element_size()

                def enc():
                    K.compress(bits, n, cfg.tile_size, sign_pack, values=values)

                def dec():
                    K.decompress(c.mask, c.tile_offsets, c.values, n, dtype, cfg.tile_size, sign_pack)

                out = K.decompress(c.mask, c.tile_offsets, c.values, n, dtype, cfg.tile_size, sign_pack)
                exact = bool(torch.equal(out, bits))
                t_enc = triton.testing.do_bench(enc, warmup=50, rep=300, return_mode="median") / 1e3
                t_dec = triton.testing.do_bench(dec, warmup=50, rep=300, return_mode="median") / 1e3
                moved = dense + payload
                rows.append({
                    "dtype": dname, "density": density, "sign_pack": sign_pack, "numel": n, "exact": exact,
                    "payload_bytes": payload, "dense_bytes": dense,
                    "encode_s": t_enc, "decode_s": t_dec,
                    "encode_bw": moved / t_enc, "decode_bw": moved / t_dec,
                    "encode_frac_copy": moved / t_enc / bw, "decode_frac_copy": moved / t_dec / bw,
                })
                del values, c, out
            del x, bits
    return {"config": asdict(cfg), "copy_bandwidth": bw, "runs": rows, "machine": machine_record(device)}
