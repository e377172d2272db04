"""The quant and fp8 codecs' Triton kernels against their PyTorch implementation, bit for bit.

Every case runs on the CPU under Triton's interpreter (see conftest.py) and on CUDA when there is a GPU. The
kernels compute in float32 (minima and maxima, which are exact, in the input dtype on a GPU) and make fp8 codes
with integer operations; where the interpreter's bfloat16 handling differs from PyTorch's they take an exact
equivalent (``HW`` false), so the interpreter computes the same bits as a GPU and everything is compared exactly
on both. Stored buffers are compared bitwise (NaN parameters included); decoded
tensors bitwise except that any NaN matches any NaN (PyTorch's own CPU conversions to bfloat16 write NaN
with different bits).
"""

import math
import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from test_sparse_triton import DEVICES  # noqa: E402  (CPU under the interpreter, and CUDA)

from actzip.codecs import quant as Q  # noqa: E402
from actzip.codecs.quant import FP8Codec, QuantCodec  # noqa: E402
from actzip.errors import ConfigError, InvalidValueError  # noqa: E402
from actzip.kernels import quant_bits as KB  # noqa: E402
from actzip.kernels import fp8_triton as F8  # noqa: E402
from actzip.kernels import quant_triton as K  # noqa: E402
from actzip.kernels import runtime  # noqa: E402

# Arithmetic on padding rows and on inf/NaN groups is what the format asks for; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
QUANT_CONFIGS = [(b, s) for b in (1, 2, 4, 8) for s in ("minmax", "absmax") if not (b == 1 and s == "absmax")]
ROUNDINGS = ["nearest", "stochastic"]
_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.dtype]).cpu()


def mismatches(a: torch.Tensor, b: torch.Tensor, keep: torch.Tensor | None = None, limit: int = 8) -> str:
    """Where two tensors' bits differ: count, then index, bits and values of the first few (for a GPU failure)."""
    ra, rb = raw(a).reshape(-1).cpu(), raw(b).reshape(-1).cpu()
    bad = ra != rb
    if keep is not None:
        bad &= keep
    idx = bad.nonzero().reshape(-1)[:limit].tolist()
    va, vb = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    rows = [f"[{i}] bits {int(ra[i]):#x} vs {int(rb[i]):#x}, values {va[i].item()!r} vs {vb[i].item()!r}"
            for i in idx]
    return f"{int(bad.sum())} of {bad.numel()} differ: " + "; ".join(rows)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(raw(a), raw(b)), f"{what}: {mismatches(a, b)}"


def assert_same_values(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bitwise equal, except that NaN matches NaN whatever its bits."""
    assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
    na, nb = torch.isnan(a).cpu().reshape(-1), torch.isnan(b).cpu().reshape(-1)
    assert torch.equal(na, nb), f"NaN positions differ: {int((na != nb).sum())}"
    assert torch.equal(raw(a).reshape(-1)[~na], raw(b).reshape(-1)[~na]), mismatches(a, b, ~na)


def check_paths(make, x: torch.Tensor) -> None:
    """Both implementations make the same buffers; each decodes both payloads to the same values."""
    ref, tri = make("torch"), make("triton")
    p_ref, p_tri = ref.encode(x), tri.encode(x)
    assert p_ref.buffers.keys() == p_tri.buffers.keys()
    for k in p_ref.buffers:
        assert_same_bits(p_tri.buffers[k], p_ref.buffers[k], k)
    assert p_ref.meta == p_tri.meta and p_tri.device == x.device
    first = ref.decode(p_ref)
    assert first.device == x.device and first.shape == x.shape and first.dtype == x.dtype
    for codec in (ref, tri):
        for p in (p_ref, p_tri):
            assert_same_values(codec.decode(p), first)


def quant(bits, scale, rounding, group_size=16, check=False, seed=5):
    return lambda kernel: QuantCodec(bits=bits, group_size=group_size, scale=scale, rounding=rounding, seed=seed,
                                     check=check, kernel=kernel)  # fmt: skip


def fp8(fmt, granularity, rounding, group_size=16, check=False, seed=5):
    return lambda kernel: FP8Codec(format=fmt, granularity=granularity, group_size=group_size, rounding=rounding,
                                   seed=seed, check=check, kernel=kernel)  # fmt: skip


def random_input(rng: random.Random, dtype, device) -> tuple[torch.Tensor, int]:
    """A random shape (its size rarely a multiple of the group), random magnitude, and a group size."""
    shape = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    mag = rng.choice([1e-3, 1.0, 50.0] if dtype == torch.float16 else [1e-20, 1e-3, 1.0, 1e6, 1e30])
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * mag + rng.choice([0.0, mag])).to(dtype)
    return x.to(device), rng.choice([8, 24, 64, 128])


# -- the codecs, both paths -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("bits,scale", QUANT_CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quant_paths_agree(device, dtype, bits, scale, rounding):
    rng = random.Random(f"{dtype}{bits}{scale}{rounding}")
    for _ in range(2):
        x, gs = random_input(rng, dtype, device)
        check_paths(quant(bits, scale, rounding, group_size=gs), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("granularity", ["tensor", "group"])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_paths_agree(device, dtype, fmt, granularity, rounding):
    rng = random.Random(f"{dtype}{fmt}{granularity}{rounding}")
    for _ in range(2):
        x, gs = random_input(rng, dtype, device)
        check_paths(fp8(fmt, granularity, rounding, group_size=gs), x)


def special_inputs(dtype, device):
    """Named inputs: signed zeros, constants, subnormals, the dtype's extremes, inf/NaN, raw bit patterns."""
    f = torch.finfo(dtype)
    g = torch.Generator().manual_seed(7)
    sp = torch.tensor([0.0, -0.0, f.tiny, -f.tiny, f.tiny * f.eps, 1.0, -1.0, 448.0, 57344.0, 3e-5, f.max, -f.max])
    nonfinite = torch.randn(64, generator=g)
    nonfinite[[3, 40]] = math.nan
    nonfinite[50] = -math.inf
    nbits = dtype.itemsize * 8
    bits = torch.randint(-(2 ** (nbits - 1)), 2 ** (nbits - 1), (96,), generator=g, dtype=torch.int64)
    cases = {
        "special": sp.to(dtype).repeat(4)[torch.randperm(48, generator=g)],
        "nonfinite": nonfinite.to(dtype),
        "zeros": torch.zeros(40, dtype=dtype),
        "negative_zeros": -torch.zeros(40, dtype=dtype),
        "constant": torch.full((40,), -1.7, dtype=dtype),
        "raw_bits": bits.to(_BITS[dtype]).view(dtype),
        "overflowing_range": torch.tensor([-f.max, f.max] * 8, dtype=dtype),
    }
    return {k: v.to(device) for k, v in cases.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(device, dtype):
    cases = special_inputs(dtype, device)
    # One tensor of whole groups of 16 (per-group codecs treat the cases independently) ...
    joined = torch.cat([torch.cat([x, x[-1:].expand(-x.numel() % 16)]) for x in cases.values()])
    for bits, scale in [(1, "minmax"), (4, "absmax"), (8, "minmax")]:
        for rounding in ROUNDINGS:
            check_paths(quant(bits, scale, rounding), joined)
    for fmt, rounding in [("e4m3", "nearest"), ("e5m2", "stochastic")]:
        check_paths(fp8(fmt, "group", rounding), joined)
    # ... and each on its own with one scale per tensor.
    for i, x in enumerate(cases.values()):
        check_paths(fp8(("e4m3", "e5m2")[i % 2], "tensor", ROUNDINGS[i // 2 % 2]), x)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_groups_are_nan_in_both_and_refused_alike(device):
    x = torch.randn(40).to(device)
    x[[3, 17]] = math.inf
    nan_groups = torch.tensor([True, False, True, False, False]).repeat_interleave(8)
    for make in (quant(4, "minmax", "stochastic", group_size=8), fp8("e4m3", "group", "nearest", group_size=8)):
        y = make("triton").decode(make("triton").encode(x)).cpu()
        assert torch.isnan(y[nan_groups]).all() and torch.isfinite(y[~nan_groups]).all()
    for make in (quant(2, "absmax", "nearest", group_size=8, check=True), fp8("e5m2", "tensor", "nearest", check=True)):
        msgs = []
        for kernel in ("torch", "triton"):
            with pytest.raises(InvalidValueError, match=r"acts has 2 of 40 elements non-finite") as e:
                make(kernel).encode(x, name="acts")
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_representable_values_round_trip(device):
    for fmt, f8 in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        values = torch.arange(256).to(torch.uint8).view(f8).float()
        x = values[torch.isfinite(values)].mul(2.0**-5).to(device)
        for gran in ("tensor", "group"):
            codec = FP8Codec(format=fmt, granularity=gran, group_size=32, kernel="triton")
            assert torch.equal(codec.decode(codec.encode(x)), x)


@pytest.mark.parametrize("device", DEVICES)
def test_layouts_empty_and_scalar(device):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 10, 4, generator=g).to(torch.bfloat16).to(device)
    layouts = [base.transpose(0, 2).contiguous().transpose(0, 2), base[:, ::3], base.permute(2, 0, 1)]
    for x in [*layouts, torch.zeros(0, 3, device=device), torch.tensor(3.25, device=device)]:
        check_paths(quant(4, "minmax", "stochastic", group_size=8), x)
        check_paths(fp8("e4m3", "tensor", "stochastic"), x)
        check_paths(fp8("e5m2", "group", "nearest", group_size=8), x)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gapped_rows_are_read_in_place_as_the_copy(device, dtype, monkeypatch):
    # Attention's q, k and v cut from one projection: rows of whole groups with gaps, which the kernel reads where
    # they lie. Same buffers as the PyTorch path's copy, for every layout the tile may cut (partial last tiles).
    g = torch.Generator().manual_seed(11)
    qkv = (torch.randn(3, 7, 3 * 64, generator=g) * 3).to(dtype).to(device)
    views = [qkv[..., 64:128].view(3, 7, 4, 16).transpose(1, 2), qkv[..., :64], qkv[1, :, 128:], qkv[:, 2:, :64]]
    seen = []
    encode = K.quant_encode
    monkeypatch.setattr(K, "quant_encode", lambda flat, *a, **k: seen.append(flat.dim()) or encode(flat, *a, **k))
    for i, x in enumerate(views):
        for bits, scale, rounding, gs in ((4, "minmax", "stochastic", 16), (8, "absmax", "nearest", 32),
                                          (2, "minmax", "stochastic", 64), (4, "minmax", "nearest", 24)):  # fmt: skip
            seen.clear()
            check_paths(quant(bits, scale, rounding, group_size=gs), x)
            rows = i < 3 and 64 % gs == 0  # the last view's rows are not evenly spaced: copied
            assert seen and all(d == (2 if rows else 1) for d in seen), (i, gs, seen)


@pytest.mark.parametrize("device", DEVICES)
def test_random_stream_advances_and_matches(device):
    x = torch.randn(300).to(device)
    ref, tri = quant(2, "minmax", "stochastic")("torch"), quant(2, "minmax", "stochastic")("triton")
    first = [c.encode(x).buffers["codes"] for c in (ref, tri)]
    second = [c.encode(x).buffers["codes"] for c in (ref, tri)]
    assert torch.equal(first[0].cpu(), first[1].cpu()) and torch.equal(second[0].cpu(), second[1].cpu())
    assert not torch.equal(first[0].cpu(), second[0].cpu())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_launch_shapes_make_the_same_bytes(device, dtype):
    # Several tiles, most of them whole (the unmasked path), and a partial last group.
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5 * 1024 + 77, generator=g).mul(3).to(dtype).to(device)
    shapes = [{"tile": 256, "warps": 1, "group_threads": 1}, {"tile": 1024, "warps": 2, "group_threads": 8},
              {"tile": 8192, "warps": 8, "group_threads": 2}]  # fmt: skip
    configs = {128: [(4, False, True), (8, True, False), (1, False, True)], 24: [(2, False, False)]}
    for gs in (128, 24):
        for bits, absmax, stochastic in configs[gs]:
            args = (bits, gs, absmax, stochastic, (3, 4))
            ref = K.quant_encode(x, *args)
            params = (ref["absmax"], None) if absmax else (ref["lo"], ref["span"])
            y = K.quant_decode(ref["codes"], *params, x.numel(), dtype, bits, gs, absmax)
            for shape in shapes:
                buf = K.quant_encode(x, *args, **shape)
                for k in ref:
                    assert_same_bits(buf[k], ref[k], f"{k} {args} {shape}")
                y2 = K.quant_decode(ref["codes"], *params, x.numel(), dtype, bits, gs, absmax, **shape)
                assert_same_values(y2, y)
        for group in (gs, None) if gs == 128 else ():
            codes, scale = F8.fp8_encode(x, "e4m3", group, True, (5, 6))
            y = F8.fp8_decode(codes, scale, x.numel(), dtype, "e4m3", group)
            for shape in shapes:
                c2, s2 = F8.fp8_encode(x, "e4m3", group, True, (5, 6), **shape)
                assert_same_bits(c2, codes) and assert_same_bits(s2, scale)
                assert_same_values(F8.fp8_decode(codes, scale, x.numel(), dtype, "e4m3", group, **shape), y)
    with pytest.raises(ConfigError, match="tile must be a power of two"):
        K.quant_encode(x, 4, 128, False, True, tile=3000)


# -- the device helpers, one by one -----------------------------------------------------------------------


@triton.jit
def _pair_bits_kernel(pairs_ptr, out_ptr, key0, key1, BLOCK: tl.constexpr):
    p = tl.load(pairs_ptr + tl.arange(0, BLOCK))
    k1 = key1.to(tl.uint32, bitcast=True) ^ KB.mix32((p >> 32).to(tl.uint32))
    h = KB.pair_bits(p.to(tl.uint32) + key0.to(tl.uint32, bitcast=True), k1)
    tl.store(out_ptr + 2 * tl.arange(0, BLOCK), (h >> 17).to(tl.int64))
    tl.store(out_ptr + 2 * tl.arange(0, BLOCK) + 1, (h & 0x7FFF).to(tl.int64))


@triton.jit
def _random_bits_kernel(out_ptr, start, key0, key1, NS: tl.constexpr, BG: tl.constexpr, CP: tl.constexpr,
                        KC: tl.constexpr, G: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    # The tile's element offsets as quant_triton._tile makes them (whole groups of NS * CP chunks of KC).
    offs = (tl.arange(0, NS)[:, None, None, None] * CP + tl.arange(0, BG)[None, :, None, None] * (G // KC)
            + tl.arange(0, CP)[None, None, :, None]) * KC + tl.arange(0, KC)[None, None, None, :]  # fmt: skip
    tl.store(out_ptr + offs, K._random_bits(start.to(tl.int64), offs, key0, key1, NS, BG, CP, KC, WIDE))


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_random_bits_are_the_codec_bits(device):
    assert (KB.HASH_M1, KB.HASH_M2) == (Q.HASH_M1, Q.HASH_M2)
    for count in range(3):
        keys = Q.stream_keys(11, count)
        k = (K._signed(keys[0]), K._signed(keys[1]))
        pairs = torch.arange(256, dtype=torch.int64) * 0x1_0000_0001 + 12345  # high parts too
        out = torch.empty(512, dtype=torch.int64, device=device)
        _pair_bits_kernel[(1,)](pairs.to(device), out, *k, BLOCK=256)
        assert torch.equal(out.cpu().view(256, 2), Q.round_bits(pairs, keys))
        # A tile's bits, from its start: below 2**33 elements, and across it (the per-pair high part).
        geo = {"NS": 2, "BG": 4, "CP": 2, "KC": 8, "G": 32}
        for start, wide in [(0, False), (96, False), ((1 << 33) - 64, True), (1 << 33, False)]:
            out = torch.empty(128, dtype=torch.int32, device=device)
            _random_bits_kernel[(1,)](out, start, *k, WIDE=wide, **geo)
            ref = Q.round_bits(torch.arange(start // 2, start // 2 + 64, dtype=torch.int64), keys).view(-1)
            assert torch.equal(out.cpu().to(torch.int64), ref), (start, wide)
    # The codec's own stream: its first pairs.
    x = torch.zeros(10)
    assert torch.equal(Q._round_bits_like(x, keys), Q.round_bits(torch.arange(5), keys).view(-1))


@triton.jit
def _fp8_helpers_kernel(mag_ptr, r_ptr, near_ptr, sr_ptr, val_ptr, scale_ptr, n, MBITS: tl.constexpr,
                        BIAS: tl.constexpr, TOP_E: tl.constexpr, TOP_FRAC: tl.constexpr,
                        BLOCK: tl.constexpr):  # fmt: skip
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    mb = tl.load(mag_ptr + offs, mask=m, other=0.0).to(tl.int32, bitcast=True)
    tl.store(near_ptr + offs, KB.fp8_round(mb, MBITS, BIAS), mask=m)
    r = tl.load(r_ptr + offs, mask=m, other=0)
    tl.store(sr_ptr + offs, KB.fp8_round_stochastic(mb, r, MBITS, BIAS), mask=m)
    tl.store(val_ptr + offs, KB.fp8_value(offs & 0xFF, MBITS, BIAS), mask=m)
    tl.store(scale_ptr + offs, KB.fp8_scale(mb.to(tl.float32, bitcast=True), TOP_E, TOP_FRAC), mask=m)


def _magnitudes(f8: torch.dtype, fmax: float) -> torch.Tensor:
    """Every fp8 magnitude, the midpoints between neighbours and one float32 ulp around each, random values."""
    v = torch.arange(128).to(torch.uint8).view(f8).float()
    v = v[torch.isfinite(v)]
    pts = torch.cat([v, (v[1:] + v[:-1]) / 2])
    near = torch.cat([pts, torch.nextafter(pts, torch.tensor(math.inf)), torch.nextafter(pts, torch.tensor(0.0))])
    g = torch.Generator().manual_seed(0)
    tiny = torch.rand(300, generator=g) * 2.0**-130  # float32 subnormals
    return torch.cat([near, torch.rand(1000, generator=g) * fmax, tiny, torch.tensor([fmax])]).clamp(max=fmax)


def _absmax_values() -> torch.Tensor:
    """Absmax values over float32's whole range: powers of two, 0.875 of them, their neighbours, subnormals."""
    p = torch.tensor([2.0**k for k in range(-149, 128)])
    pts = torch.cat([p, p * 0.875, p * 1.75, p * 1.5])
    pts = pts[torch.isfinite(pts)]
    near = torch.cat([pts, torch.nextafter(pts, torch.tensor(math.inf)), torch.nextafter(pts, torch.tensor(0.0))])
    g = torch.Generator().manual_seed(1)
    wide = torch.exp2(torch.rand(1000, generator=g) * 250 - 140)
    return torch.cat([near, wide, torch.tensor([0.0, torch.finfo(torch.float32).max])])


def _run_helpers(x: torch.Tensor, r: torch.Tensor, fmt: str, device):
    mbits, bias, fmax = KB.FP8_LAYOUT[fmt]
    top_m, top_e = math.frexp(fmax)
    n = x.numel()
    near, sr = (torch.empty(n, dtype=torch.int32, device=device) for _ in range(2))
    val, scale = (torch.empty(n, device=device) for _ in range(2))
    _fp8_helpers_kernel[(-(-n // 512),)](x.to(device), r.to(device), near, sr, val, scale, n, MBITS=mbits,
                                         BIAS=bias, TOP_E=top_e, TOP_FRAC=int((2 * top_m - 1) * 2**23),
                                         BLOCK=512)  # fmt: skip
    return near.cpu(), sr.cpu(), val.cpu(), scale.cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_conversions_and_scale_match_pytorch(device, fmt):
    f8 = Q.FP8_FORMATS[fmt]
    assert KB.FP8_LAYOUT[fmt][2] == torch.finfo(f8).max
    mag = _magnitudes(f8, torch.finfo(f8).max)
    g = torch.Generator().manual_seed(3)
    for r in (torch.zeros_like(mag, dtype=torch.int32), torch.full_like(mag, 0x7FFF, dtype=torch.int32),
              torch.randint(0, 1 << 15, mag.shape, generator=g, dtype=torch.int32)):  # fmt: skip
        near, sr, val, _ = _run_helpers(mag, r, fmt, device)
        assert torch.equal(near, mag.to(f8).view(torch.uint8).to(torch.int32))
        # Stochastic rounding in integers is the codec's float formulation, for the same random integers.
        assert torch.equal(sr, FP8Codec._stochastic(mag, f8, r.to(torch.int64)).to(torch.int32))
    # Every code's value, both signs (0x80 is -0.0 and stays so).
    assert_same_values(val[:256], torch.arange(256).to(torch.uint8).view(f8).float())
    amax = _absmax_values()
    *_, scale = _run_helpers(amax, torch.zeros_like(amax, dtype=torch.int32), fmt, device)
    assert torch.equal(scale, FP8Codec._scales(amax, f8))


@triton.jit
def _bf16_store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, HW: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    K._store_f32(out_ptr, offs, tl.load(x_ptr + offs, mask=offs < n), offs < n, True, HW)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_store_rounds_like_pytorch(device):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-(2**31), 2**31 - 1, (4096,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([x, torch.tensor([math.inf, -math.inf, 3.3961e38, -0.0, 1e-45])])
    out = torch.empty(x.numel(), dtype=torch.int16, device=device)
    _bf16_store_kernel[(-(-x.numel() // 1024),)](x.to(device), out, x.numel(), BLOCK=1024, HW=not K.INTERPRETED)
    assert_same_values(out.cpu().view(torch.bfloat16), x.to(torch.bfloat16))


# -- options and errors -----------------------------------------------------------------------------------


def test_kernel_option_is_checked_and_reported():
    with pytest.raises(ConfigError, match=r"quant: option kernel must be one of 'auto', 'torch', 'triton'"):
        QuantCodec(kernel="cuda")
    with pytest.raises(ConfigError, match=r"fp8: option kernel must be one of"):
        FP8Codec(kernel=None)
    with pytest.raises(ConfigError, match=r"group_size must be at most 4096"):
        QuantCodec(group_size=8192, kernel="triton")
    FP8Codec(group_size=8192, kernel="triton")  # one scale per tensor: any size
    assert QuantCodec().options()["kernel"] == "auto" and FP8Codec(kernel="torch").options()["kernel"] == "torch"


def test_triton_refuses_float64_and_large_groups(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: None)
    with pytest.raises(runtime.KernelUnavailableError, match=r"quant\(kernel='triton'\).*float64 has no Triton kernel"):
        QuantCodec(kernel="triton").encode(torch.ones(4, dtype=torch.float64))
    p = FP8Codec(granularity="group", group_size=8192, kernel="torch").encode(torch.ones(10000))
    with pytest.raises(runtime.KernelUnavailableError, match=r"group_size=8192 is above the kernels' largest"):
        FP8Codec(kernel="triton").decode(p)


def test_triton_unavailable_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: "no GPU here")
    with pytest.raises(runtime.KernelUnavailableError, match=r"fp8\(kernel='triton'\) cannot run: no GPU here"):
        FP8Codec(kernel="triton").encode(torch.ones(4))
    QuantCodec(kernel="auto").encode(torch.ones(4))  # auto on the CPU: PyTorch, no warning needed


def test_wrappers_check_their_inputs():
    with pytest.raises(ConfigError, match="contiguous 1-D"):
        K.quant_encode(torch.zeros(4, 4), 4, 8, False, False)
    with pytest.raises(ConfigError, match="float32, float16 and bfloat16"):
        F8.fp8_encode(torch.zeros(4, dtype=torch.float64), "e4m3", None, False)
    with pytest.raises(ConfigError, match="multiple of 8 from 8 to 4096"):
        K.check_group_size(12)
    with pytest.raises(ConfigError, match="codes has 2 elements, the payload needs 8"):
        K.quant_decode(torch.zeros(2, dtype=torch.uint8), torch.zeros(1), torch.zeros(1), 10, torch.float32, 4, 16,
                       False)  # fmt: skip
    with pytest.raises(ConfigError, match="format must be one of"):
        F8.fp8_decode(torch.zeros(2, dtype=torch.uint8), torch.ones(1), 2, torch.float32, "e3m4", None)


# -- CUDA only --------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_auto_uses_triton_on_cuda(monkeypatch):
    def no_torch(*args, **kwargs):
        raise AssertionError("the PyTorch path was taken on a CUDA tensor")

    monkeypatch.setattr(QuantCodec, "_encode_torch", no_torch)
    monkeypatch.setattr(QuantCodec, "_decode_torch", no_torch)
    monkeypatch.setattr(FP8Codec, "_encode_torch", no_torch)
    x = torch.randn(1000, 700, device="cuda").bfloat16()
    for codec in (QuantCodec(), FP8Codec(), FP8Codec(granularity="group", rounding="stochastic")):
        y = codec.decode(codec.encode(x))
        assert y.shape == x.shape and (y.float() - x.float()).abs().max() < 0.25 * x.float().abs().max()


@pytest.mark.cuda
def test_auto_announces_a_fallback_on_cuda():
    runtime.reset_fallbacks()
    with pytest.warns(RuntimeWarning, match="quant codec.*float64 has no Triton kernel"):
        QuantCodec().encode(torch.randn(100, dtype=torch.float64, device="cuda"))
    assert sum(runtime.fallback_counts().values()) == 1


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_default_groups_on_a_large_tensor(dtype):
    x = torch.randn((1 << 20) + 77, generator=torch.Generator().manual_seed(1)).to(dtype).cuda()
    for bits, scale in QUANT_CONFIGS:
        for rounding in ROUNDINGS:
            check_paths(quant(bits, scale, rounding, group_size=128), x)
    for fmt in ("e4m3", "e5m2"):
        for gran in ("tensor", "group"):
            for rounding in ROUNDINGS:
                check_paths(fp8(fmt, gran, rounding, group_size=128), x)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [1e-40, 1e-30, 1e30])
def test_extreme_magnitudes_on_cuda(scale):
    # float32 subnormals (and values whose steps are subnormal) go through the GPU's IEEE operations.
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * scale).float().cuda()
    for bits, sc in [(4, "minmax"), (8, "absmax")]:
        check_paths(quant(bits, sc, "stochastic"), x)
    check_paths(fp8("e4m3", "group", "stochastic"), x)
    check_paths(fp8("e5m2", "tensor", "nearest"), x)


@pytest.mark.cuda
def test_encode_and_decode_do_not_synchronize():
    x = torch.randn(4096, 1024, device="cuda").bfloat16()
    codecs = [QuantCodec(check=False), QuantCodec(bits=2, scale="absmax", check=False),
              FP8Codec(check=False), FP8Codec(granularity="group", rounding="stochastic", check=False)]  # fmt: skip
    for codec in codecs:
        codec.decode(codec.encode(x))  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for codec in codecs:
            codec.decode(codec.encode(x))
    finally:
        torch.cuda.set_sync_debug_mode("default")
