"""What the lossy codec tests share: inputs of every kind and magnitude, and the groups they are checked in."""

import math

import torch
from hypothesis import strategies as st

from actzip.core.layout import memory_order

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


QUANT_CONFIGS = [
    (bits, scale, rounding)
    for bits in (1, 2, 4, 8)
    for scale in ("minmax", "absmax")
    for rounding in ("stochastic", "nearest")
    if not (bits == 1 and scale == "absmax")
]


FP8_MANTISSA = {"e4m3": 3, "e5m2": 2}


FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def work_eps(dtype):
    return torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps


def grouped(x, group_size):
    """x's elements in memory order as float64 (groups, group_size), padded with the last element."""
    flat = memory_order(x)[0].double()
    pad = -flat.numel() % group_size
    if pad:
        flat = torch.cat([flat, flat[-1:].expand(pad)])
    return flat.view(-1, group_size)


def make_input(shape, dtype, kind, log_mag, g):
    n = math.prod(shape)
    if kind == "normal":
        x = torch.randn(n, generator=g, dtype=torch.float64)
    elif kind == "uniform":
        x = torch.rand(n, generator=g, dtype=torch.float64) + 3.0  # all positive, away from zero
    elif kind == "constant":
        x = torch.full((n,), -1.7, dtype=torch.float64)
    elif kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
    else:  # "mixed": runs of constants between random values
        x = torch.randn(n, generator=g, dtype=torch.float64)
        x[: n // 2] = 0.25
    return (x * 10.0**log_mag).to(dtype).reshape(shape)


def with_layout(x, layout):
    if layout == "transposed" and x.dim() >= 2:
        return x.transpose(0, -1).contiguous().transpose(0, -1)
    return x


shapes = st.lists(st.integers(1, 37), min_size=0, max_size=3).map(tuple)


def log_magnitudes(dtype):
    # Keep max - min and the scaled steps inside each dtype's range (fp16 tops out at 65504).
    return st.sampled_from([-3, 0, 3] if dtype == torch.float16 else [-30, -3, 0, 3, 30])
