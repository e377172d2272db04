"""Quant / fp8 kernel throughput as a fraction of the device's measured copy bandwidth.

For each dtype and codec variant: the encode kernel (group reduction, rounding and bit packing in one launch;
for fp8 with one scale per tensor also the device-side absmax) and the decode kernel, timed with
``triton.testing.do_bench`` (median), no host synchronization inside either. Throughput counts the fewest bytes
each must move: encode reads the tensor and writes the payload, decode reads the payload and writes the
tensor. The copy bandwidth (bytes read + written by a large device-to-device copy) is measured in the same run.

Each variant is also checked against the PyTorch codec (``kernel="torch"``) on a smaller tensor: identical
payload buffers and decoded bits (``exact``), and the PyTorch code's own throughput there, for comparison.

The launch-shape sweep (``sweep`` in the record) times the quant kernels themselves
(:func:`actzip.kernels.quant.quant_encode` / ``quant_decode``) for each of ``sweep_variants`` on a
``sweep_dtype`` tensor at each ``(tile, warps, group_threads)`` of ``sweep``, each as a fraction of the same
copy bandwidth, and checks that every shape writes the same bytes as the default one (``same_bytes``).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from actzip.errors import ConfigError

# Variant name -> (codec, options). Stochastic rounding is what the cache presets use for linear inputs.
VARIANTS: dict[str, tuple[str, dict]] = {
    "quant4-sr": ("quant", {"bits": 4}),
    "quant4-rn": ("quant", {"bits": 4, "rounding": "nearest"}),
    "quant4-absmax-sr": ("quant", {"bits": 4, "scale": "absmax"}),
    "quant8-rn": ("quant", {"bits": 8, "rounding": "nearest"}),
    "quant8-sr": ("quant", {"bits": 8}),
    "quant2-sr": ("quant", {"bits": 2}),
    "quant1-sr": ("quant", {"bits": 1}),
    "fp8-e4m3-tensor": ("fp8", {"format": "e4m3"}),
    "fp8-e4m3-group-sr": ("fp8", {"format": "e4m3", "granularity": "group", "rounding": "stochastic"}),
    "fp8-e5m2-group": ("fp8", {"format": "e5m2", "granularity": "group"}),
}


@dataclass
class QuantKernelBenchConfig:
    numel: int = 1 << 28  # elements per timed tensor (256M: far larger than the L2 cache)
    check_numel: int = 1 << 22  # elements of the tensor checked against (and timed with) the PyTorch codec
    dtypes: tuple[str, ...] = ("bfloat16", "float32")  # tensor dtypes
    variants: tuple[str, ...] = tuple(VARIANTS)  # keys of VARIANTS
    group_size: int = 128  # elements per group (quant, and fp8 with granularity="group")
    # Launch shapes: (elements per program, warps, threads per group) for these quant variants on this dtype
    # (see actzip.kernels.quant_tiles.geometry: threads per group rise to fill the program when needed).
    sweep_variants: tuple[str, ...] = ("quant4-sr", "quant4-rn", "quant8-sr", "quant8-rn")
    sweep_dtype: str = "bfloat16"
    sweep: tuple[tuple[int, int, int], ...] = (
        (2048, 1, 32), (2048, 2, 32), (2048, 2, 4), (4096, 4, 4), (4096, 4, 32), (8192, 2, 16), (16384, 4, 16),
    )  # fmt: skip

    def __post_init__(self) -> None:
        unknown = [v for v in (*self.variants, *self.sweep_variants) if v not in VARIANTS]
        if unknown:
            raise ConfigError(f"unknown variant(s) {', '.join(unknown)}; variants: {', '.join(VARIANTS)}")
        not_quant = [v for v in self.sweep_variants if VARIANTS[v][0] != "quant"]
        if not_quant:
            raise ConfigError(f"sweep_variants must be quant variants, got {', '.join(not_quant)}")
        if self.numel < 1 or self.check_numel < 1:
            raise ConfigError(f"numel and check_numel must be >= 1, got {self.numel} and {self.check_numel}")
        for shape in self.sweep:
            if len(shape) != 3 or any(not isinstance(v, int) or v < 1 or v & (v - 1) for v in shape):
                raise ConfigError(f"sweep entries are (tile, warps, group_threads), powers of two; got {shape!r}")


def _codecs(variant: str, group_size: int):
    from actzip.core import registry

    name, options = VARIANTS[variant]
    options = {**options, "group_size": group_size, "check": False}
    return registry.get(name, kernel="triton", **options), registry.get(name, kernel="torch", **options)


def _exact(tri, ref, x: torch.Tensor) -> bool:
    # Fresh codecs: a stochastic codec's random stream moves on with each encode, so timed ones have drifted apart.
    p_tri, p_ref = tri.encode(x), ref.encode(x)
    same = all(
        torch.equal(p_tri.buffers[k].view(torch.uint8), p_ref.buffers[k].view(torch.uint8)) for k in p_ref.buffers
    )
    y_tri, y_ref = tri.decode(p_ref), ref.decode(p_ref)
    return same and torch.equal(y_tri.view(torch.uint8), y_ref.view(torch.uint8))


def _time(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") / 1e3


def _encode_decode_times(codec, x: torch.Tensor) -> tuple[float, float, int]:
    """Median encode and decode seconds of ``codec`` on ``x``, and its payload's bytes."""
    p = codec.encode(x)
    return _time(lambda: codec.encode(x)), _time(lambda: codec.decode(p)), p.nbytes


def _sweep_decode(buf: dict, n: int, dtype: torch.dtype, args: tuple, shape: dict | None = None) -> torch.Tensor:
    from actzip.kernels import quant as K

    bits, group_size, absmax = args[:3]
    params = (buf["absmax"], None) if absmax else (buf["lo"], buf["span"])
    return K.quant_decode(buf["codes"], *params, n, dtype, bits, group_size, absmax, **(shape or {}))


def _sweep(cfg: QuantKernelBenchConfig, device: torch.device, bw: float) -> list[dict]:
    """Encode/decode throughput of the quant kernels per launch shape (see the module docstring)."""
    from actzip.kernels import quant as K

    dtype = getattr(torch, cfg.sweep_dtype)
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(cfg.numel, device=device, generator=g).to(dtype)
    small = torch.randn(cfg.check_numel, device=device, generator=g).to(dtype)
    dense = x.numel() * x.element_size()
    rows = []
    for variant in cfg.sweep_variants:
        opts = VARIANTS[variant][1]
        bits, absmax = opts.get("bits", 4), opts.get("scale", "minmax") == "absmax"
        stochastic = opts.get("rounding", "stochastic") == "stochastic"
        args = (bits, cfg.group_size, absmax, stochastic, (12345, 67890))

        ref = K.quant_encode(small, *args)
        ref_y = _sweep_decode(ref, small.numel(), dtype, args)
        for tile, warps, lanes in cfg.sweep:
            shape = {"tile": tile, "warps": warps, "group_threads": lanes}
            buf = K.quant_encode(small, *args, **shape)
            same = all(torch.equal(buf[k].view(torch.uint8), ref[k].view(torch.uint8)) for k in ref)
            y = _sweep_decode(ref, small.numel(), dtype, args, shape)
            same = same and torch.equal(y.view(torch.uint8), ref_y.view(torch.uint8))
            buf = K.quant_encode(x, *args, **shape)
            moved = dense + sum(t.numel() * t.element_size() for t in buf.values())
            t_enc = _time(functools.partial(K.quant_encode, x, *args, **shape))
            t_dec = _time(functools.partial(_sweep_decode, buf, x.numel(), dtype, args, shape))
            rows.append({
                "dtype": cfg.sweep_dtype, "variant": variant, "tile": tile, "warps": warps, "group_threads": lanes,
                "same_bytes": same, "encode_s": t_enc, "decode_s": t_dec,
                "encode_frac_copy": moved / t_enc / bw, "decode_frac_copy": moved / t_dec / bw,
            })  # fmt: skip
    return rows


def run_quant_kernels(cfg: QuantKernelBenchConfig, device: torch.device) -> dict:
    from actzip_bench.harness import copy_bandwidth, machine_record

    bw = copy_bandwidth(device)
    rows = []
    for dname in cfg.dtypes:
        dtype = getattr(torch, dname)
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(cfg.numel, device=device, generator=g).to(dtype)
        small = torch.randn(cfg.check_numel, device=device, generator=g).to(dtype)
        dense, small_dense = x.numel() * x.element_size(), small.numel() * small.element_size()
        for variant in cfg.variants:
            tri, ref = _codecs(variant, cfg.group_size)
            t_enc, t_dec, payload = _encode_decode_times(tri, x)
            t_ref_enc, t_ref_dec, small_payload = _encode_decode_times(ref, small)
            moved, small_moved = dense + payload, small_dense + small_payload
            exact = _exact(*_codecs(variant, cfg.group_size), small)
            rows.append({
                "dtype": dname, "variant": variant, "numel": x.numel(), "exact": exact,
                "payload_bytes": payload, "dense_bytes": dense, "ratio": dense / payload,
                "encode_s": t_enc, "decode_s": t_dec,
                "encode_bw": moved / t_enc, "decode_bw": moved / t_dec,
                "encode_frac_copy": moved / t_enc / bw, "decode_frac_copy": moved / t_dec / bw,
                "torch_encode_bw": small_moved / t_ref_enc, "torch_decode_bw": small_moved / t_ref_dec,
            })  # fmt: skip
        del x, small
    sweep = _sweep(cfg, device, bw) if cfg.sweep else []
    record = {"config": asdict(cfg), "copy_bandwidth": bw, "runs": rows, "sweep": sweep}
    return {**record, "machine": machine_record(device)}
