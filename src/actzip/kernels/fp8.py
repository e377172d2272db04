"""Triton kernels of the ``fp8`` codec (the format is in :mod:`actzip.codecs.fp8`).

They share the tile layout, the launch shapes and the device helpers of :mod:`actzip.kernels.quant_tiles` (its
docstring describes them): per group, rows are groups, padded like the quant kernel; with one scale per tensor
the tensor's absmax is first reduced with ``torch.aminmax`` on the device, then the same kernel runs on rows of
:data:`ROW` elements. fp8 codes are made and read with integer operations that mirror PyTorch's conversions.
No host synchronization.
"""

from __future__ import annotations

import math

import torch

from actzip.errors import ConfigError
from actzip.kernels.quant_bits import FP8_LAYOUT, fp8_round, fp8_round_stochastic, fp8_scale, fp8_value
from actzip.kernels.quant_tiles import (
    bcast_rows,
    check_group_size,
    check_input,
    check_size,
    geometry,
    launch_options,
    load_tile,
    new_output,
    random_bits,
    row_params,
    row_reduce,
    signed_key,
    store_f32,
    tile_elements,
    widen,
)
from actzip.kernels.runtime import missing_triton

try:  # Triton is optional: the kernels need it, the rest of actzip does not
    import triton
    import triton.language as tl
except ImportError as e:
    raise missing_triton(e) from e

ROW = 1024  # one scale per tensor: elements per row of a tile


@triton.jit(do_not_specialize=["key0", "key1"])
def fp8_encode_kernel(
    x_ptr, codes_ptr, scale_ptr, amax_ptr, n, n_rows, key0, key1,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, MBITS: tl.constexpr,
    BIAS: tl.constexpr, TOP_E: tl.constexpr, TOP_FRAC: tl.constexpr, STOCHASTIC: tl.constexpr,
    IN_BF16: tl.constexpr, TENSOR: tl.constexpr, WIDE: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """fp8 codes and scales of ``BG`` rows. Oracle: ``FP8Codec._encode_torch`` (``check=False``).

    Per group (``TENSOR`` false): rows are groups, padded like the quant kernel. One scale for the tensor
    (``TENSOR``): rows are ``G``-element slices of it, ``amax_ptr`` holds its absmax, program 0 stores the scale.
    """
    start, offs, _, chunk_ok = tile_elements(G, NS, BG, CP, K)
    xb = load_tile(x_ptr, start, offs, n, NS * BG * CP * K)
    x = widen(xb, IN_BF16, HW)
    sp, row_ok = row_params(scale_ptr, n_rows, BG)
    if TENSOR:
        am = tl.load(amax_ptr + tl.arange(0, BG) * 0)  # the tensor's absmax on every row
    else:
        am = row_reduce(tl.abs(x if IN_BF16 else xb), True).to(tl.float32)
    ok = am < float("inf")  # false for inf and NaN
    scale = fp8_scale(tl.where(ok, am, 0.0), TOP_E, TOP_FRAC)
    # x / scale, correctly rounded, as two multiplications by powers of two (the first exact: no inf on the way).
    pre = tl.where(scale < 5.421010862427522e-20, 1.8446744073709552e19, 1.0)
    t = (x * bcast_rows(pre)) * bcast_rows(tl.div_rn(tl.full((BG,), 1.0, tl.float32), scale * pre))
    tb = t.to(tl.int32, bitcast=True)
    mb = tb & 0x7FFFFFFF
    if STOCHASTIC:
        code = fp8_round_stochastic(mb, random_bits(start, offs, key0, key1, NS, BG, CP, K, WIDE), MBITS, BIAS)
    else:
        code = fp8_round(mb, MBITS, BIAS)
    code = tl.where(bcast_rows(ok), code | ((tb >> 24) & 0x80), 0)
    if TENSOR:
        lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
        tl.store(codes_ptr + start + offs, code.to(tl.uint8), mask=offs < lim)
        if tl.program_id(0) == 0:
            tl.store(scale_ptr + tl.arange(0, BG) * 0, tl.where(ok, scale, float("nan")), mask=tl.arange(0, BG) == 0)
    else:
        tl.store(codes_ptr + start + offs, code.to(tl.uint8), mask=bcast_rows(row_ok) & chunk_ok[:, :, :, None])
        tl.store(sp, tl.where(ok, scale, float("nan")), mask=row_ok)


@triton.jit
def fp8_decode_kernel(
    codes_ptr, scale_ptr, out_ptr, n, n_rows,
    G: tl.constexpr, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr, K: tl.constexpr, MBITS: tl.constexpr,
    BIAS: tl.constexpr, BIG: tl.constexpr, OUT_BF16: tl.constexpr, TENSOR: tl.constexpr, HW: tl.constexpr,
):  # fmt: skip
    """Elements ``< n``: code value times scale, clamped to the dtype's range. Oracle: ``FP8Codec.decode``."""
    start, offs, _, chunk_ok = tile_elements(G, NS, BG, CP, K)
    lim = tl.minimum(n - start, 1 << 30).to(tl.int32)
    valid = (offs < lim) & chunk_ok[:, :, :, None]
    c = tl.load(codes_ptr + start + offs, mask=valid, other=0).to(tl.int32)
    v = fp8_value(c, MBITS, BIAS)  # signed: the sign bit is moved, not negated (-0.0 stays -0.0)
    if TENSOR:
        sc = tl.load(scale_ptr + tl.arange(0, BG) * 0)
    else:
        sp, row_ok = row_params(scale_ptr, n_rows, BG)
        sc = tl.load(sp, mask=row_ok, other=1.0)
    y = v * bcast_rows(sc)
    y = tl.minimum(tl.maximum(y, -BIG, propagate_nan=tl.PropagateNan.ALL), BIG, propagate_nan=tl.PropagateNan.ALL)
    store_f32(out_ptr + start, offs, y, valid, OUT_BF16, HW)


def _fp8_constants(fmt: str) -> dict:
    try:
        mbits, bias, _ = FP8_LAYOUT[fmt]
    except KeyError:
        raise ConfigError(f"fp8 Triton kernels: format must be one of {', '.join(map(repr, FP8_LAYOUT))}") from None
    return {"MBITS": mbits, "BIAS": bias}


def fp8_encode(
    flat: torch.Tensor, fmt: str, group_size: int | None, stochastic: bool, keys: tuple[int, int] = (0, 0),
    *, tile: int | None = None, warps: int | None = None, group_threads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The ``fp8`` payload buffers ``(codes, scale)`` of ``flat`` (contiguous 1-D), one scale per
    ``group_size`` elements or, with ``None``, per tensor. Non-finite groups: zero codes, NaN scale.
    ``tile``, ``warps``, ``group_threads``: as for :func:`actzip.kernels.quant.quant_encode`. No host synchronization."""
    x, in_bf16, _ = check_input(flat)
    consts = _fp8_constants(fmt)
    top_m, top_e = math.frexp(FP8_LAYOUT[fmt][2])
    n = flat.numel()
    dev = flat.device
    if group_size is None:
        if n == 0:
            return torch.empty(0, dtype=torch.uint8, device=dev), torch.empty(0, dtype=torch.float32, device=dev)
        lo, hi = torch.aminmax(flat)  # exact in any float dtype; NaN propagates
        amax = torch.maximum(hi, -lo).to(torch.float32).reshape(1)
        g, n_rows = ROW, -(-n // ROW)
        codes = torch.empty(n, dtype=torch.uint8, device=dev)
        scale = torch.empty(1, dtype=torch.float32, device=dev)
    else:
        g = check_group_size(group_size)
        n_rows = -(-n // g)
        codes = torch.empty(n_rows * g, dtype=torch.uint8, device=dev)
        scale = amax = torch.empty(n_rows, dtype=torch.float32, device=dev)
    if n_rows:
        geo = geometry(g, flat.element_size(), 8, tile, ROW if group_size is None else group_threads, warps)
        grid, opts = launch_options(geo, n_rows, n_rows * g)
        fp8_encode_kernel[grid](
            x, codes, scale, amax, n, n_rows, signed_key(keys[0]), signed_key(keys[1]),
            TOP_E=top_e, TOP_FRAC=int((2 * top_m - 1) * 2**23), STOCHASTIC=stochastic, IN_BF16=in_bf16,
            TENSOR=group_size is None, **geo, **consts, **opts,
        )  # fmt: skip
    return codes, scale


def fp8_decode(
    codes: torch.Tensor, scale: torch.Tensor, n: int, dtype: torch.dtype, fmt: str, group_size: int | None,
    *, tile: int | None = None, warps: int | None = None, group_threads: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """The first ``n`` elements (1-D, ``dtype``) of an ``fp8`` payload; ``group_size=None``: one scale.
    ``tile``, ``warps``, ``group_threads``: as for :func:`actzip.kernels.quant.quant_encode`. No host synchronization."""
    consts = _fp8_constants(fmt)
    out, out_k, out_bf16 = new_output(n, dtype, codes.device)
    g = ROW if group_size is None else check_group_size(group_size)
    n_rows = -(-n // g)
    check_size("codes", codes, n if group_size is None else n_rows * g)
    check_size("scale", scale, 1 if group_size is None and n else n_rows)
    if n_rows:
        geo = geometry(g, out.element_size(), 8, tile, ROW if group_size is None else group_threads, warps)
        grid, opts = launch_options(geo, n_rows, n_rows * g)
        opts.pop("WIDE")
        fp8_decode_kernel[grid](
            codes, scale, out_k, n, n_rows, BIG=torch.finfo(dtype).max, OUT_BF16=out_bf16,
            TENSOR=group_size is None, **geo, **consts, **opts,
        )  # fmt: skip
    return out
