"""The unit Gaussian's Lloyd-Max levels with one least-squares scale a group: the stated guarantee (a group never
left with more than its energy), the tables' figures on Gaussian values, and the packed round trip."""

import pytest
import torch

from actzip.codecs.gaussian_levels import (
    LEVEL_BITS,
    column_errors,
    decode_levels,
    encode_levels,
    level_table,
    levels_cost_bits,
)

# Max (1960): the mean squared error of a unit Gaussian on the optimal levels
MAX_ERROR = {1: 0.3634, 2: 0.1175, 4: 0.009497}


@pytest.mark.parametrize("bits", LEVEL_BITS)
def test_gaussian_values_leave_max_s_error_and_the_tables_are_symmetric(bits):
    table = level_table(bits, torch.float64)
    assert table.numel() == 2**bits and torch.equal(table, -table.flip(0)) and bool((table.diff() > 0).all())
    x = torch.randn(400_000, generator=torch.Generator().manual_seed(bits), dtype=torch.float64)
    codes, scales = encode_levels(x, bits, 4096)
    y = decode_levels(codes, scales, x.numel(), bits, 4096, torch.float64)
    assert (y - x).square().mean().item() == pytest.approx(MAX_ERROR[bits], rel=0.03)


@pytest.mark.parametrize("seed", range(20))
def test_a_group_is_never_left_with_more_than_its_energy(seed):
    g = torch.Generator().manual_seed(seed)
    n, group = int(torch.randint(1, 700, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g)) * 8
    kind = seed % 4  # heavy tails, one-signed, a constant offset, mostly zeros
    x = torch.randn(n, generator=g, dtype=torch.float64)
    x = [x**5, x.abs() + 3.0, x + 10.0, x * (torch.rand(n, generator=g, dtype=torch.float64) < 0.05)][kind]
    for bits in LEVEL_BITS:
        codes, scales = encode_levels(x, bits, group)
        assert codes.dtype == torch.uint8 and codes.numel() == -(-n * bits // 8)
        assert scales.dtype == torch.float32 and scales.numel() == -(-n // group)
        y = decode_levels(codes, scales, n, bits, group, torch.float64)
        padded = torch.cat([x, x.new_zeros(-n % group)]).reshape(-1, group)
        err = torch.cat([y - x, x.new_zeros(-n % group)]).reshape(-1, group).square().sum(1)
        assert bool((err <= padded.square().sum(1) * (1 + 1e-6) + 1e-12).all())
        assert levels_cost_bits(n, group, bits) == codes.numel() * 8 + scales.numel() * 32


def test_column_errors_are_each_column_coded_alone():
    c = torch.randn(96, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * torch.arange(1, 6)
    errors = column_errors(c)
    assert errors.shape == (len(LEVEL_BITS), 5)
    for i, bits in enumerate(LEVEL_BITS):
        for j in range(5):
            codes, scales = encode_levels(c[:, j], bits, 96)
            y = decode_levels(codes, scales, 96, bits, 96, torch.float64)
            assert errors[i, j].item() == pytest.approx((y - c[:, j]).square().sum().item(), rel=1e-6)
    zero = column_errors(torch.zeros(8, 3, dtype=torch.float64))
    assert torch.equal(zero, torch.zeros_like(zero))  # an all-zero group decodes to zeros
