"""The single-pass encoder's super-tile kernel (:mod:`actzip.kernels.sparse_encode_single`, ``encode(...,
passes=1, one_pass=OnePass(...))``), every knob, against the two-pass encoder and the PyTorch codec, bit for bit.

Sizes are drawn per case so that the last tile is partial, a super-tile holds fewer tiles than ``group``, and
the input is not a multiple of a super-tile. Under Triton's interpreter programs run one after another, so a
persistent grid's first program takes every ticket; the CUDA case runs them concurrently.
"""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import sparse_encode as se  # noqa: E402
from actzip.kernels.sparse_encode_single import OnePass, check_one_pass  # noqa: E402
from actzip.memory.modules.arena import Arena  # noqa: E402

from kernel_cases import (  # noqa: E402
    DEVICES, assert_bit_equal, oracle, random_tensor, relu_by_bits, special_values,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py

TILE = 64
# Every knob at least once: groups of 1 to 8 tiles, both grids, rows of 2 to 32, with and without the layout
# hint, look-back windows of 2 to 128, warps given and derived.
VARIANTS = [
    OnePass(),
    OnePass(group=4, row=8, vec=8),
    OnePass(group=2, row=2, vec=2, lookback=2),
    OnePass(group=4, persistent=True, programs_per_sm=3, row=16, vec=16, lookback=4),
    OnePass(group=1, persistent=True, row=4, vec=4, num_warps=2),
    OnePass(group=8, persistent=True, programs_per_sm=1, row=32, vec=1, num_warps=8),
]
IDS = [f"g{v.group}{'p' if v.persistent else ''}-r{v.row}v{v.vec}-lb{v.lookback}" for v in VARIANTS]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn]
# (density, size kind of sizes()) per dtype: every density and kind for every variant, at two or three
# encodes per dtype (the interpreter's time is CI's); several super-tiles and a partial one for every dtype.
PLAN = {torch.float32: [(0.5, 1), (0.0, 2)], torch.float16: [(0.2, 1), (1.0, 0)],
        torch.bfloat16: [(0.5, 1), (0.2, 2), (0.0, 0)], torch.float8_e4m3fn: [(0.2, 1), (1.0, 2)]}


def sizes(group: int, seed: int) -> list[int]:
    """Random sizes (in super-tiles: the interpreter's time goes by programs), one of each kind: fewer tiles
    than a super-tile, the last one partial; a super-tile and a partial one; one or two whole super-tiles;
    one element."""
    g = torch.Generator().manual_seed(seed)

    def r(k: int) -> int:
        return int(torch.randint(1, k, (1,), generator=g))

    unit = group * TILE
    few = (group - 1) * TILE + r(TILE) if group > 1 else r(TILE)
    return [few, unit + r(unit), unit * r(3), 1]


def values_buffer(n, dtype, device, fill=7):
    return torch.full((se.values_capacity(n, TILE, dtype, False) + 9,), fill, dtype=se.bits_dtype(dtype),
                      device=device)  # fmt: skip


_TWO_PASS = {}  # (input key, options) -> the two-pass encode and its values buffer, shared by variants


def check_one(x, key, opt, **kw):
    """The one-pass encode of ``x`` (``key``: what it was made from) with ``opt`` against the two-pass encode
    and the torch codec of what it stores (``relu(x)`` with ``relu=True``); returns both encodes."""
    want = oracle(relu_by_bits(x) if kw.get("relu") else x, TILE, False)
    v1 = values_buffer(x.numel(), x.dtype, x.device)
    one = se.encode(x, TILE, values=v1, passes=1, one_pass=opt, **kw)
    k = (key, x.device.type, tuple(sorted(kw.items())))
    if k not in _TWO_PASS:
        v2 = values_buffer(x.numel(), x.dtype, x.device)
        _TWO_PASS[k] = se.encode(x, TILE, values=v2, passes=2, **kw), v2
    two, v2 = _TWO_PASS[k]
    total = int(one.total)
    assert total == int(two.total) == want.total and int(one.nnz) == int(two.nnz) == want.nnz
    for a, b in ((one.mask, two.mask), (one.tile_offsets, two.tile_offsets), (v1, v2)):
        assert a.dtype == b.dtype and torch.equal(a, b)  # the values beyond total untouched (7) in both
    assert torch.equal(one.mask, want.mask) and torch.equal(one.tile_offsets, want.tile_offsets)
    assert torch.equal(v1[:total], want.values) and (v1[total:] == 7).all()
    assert int(one.ok) == 1 and int(one.start) == 0
    return one, two


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("opt", VARIANTS, ids=IDS)
def test_every_variant_matches_two_pass_and_torch_codec(device, opt, dtype):
    for i, (density, kind) in enumerate(PLAN[dtype]):
        n = sizes(opt.group, seed=4 * DTYPES.index(dtype) + i)[kind]
        x = random_tensor((n,), dtype, density, seed=n + i, device=device)
        check_one(x, (n, dtype, density), opt)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt", VARIANTS, ids=IDS)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN² under the interpreter
def test_every_variant_fuses_the_relu(device, opt):
    for i, (dtype, act) in enumerate([(torch.bfloat16, "relu2"), (torch.float32, "relu"), (torch.float16, None)]):
        n = sizes(opt.group, seed=7 + i)[1 + i % 2]
        h = random_tensor((n,), dtype, 0.8, seed=i, device=device)
        special = special_values(dtype)  # -0.0, NaNs of both signs, inf, subnormals through the ReLU
        h[: special.numel()] = special[:n].to(device)
        one, two = check_one(h, (n, dtype, "h"), opt, relu=True, act=act)
        if act is None:
            assert one.act is None
            continue
        assert_bit_equal(one.act, two.act)  # the two-pass encoder's activation, bit for bit
        if act == "relu":
            assert_bit_equal(one.act, relu_by_bits(h))
        else:  # over the input itself: every super-tile read before it is written, prefetched ones too
            want = oracle(relu_by_bits(h), TILE, False)
            v = values_buffer(n, dtype, device)
            again = se.encode(h, TILE, values=v, passes=1, one_pass=opt, relu=True, act=act, act_in_place=True)
            assert again.act.data_ptr() == h.data_ptr() and torch.equal(again.mask, want.mask)
            assert int(again.total) == want.total and torch.equal(v[: want.total], want.values)
            assert_bit_equal(h, two.act)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt", VARIANTS, ids=IDS)
def test_every_variant_reserves_and_refuses_in_an_arena_as_encode_kernel_does(device, opt):
    # A payload that fits, one that does not (refused; values written only for the tiles that fit whole),
    # then one after a reset: arena bytes, counters and results the same as today's kernel's at every step.
    n = sizes(opt.group, seed=3)[1]
    x = random_tensor((n,), torch.bfloat16, 0.5, seed=2, device=device)
    want = oracle(x, TILE, False)
    aligned = (want.total * 2 + 15) // 16 * 16
    arenas = [Arena(aligned + aligned // 32 * 16, device=device) for _ in range(2)]  # room for half of the second
    for arena in arenas:
        arena.view(torch.uint8).fill_(0xAB)
    for step, ok in enumerate((1, 0, 1)):
        if step == 2:
            for arena in arenas:
                arena.reset()
        now, got = (se.encode(x, TILE, arena=a, passes=1, one_pass=o) for a, o in zip(arenas, (None, opt)))
        assert int(got.ok) == int(now.ok) == ok and int(got.start) == int(now.start)
        for a, b in zip(got[:5], now[:5]):  # mask, tile_offsets, values (the arena's buffer), total, nnz
            assert torch.equal(a, b)
        assert torch.equal(arenas[0].counters, arenas[1].counters)
        assert torch.equal(got.mask, want.mask) and torch.equal(got.tile_offsets, want.tile_offsets)
    assert torch.equal(arenas[1].view(torch.int16)[: want.total], want.values)
    assert arenas[1].used_bytes() == aligned and arenas[1].overflows() == 1


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input_and_bad_knobs(device):
    empty = se.encode(torch.zeros(0, device=device), TILE, values=values_buffer(0, torch.float32, device),
                      passes=1, one_pass=OnePass(group=4, persistent=True))  # fmt: skip
    assert int(empty.total) == 0 and int(empty.ok) == 1 and empty.mask.numel() == 0
    check_one(torch.ones(1, device=device), "one", OnePass(group=8, persistent=True))
    assert check_one_pass(OnePass(group=4), 4096, 8) == OnePass(group=4, row=8, num_warps=8)
    x = torch.zeros(10, device=device)
    values = values_buffer(10, torch.float32, device)
    for bad, match in [(OnePass(group=3), "group=3"), (OnePass(row=64), "row=64"), (OnePass(row=8, vec=16), "vec=16"),
                       (OnePass(lookback=100), "lookback=100"), (OnePass(num_warps=3), "num_warps=3"),
                       (OnePass(persistent=True, programs_per_sm=0), "programs_per_sm=0")]:  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            se.encode(x, TILE, values=values, passes=1, one_pass=bad)
    with pytest.raises(ConfigError, match="one_pass takes a OnePass, with passes=1"):
        se.encode(x, TILE, values=values, one_pass=OnePass())
    with pytest.raises(ConfigError, match="one_pass takes a OnePass"):
        se.encode(x, TILE, values=values, passes=1, one_pass=dict(group=2))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
@pytest.mark.parametrize("opt", [OnePass(group=1, row=8, vec=8), OnePass(group=4, row=8, vec=8, num_warps=8),
                                 OnePass(group=2, persistent=True, row=8, vec=8, num_warps=8, lookback=32),
                                 OnePass(group=1, persistent=True, programs_per_sm=8)])  # fmt: skip
def test_many_concurrent_super_tiles_on_cuda(dtype, opt):
    # Thousands of look-back units in flight: every prefix chained right, every time, on odd sizes too.
    for seed in range(3):
        n = (1 << 22) + 12345 * seed
        x = random_tensor((n,), dtype, 0.3 + 0.2 * seed, seed=seed, device="cuda")
        want = oracle(x, 4096, False)
        values = torch.full((n + 9,), 7, dtype=se.bits_dtype(dtype), device="cuda")
        got = se.encode(x, 4096, values=values, passes=1, one_pass=opt)
        assert int(got.total) == want.total and torch.equal(got.mask, want.mask)
        assert torch.equal(got.tile_offsets, want.tile_offsets) and torch.equal(values[: want.total], want.values)
