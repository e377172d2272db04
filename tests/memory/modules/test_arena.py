"""The arena: device-side reservations, refusal without data loss, sizing from the high-water mark, the
per-step overflow flag a fused optimizer reads as found_inf."""

import pytest
import torch

from actzip.errors import ConfigError
from actzip.memory.modules.arena import ALIGN, SETTLE_STEPS, SETTLED_MARGIN, WARMUP_MARGIN, Arena

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


@pytest.mark.parametrize("device", DEVICES)
def test_an_adaptive_arena_settles_tight_and_grows_again_without_losing_a_payload(device):
    arena = Arena(device=device, margin="adaptive")
    sizes = [10_000, 9_600, 10_400, 9_800]  # bytes per step, moving a little as training does

    def step(i, extra=0):
        arena.reset()
        r = arena.reserve(t(sizes[i % len(sizes)] + extra, device))
        if device == "cuda":
            torch.cuda.synchronize()
        return r.fits()

    assert not step(0)  # unsized: refused and measured
    assert arena.fit() >= WARMUP_MARGIN * sizes[0]
    fits = [step(i) for i in range(1, SETTLE_STEPS + 3)]
    assert all(fits)
    arena.reset()  # notes the last step; with the counters on the host, the arena settles and shrinks
    if device == "cuda":
        torch.cuda.synchronize()
        arena.reset()
    assert arena.settled and arena.shrinks >= 1
    held = arena.capacity_bytes
    assert max(sizes) <= held <= SETTLED_MARGIN * max(sizes) + 2 * ALIGN
    overflows = arena.overflows()
    assert not step(0, extra=2_000)  # a larger step is refused (its owner recomputes), counted, and the arena grows
    assert arena.overflows() == overflows + 1
    arena.reset()
    assert arena.fit() <= SETTLED_MARGIN * arena.high_water_bytes() + ALIGN
    assert step(0, extra=2_000)


@pytest.mark.parametrize("device", DEVICES)
def test_step_overflow_flag_counts_this_step_and_reset_clears_it(device):
    arena = Arena(256, device=device)
    flag = arena.step_overflow
    assert flag.dtype == torch.float32 and flag.dim() == 0 and flag.device == arena.counters.device  # like found_inf
    assert arena.reserve(t(64, device)).fits() and float(flag) == 0.0
    assert not arena.reserve(t(300, device)).fits()
    assert not arena.reserve(t(300, device)).fits()
    assert float(flag) == 1.0 and arena.step_overflows() == 2 and arena.overflows() == 2
    arena.reset()
    assert float(flag) == 0.0 and arena.step_overflows() == 0
    assert arena.overflows() == 2 and arena.high_water_bytes() == 64 + 2 * 304  # kept across steps
    assert arena.reserve(t(64, device)).fits() and float(flag) == 0.0


@pytest.mark.parametrize("device", DEVICES)
def test_fused_adamw_skips_the_step_on_the_flag(device):
    arena = Arena(64, device=device)
    p = torch.nn.Parameter(torch.ones(4, device=device))
    opt = torch.optim.AdamW([p], lr=0.1, fused=True)
    opt.found_inf = arena.step_overflow
    p.grad = torch.ones_like(p)
    opt.step()
    before, steps = p.detach().clone(), opt.state[p]["step"].clone()
    arena.reserve(t(100, device))  # refused: the next optimizer step is skipped
    opt.step()
    assert torch.equal(p.detach(), before) and torch.equal(opt.state[p]["step"], steps)
    arena.reset()
    opt.step()
    assert not torch.equal(p.detach(), before)


@pytest.mark.parametrize("device", DEVICES)
def test_capturable_reservations_stay_on_the_device(device):
    plain, capturable = Arena(256, device=device), Arena(256, device=device, capturable=True)
    assert not plain.device_policy() and capturable.device_policy()
    assert not plain.reserve(t(16, device)).device_only
    res = capturable.reserve(t(16, device))
    assert res.device_only and res._event is None and res._host_ok is None  # nothing sent to the host
    assert res.fits()  # still answers between steps (a synchronization)


def test_bad_options():
    with pytest.raises(ConfigError, match="margin"):
        Arena(device="cpu", margin=0.5)
    with pytest.raises(ConfigError, match="'adaptive'"):
        Arena(device="cpu", margin="tight")
    with pytest.raises(ConfigError, match="capacity_bytes"):
        Arena(-1, device="cpu")
    with pytest.raises(ConfigError, match="capturable"):
        Arena(device="cpu", capturable="yes")


def test_graphed_step_options():
    from actzip.memory.modules.arena import GraphedStep

    arena = Arena(device="cpu")
    with pytest.raises(ConfigError, match="warmup"):
        GraphedStep(lambda: None, arena, warmup=0)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(ConfigError, match="optimizer must take found_inf"):
        GraphedStep(lambda: None, arena, sgd)
    with pytest.raises(ConfigError, match="arena must be on a CUDA device"):
        GraphedStep(lambda: None, arena)
