"""What the kernel tests share: the devices they run on, the dtypes, and random raw bit patterns."""

import math
from types import SimpleNamespace

import pytest
import torch

from actzip.codecs.sparse import SparseCodec
from actzip.core.dtypes import bit_view_dtype
from actzip.kernels import runtime

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, *FP8]

DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not runtime.interpreter_enabled(),
            reason="CPU cases run under Triton's interpreter, which is off (TRITON_INTERPRET unset: a GPU is present)",
        ),
    ),
    pytest.param("cuda", marks=pytest.mark.cuda),
]


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(bit_view_dtype(x.dtype))


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(bits(a).cpu(), bits(b).cpu())


def random_tensor(shape, dtype, density, seed, signed=True, device="cpu"):
    """Random raw bit patterns (every float class: NaN payloads, inf, subnormals, -0.0) at a given density."""
    g = torch.Generator().manual_seed(seed)
    nbits = dtype.itemsize * 8
    n = math.prod(shape)
    raw = torch.randint(0, 1 << min(nbits, 62), (n,), generator=g, dtype=torch.int64)
    if not signed:
        raw &= (1 << (nbits - 1)) - 1
    keep = torch.rand(n, generator=g) < density
    raw = torch.where(keep, raw, 0)
    w = bit_view_dtype(dtype)
    if w is not torch.uint8 and nbits < 64:
        raw = torch.where(raw >= 1 << (nbits - 1), raw - (1 << nbits), raw)
    return raw.to(w).view(dtype).reshape(shape).to(device)


def special_values(dtype: torch.dtype, signed: bool = True) -> torch.Tensor:
    """-0.0, +-smallest subnormal, +-max, NaNs with payloads (both signs), +-inf where the format has it."""
    nbits = dtype.itemsize * 8
    top = 1 << (nbits - 1)
    exp_all = {torch.float32: 0x7F800000, torch.float16: 0x7C00, torch.bfloat16: 0x7F80}.get(dtype)
    raw = [1, 2, top - 1, top - 2, 0x7F, 0]  # subnormals, NaN payloads (max patterns), +0.0
    if exp_all is not None:
        raw += [exp_all, exp_all | 1, exp_all | 3]  # inf, signalling NaN payloads
    if dtype == torch.float8_e5m2:
        raw += [0x7C, 0x7D, 0x7E]  # inf and NaNs
    if signed:
        raw += [r | top for r in raw]  # -0.0, negative subnormals, -inf, negative NaNs
    raw_t = torch.tensor(raw, dtype=torch.int64)
    w = bit_view_dtype(dtype)
    if w is not torch.uint8:
        raw_t = torch.where(raw_t >= top, raw_t - (1 << nbits), raw_t)
    return raw_t.to(w).view(dtype)


def oracle(x: torch.Tensor, tile: int, sign_pack: bool):
    """The PyTorch codec's buffers and counts, under the Triton encoders' names."""
    p = SparseCodec(tile_size=tile, sign_pack=sign_pack, check=False, kernel="torch").encode(x.reshape(-1))
    b = p.buffers
    raw = bits(x).reshape(-1).to(torch.int64)
    return SimpleNamespace(mask=b["mask"], tile_offsets=b["tile_offsets"], values=b["values"],
                           total=b["values"].numel(), nnz=p.meta["nnz"],
                           sign_set=int(((raw >> (8 * x.element_size() - 1)) & 1).sum()))


def relu_by_bits(h: torch.Tensor) -> torch.Tensor:
    """torch's relu as CUDA computes it, by selection only: NaN passes with its payload and sign, -0.0 gives +0.0
    (the CPU's relu keeps -0.0)."""
    return torch.where((h > 0) | h.isnan(), h, torch.zeros_like(h))
