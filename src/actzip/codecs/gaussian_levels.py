"""Codes on the Lloyd–Max levels of a unit Gaussian, one least-squares scale a group: the ``dct`` codec's
``levels="fitted"`` coder of a band at 1, 2 or 4 bits a coefficient.

A group of values ``x`` is divided by its root mean square, each value takes the index of the nearest level of
the unit Gaussian's Lloyd–Max quantizer (Max, 1960: the levels that minimise the mean squared error of Gaussian
values, thresholds half-way between them), and the group stores one float32 scale, the least-squares fit of its
values to their levels, ``s = sum(x * l) / sum(l * l)``; it decodes to ``s * l``.

Guarantee: a group's squared error is ``sum(x * x) - sum(x * l) ** 2 / sum(l * l)`` (in exact arithmetic, before
the scale is rounded to float32), never more than its energy, which is the error of sending nothing. Nearest
levels are biased. On Gaussian values the mean squared error is about 0.363, 0.118 and 0.0095 of the variance at
1, 2 and 4 bits, where a min-max uniform grid with nearest rounding, whose steps span the group's extremes, leaves
more (at 1 bit more than the variance itself: two levels at the extremes), for one stored parameter a group
instead of two.
"""

from __future__ import annotations

import functools

import torch

from actzip.codecs.bitpack import pack_bits, unpack_bits

__all__ = ["LEVEL_BITS", "column_errors", "decode_levels", "encode_levels", "level_table", "levels_cost_bits"]

LEVEL_BITS = (1, 2, 4)  # the widths with a table
_POSITIVE = {  # the positive half of each table (Max, 1960), for unit variance
    1: (0.7979,),
    2: (0.4528, 1.5104),
    4: (0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326),
}
SCALE_BITS = 32  # a group's one scale, float32


@functools.lru_cache(maxsize=None)
def _tables(bits: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.tensor(_POSITIVE[bits], dtype=torch.float64)
    levels = torch.cat([-pos.flip(0), pos])
    return levels.to(dtype=dtype, device=device), ((levels[1:] + levels[:-1]) / 2).to(dtype=dtype, device=device)


def level_table(bits: int, dtype: torch.dtype = torch.float32, device="cpu") -> torch.Tensor:
    """The ``2**bits`` levels at ``bits`` (1, 2 or 4), ascending, for unit variance."""
    return _tables(bits, dtype, torch.device(device))[0]


def _grouped(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` flattened into rows of ``group`` values, zero-padded, and the number of real values in each row."""
    flat = x.reshape(-1)
    n = flat.numel()
    rows = -(-n // group)
    padded = torch.zeros(rows * group, dtype=flat.dtype, device=flat.device)
    padded[:n] = flat
    counts = torch.full((rows,), group, dtype=flat.dtype, device=flat.device)
    counts[-1] = n - (rows - 1) * group
    return padded.reshape(rows, group), counts


def _fit(g: torch.Tensor, counts: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of ``g`` (zero-padded past ``counts``): the level indices, the levels (zero where padded) and the
    least-squares scale."""
    levels, thresholds = _tables(bits, g.dtype, g.device)
    rms = (g.square().sum(dim=-1) / counts).sqrt()
    rms = torch.where(rms > 0, rms, torch.ones_like(rms))  # an all-zero group: any level, scale 0
    codes = torch.bucketize(g / rms.unsqueeze(-1), thresholds)
    real = torch.arange(g.shape[-1], device=g.device) < counts.unsqueeze(-1)
    lv = torch.where(real, levels[codes], torch.zeros((), dtype=g.dtype, device=g.device))
    scale = (g * lv).sum(dim=-1) / lv.square().sum(dim=-1).clamp_min(torch.finfo(g.dtype).tiny)
    return codes, lv, scale


def encode_levels(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (float, any shape, read flat) in groups of ``group``: the packed level indices (``bits`` each) and
    each group's float32 scale."""
    g, counts = _grouped(x, group)
    codes, _, scale = _fit(g, counts, bits)
    return pack_bits(codes.reshape(-1)[: x.numel()], bits), scale.to(torch.float32)


def decode_levels(codes: torch.Tensor, scales: torch.Tensor, n: int, bits: int, group: int,
                  dtype: torch.dtype) -> torch.Tensor:
    """The ``n`` values (flat, ``dtype``) of :func:`encode_levels`'s output."""
    index = unpack_bits(codes, n, bits, torch.int64)
    levels = level_table(bits, dtype, codes.device)
    return levels[index] * scales.to(dtype).repeat_interleave(group)[:n]


def levels_cost_bits(n: int, group: int, bits: int) -> int:
    """Payload bits of ``n`` values at ``bits``: the packed indices and a scale per group."""
    return -(-n * bits // 8) * 8 + -(-n // group) * SCALE_BITS


def column_errors(c: torch.Tensor, bits: tuple[int, ...] = LEVEL_BITS) -> torch.Tensor:
    """``[len(bits), columns]``: the squared error each column of ``c`` (``[rows, columns]``, one group a
    column) is left with at each width, summed over its rows."""
    g = c.t().contiguous()
    counts = torch.full((g.shape[0],), g.shape[1], dtype=g.dtype, device=g.device)
    out = []
    for b in bits:
        _, lv, scale = _fit(g, counts, b)
        out.append((g - scale.unsqueeze(-1) * lv).square().sum(dim=-1))
    return torch.stack(out)
