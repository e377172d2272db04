"""The sparse encoder of :mod:`actzip.kernels.sparse_encode` (one pass or two, into a buffer it allocates, a
given buffer or an arena) against the PyTorch codec, bit for bit.

CPU cases run under Triton's interpreter (programs run one after another there, so the look-back always
finds its predecessor finished); CUDA cases run programs concurrently, which is what exercises the
decoupled look-back, on tensors of many tiles.
"""

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import sparse_encode as se  # noqa: E402
from actzip.memory.modules.arena import Arena  # noqa: E402

from kernel_cases import (  # noqa: E402
    DEVICES, FP8, assert_bit_equal, bits, oracle, random_tensor, relu_by_bits, special_values,
)


def check_against_oracle(x, tile, sign_pack, **kw):
    want = oracle(x, tile, sign_pack)
    cap = se.values_capacity(x.numel(), tile, x.dtype, sign_pack)
    values = torch.full((cap + 5,), 7, dtype=want.values.dtype, device=x.device)  # garbage: no zeroing needed
    got = se.encode(x, tile, sign_pack, values=values, **kw)
    total = int(got.total)
    assert total == int(want.total)
    assert torch.equal(got.mask, want.mask)
    assert torch.equal(got.tile_offsets, want.tile_offsets)
    assert torch.equal(values[:total], want.values)
    assert int(got.nnz) == int(want.nnz) and int(got.ok) == 1 and int(got.start) == 0
    if sign_pack:
        assert int(got.sign_set) == int(want.sign_set)
    return got


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, *FP8])
@pytest.mark.parametrize("n,tile", [(1, 64), (130, 64), (700, 256), (257, 256)])
@pytest.mark.parametrize("row", [8, 2])
@pytest.mark.parametrize("passes", [1, 2])
def test_matches_the_torch_codec(device, dtype, n, tile, row, passes):
    x = random_tensor((n,), dtype, 0.5, seed=n + tile, device=device)
    check_against_oracle(x, tile, False, row=row, passes=passes)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float8_e5m2])
@pytest.mark.parametrize("density", [0.0, 0.4, 1.0])
def test_sign_packing_matches_two_pass_encoder(device, dtype, density):
    x = random_tensor((300,), dtype, density, seed=3, signed=False, device=device)
    check_against_oracle(x, 64, True, row=2 if density == 0.4 else 8)


@pytest.mark.parametrize("device", DEVICES)
def test_sign_set_is_counted(device):
    x = random_tensor((200,), torch.bfloat16, 0.7, seed=1, signed=True, device=device)
    got = check_against_oracle(x, 64, True)
    assert int(got.sign_set) == int((bits(x) < 0).sum())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e5m2])
@pytest.mark.parametrize("sign_pack", [False, True])
def test_values_allocated_to_fit_read_the_counts_once(device, dtype, sign_pack):
    # What the codec runs: the values buffer sized exactly, the counts (sign bits included) read in one go.
    x = random_tensor((333,), dtype, 0.4, seed=8, signed=True, device=device)
    want = oracle(x, 64, sign_pack)
    got = se.encode(x, 64, sign_pack)
    assert got.values.shape == want.values.shape and torch.equal(got.values, want.values)
    assert torch.equal(got.mask, want.mask) and torch.equal(got.tile_offsets, want.tile_offsets)
    assert got.host == (want.total, want.nnz, want.sign_set if sign_pack else 0)
    assert int(got.total) == want.total and int(got.ok) == 1 and int(got.start) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("act", [None, "relu", "relu2"])
@pytest.mark.parametrize("passes", [1, 2])
def test_fused_relu_matches_torch(device, dtype, act, passes):
    g = torch.Generator().manual_seed(5)
    h = torch.randn(3, 170, generator=g).to(dtype).to(device)
    r = torch.relu(h)
    want = oracle(r, 64, False)
    values = torch.empty(se.values_capacity(h.numel(), 64, dtype, False), dtype=want.values.dtype, device=device)
    got = se.encode(h, 64, False, relu=True, act=act, values=values, passes=passes)
    assert torch.equal(got.mask, want.mask) and torch.equal(values[: int(got.total)], want.values)
    assert int(got.nnz) == want.nnz and int(got.ok) == 1
    if act == "relu":
        assert torch.equal(got.act, r)
    elif act == "relu2" and (device == "cuda" or dtype == torch.float32):
        # bf16 rounding of fp32 products differs in Triton's interpreter; exact on the GPU.
        assert torch.equal(got.act, r.square())
    else:
        assert act is None or got.act.shape == h.shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("passes,sign_pack", [(1, False), (2, False), (2, True)])
def test_16bit_signed_zero_nan_inf_bit_for_bit(device, dtype, passes, sign_pack):
    # Every pattern (-0.0, NaN payloads of both signs, +-inf, subnormals) over random shapes, tiles and
    # densities, stored as is and through the fused ReLU. Only bits move, so the interpreter is exact too.
    g = torch.Generator().manual_seed(17 + passes + 2 * sign_pack)
    for i in range(3):
        n = int(torch.randint(1, 600, (1,), generator=g))
        tile = (64, 128, 256)[int(torch.randint(0, 3, (1,), generator=g))]
        density = (0.0, 0.3, 0.7, 1.0)[int(torch.randint(0, 4, (1,), generator=g))]
        row = (2, 8)[i % 2]
        h = random_tensor((n,), dtype, density, seed=100 * passes + 10 * sign_pack + i)
        special = special_values(dtype)
        at = torch.randperm(n, generator=g)[: special.numel()]
        h[at] = special[: at.numel()]
        h = h.to(device)
        check_against_oracle(h, tile, sign_pack, row=row, passes=passes)  # the sign bit counted, then dropped
        r = relu_by_bits(h)
        if device == "cuda":
            assert_bit_equal(r, torch.relu(h))
        want = oracle(r, tile, sign_pack)
        cap = se.values_capacity(n, tile, dtype, sign_pack)
        values = torch.full((cap,), 7, dtype=want.values.dtype, device=device)
        got = se.encode(h, tile, sign_pack, relu=True, act="relu", values=values, passes=passes, row=row)
        assert torch.equal(got.mask, want.mask) and torch.equal(got.tile_offsets, want.tile_offsets)
        assert int(got.total) == want.total and torch.equal(values[: want.total], want.values)
        assert int(got.nnz) == want.nnz and int(got.ok) == 1
        if sign_pack:  # negative NaNs keep their sign through the ReLU
            assert int(got.sign_set) == want.sign_set
        assert_bit_equal(got.act, r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("passes,sign_pack", [(1, False), (2, False), (2, True)])
def test_arena_reserves_and_refuses_on_the_device(device, passes, sign_pack):
    x = random_tensor((600,), torch.bfloat16, 0.5, seed=2, signed=not sign_pack, device=device)
    want = oracle(x, 64, sign_pack)
    word = torch.int32 if sign_pack else torch.int16
    nbytes = int(want.total) * (4 if sign_pack else 2)
    aligned = (nbytes + 15) // 16 * 16
    arena = Arena(aligned + 16, device=device)
    arena.view(torch.uint8).fill_(0xAB)
    first = se.encode(x, 64, sign_pack, arena=arena, passes=passes)
    assert int(first.ok) == 1 and int(first.start) == 0
    assert torch.equal(arena.view(word)[: int(first.total)], want.values)
    assert arena.used_bytes() == aligned
    second = se.encode(x, 64, sign_pack, arena=arena, passes=passes)  # does not fit: refused, nothing written
    assert int(second.ok) == 0 and arena.used_bytes() == aligned and arena.overflows() == 1
    assert arena.high_water_bytes() == 2 * aligned
    assert torch.equal(arena.view(word)[: int(first.total)], want.values)  # the first payload intact
    if passes == 2:  # a refused two-pass payload writes nothing (one pass may fill unreserved room: harmless)
        assert (arena.view(torch.uint8)[nbytes:] == 0xAB).all()
    arena.reset()
    third = se.encode(x, 64, sign_pack, arena=arena, passes=passes)
    assert int(third.ok) == 1 and arena.used_bytes() == aligned


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sign_packing_may_use_the_input_as_scratch(device, dtype):
    # The fused MLP's path: relu(h) sign-packed with h itself as the scratch room; h is garbage afterwards,
    # and its version counter says so.
    g = torch.Generator().manual_seed(9)
    h = torch.randn(5, 100, generator=g).to(dtype).to(device)
    r = torch.relu(h)
    want = oracle(r, 64, True)
    values = torch.full((se.values_capacity(h.numel(), 64, dtype, True),), 7, dtype=torch.int32, device=device)
    version = h._version
    got = se.encode(h, 64, True, relu=True, act="relu", values=values, overwrite_input=True)
    assert torch.equal(got.mask, want.mask) and torch.equal(got.tile_offsets, want.tile_offsets)
    assert torch.equal(values[: int(got.total)], want.values) and int(got.nnz) == want.nnz
    assert torch.equal(got.act, r) and h._version > version


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scratch_tiles", [1, 3, 100])
def test_sign_packing_through_a_small_scratch_with_the_activation_in_place(device, dtype, scratch_tiles):
    # The fused MLP's path with sign packing: relu(h)² written over h, the values compacted and packed a few
    # tiles at a time through a scratch of scratch_tiles tiles (the last chunk partial, the last tile too).
    g = torch.Generator().manual_seed(11)
    h = torch.randn(7, 100, generator=g).to(dtype).to(device)
    r = torch.relu(h)
    want = oracle(r, 64, True)
    values = torch.full((se.values_capacity(h.numel(), 64, dtype, True),), 7, dtype=torch.int32, device=device)
    version = h._version
    got = se.encode(h, 64, True, relu=True, act="relu2", values=values, act_in_place=True,
                    scratch_tiles=scratch_tiles)
    assert torch.equal(got.mask, want.mask) and torch.equal(got.tile_offsets, want.tile_offsets)
    assert torch.equal(values[: int(got.total)], want.values) and int(got.nnz) == want.nnz
    assert got.act is h and h._version > version
    if device == "cuda":  # bf16 rounding of fp32 products differs in Triton's interpreter; exact on the GPU
        assert torch.equal(h, r.square())


@pytest.mark.parametrize("device", DEVICES)
def test_bad_options_are_refused(device):
    x = torch.zeros(10, device=device)
    with pytest.raises(ConfigError, match="act must be"):
        se.encode(x, 64, relu=True, act="gelu", values=torch.empty(10, dtype=torch.int32, device=device))
    with pytest.raises(ConfigError, match="act needs relu=True"):
        se.encode(x, 64, act="relu", values=torch.empty(10, dtype=torch.int32, device=device))
    with pytest.raises(ConfigError, match="row must be"):
        se.encode(x, 64, row=4, values=torch.empty(10, dtype=torch.int32, device=device))
    with pytest.raises(ConfigError, match="passes=1 needs a values buffer"):
        se.encode(x, 64, passes=1)
    with pytest.raises(ConfigError, match="values_offset says where the values go in a values buffer"):
        se.encode(x, 64, values_offset=torch.zeros(1, dtype=torch.int64, device=device))
    with pytest.raises(ConfigError, match="overwrite_input needs a values buffer or an arena"):
        se.encode(x, 64, overwrite_input=True)
    with pytest.raises(ConfigError, match="may need"):
        se.encode(x, 64, values=torch.empty(3, dtype=torch.int32, device=device))
    with pytest.raises(ConfigError, match="passes must be"):
        se.encode(x, 64, True, passes=1, values=torch.empty(10, dtype=torch.int32, device=device))
    with pytest.raises(ConfigError, match="scratch_tiles"):
        se.encode(x, 64, False, scratch_tiles=2, values=torch.empty(100, dtype=x.view(torch.int32).dtype,
                                                                     device=device))
    with pytest.raises(ConfigError, match="overwrite_input needs a contiguous"):
        se.encode(torch.zeros(4, 6, device=device).t(), 64, overwrite_input=True,
                  values=torch.empty(24, dtype=torch.int32, device=device))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
@pytest.mark.parametrize("sign_pack", [False, True])
def test_many_concurrent_tiles_on_cuda(dtype, sign_pack):
    # Thousands of tiles in flight: the look-back must chain every prefix right, every time.
    for seed in range(3):
        x = random_tensor((1 << 22,), dtype, 0.3 + 0.2 * seed, seed=seed, signed=not sign_pack, device="cuda")
        check_against_oracle(x, 4096 if seed else 1024, sign_pack, row=2 if seed == 1 else 8)
        if not sign_pack:
            check_against_oracle(x, 4096 if seed else 1024, sign_pack, passes=1)
