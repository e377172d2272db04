"""The bit-level device helpers of the quant and fp8 kernels (:mod:`actzip.kernels.quant_bits`, and the
random stream of :mod:`actzip.kernels.quant_tiles`) against the codecs' PyTorch formulation, bit for bit.
"""

import math

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from actzip.codecs import counter_rng as rng  # noqa: E402
from actzip.codecs.fp8 import FP8_FORMATS, FP8Codec  # noqa: E402
from actzip.kernels import quant_bits as KB  # noqa: E402
from actzip.kernels import quant_tiles as tiles  # noqa: E402

from kernel_cases import DEVICES  # noqa: E402  (CPU under the interpreter, and CUDA)
from quant_cases import assert_same_values  # noqa: E402

# Arithmetic on padding rows and on inf/NaN groups is what the format asks for; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


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
    # The tile's element offsets as quant_tiles.tile_elements makes them (whole groups of NS * CP chunks of KC).
    offs = (tl.arange(0, NS)[:, None, None, None] * CP + tl.arange(0, BG)[None, :, None, None] * (G // KC)
            + tl.arange(0, CP)[None, None, :, None]) * KC + tl.arange(0, KC)[None, None, None, :]  # fmt: skip
    tl.store(out_ptr + offs, tiles.random_bits(start.to(tl.int64), offs, key0, key1, NS, BG, CP, KC, WIDE))


@pytest.mark.parametrize("device", DEVICES)
def test_kernel_random_bits_are_the_codec_bits(device):
    assert (KB.HASH_M1, KB.HASH_M2) == (rng.HASH_M1, rng.HASH_M2)
    for count in range(3):
        keys = rng.stream_keys(11, count)
        k = (tiles.signed_key(keys[0]), tiles.signed_key(keys[1]))
        pairs = torch.arange(256, dtype=torch.int64) * 0x1_0000_0001 + 12345  # high parts too
        out = torch.empty(512, dtype=torch.int64, device=device)
        _pair_bits_kernel[(1,)](pairs.to(device), out, *k, BLOCK=256)
        assert torch.equal(out.cpu().view(256, 2), rng.round_bits(pairs, keys))
        # A tile's bits, from its start: below 2**33 elements, and across it (the per-pair high part).
        geo = {"NS": 2, "BG": 4, "CP": 2, "KC": 8, "G": 32}
        for start, wide in [(0, False), (96, False), ((1 << 33) - 64, True), (1 << 33, False)]:
            out = torch.empty(128, dtype=torch.int32, device=device)
            _random_bits_kernel[(1,)](out, start, *k, WIDE=wide, **geo)
            ref = rng.round_bits(torch.arange(start // 2, start // 2 + 64, dtype=torch.int64), keys).view(-1)
            assert torch.equal(out.cpu().to(torch.int64), ref), (start, wide)
    # The codec's own stream: its first pairs.
    x = torch.zeros(10)
    assert torch.equal(rng.round_bits_like(x, keys), rng.round_bits(torch.arange(5), keys).view(-1))


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
    f8 = FP8_FORMATS[fmt]
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
