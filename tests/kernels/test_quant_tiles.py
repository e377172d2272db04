"""The shared tile layout of the quant and fp8 kernels (:mod:`actzip.kernels.quant_tiles`): launch shapes change
no byte, and bfloat16 is stored as PyTorch rounds it.
"""

import math

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from actzip.errors import ConfigError  # noqa: E402
from actzip.kernels import fp8 as F8  # noqa: E402
from actzip.kernels import quant as K  # noqa: E402
from actzip.kernels import quant_tiles as tiles  # noqa: E402

from kernel_cases import DEVICES  # noqa: E402  (CPU under the interpreter, and CUDA)
from quant_cases import assert_same_bits, assert_same_values  # noqa: E402

# Arithmetic on padding rows and on inf/NaN groups is what the format asks for; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_launch_shapes_make_the_same_bytes(device, dtype):
    # Several tiles, most of them whole (the unmasked path), and a partial last group; the interpreter runs each
    # program in Python, so on the CPU the tensor and the largest tile are smaller (the same cases, fewer tiles)
    g = torch.Generator().manual_seed(4)
    cpu = device == "cpu"
    x = torch.randn((2 if cpu else 5) * 1024 + 77, generator=g).mul(3).to(dtype).to(device)
    shapes = [{"tile": 256, "warps": 1, "group_threads": 1}, {"tile": 1024, "warps": 2, "group_threads": 8},
              {"tile": 2048 if cpu else 8192, "warps": 8, "group_threads": 2}]  # fmt: skip
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


@triton.jit
def _bf16_store_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, HW: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tiles.store_f32(out_ptr, offs, tl.load(x_ptr + offs, mask=offs < n), offs < n, True, HW)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_store_rounds_like_pytorch(device):
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-(2**31), 2**31 - 1, (4096,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([x, torch.tensor([math.inf, -math.inf, 3.3961e38, -0.0, 1e-45])])
    out = torch.empty(x.numel(), dtype=torch.int16, device=device)
    _bf16_store_kernel[(-(-x.numel() // 1024),)](x.to(device), out, x.numel(), BLOCK=1024, HW=not tiles.INTERPRETED)
    assert_same_values(out.cpu().view(torch.bfloat16), x.to(torch.bfloat16))
