"""What the quant and fp8 kernel tests share: inputs, and both implementations compared bit for bit.

Stored buffers are compared bitwise (NaN parameters included); decoded tensors bitwise except that any NaN matches
any NaN (PyTorch's own CPU conversions to bfloat16 write NaN with different bits).
"""

import math
import random

import torch

from actzip.codecs.fp8 import FP8Codec
from actzip.codecs.quant import QuantCodec

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
QUANT_CONFIGS = [(b, s) for b in (1, 2, 4, 8) for s in ("minmax", "absmax") if not (b == 1 and s == "absmax")]
ROUNDINGS = ["nearest", "stochastic"]
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}


def raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(BITS[t.dtype]).cpu()


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
        "raw_bits": bits.to(BITS[dtype]).view(dtype),
        "overflowing_range": torch.tensor([-f.max, f.max] * 8, dtype=dtype),
    }
    return {k: v.to(device) for k, v in cases.items()}
