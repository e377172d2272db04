"""The arena: device-side reservations, refusal without data loss, sizing from the high-water mark."""

import pytest
import torch

from actzip.core.errors import ConfigError
from actzip.memory.arena import ALIGN, Arena

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def t(n, device):
    return torch.tensor([n], dtype=torch.int64, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_reservations_are_aligned_and_sequential(device):
    arena = Arena(1000, device=device)
    assert arena.capacity_bytes == 1008
    a, b = arena.reserve(t(5, device)), arena.reserve(t(100, device))
    assert int(a.start) == 0 and int(b.start) == ALIGN
    assert a.fits() and b.fits()
    assert arena.used_bytes() == ALIGN + 112


@pytest.mark.parametrize("device", DEVICES)
def test_refused_reservation_leaves_room_for_later_ones(device):
    arena = Arena(256, device=device)
    big = arena.reserve(t(300, device))
    small = arena.reserve(t(64, device))
    assert not big.fits() and small.fits()
    assert int(small.start) == 0
    assert arena.overflows() == 1
    assert arena.high_water_bytes() == 304 + 64


@pytest.mark.parametrize("device", DEVICES)
def test_fit_sizes_from_high_water_with_margin_and_reset(device):
    arena = Arena(device=device, margin=1.5)
    assert arena.capacity_bytes == 0
    assert not arena.reserve(t(1000, device)).fits()  # unsized: refused, but measured
    arena.reset()
    assert arena.fit() == 1520  # 1008 * 1.5 = 1512, aligned up to 16
    assert arena.reserve(t(1000, device)).fits()
    arena.reset()
    assert arena.used_bytes() == 0


def test_bad_options():
    with pytest.raises(ConfigError, match="margin"):
        Arena(device="cpu", margin=0.5)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        Arena(-1, device="cpu")
