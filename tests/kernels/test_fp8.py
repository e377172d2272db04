"""The fp8 codec's Triton kernels (:mod:`actzip.kernels.fp8`) against its PyTorch implementation, bit for bit.

Every case runs on the CPU under Triton's interpreter (see conftest.py) and on CUDA when there is a GPU. The
kernels compute in float32 (minima and maxima, which are exact, in the input dtype on a GPU) and make fp8 codes
with integer operations; where the interpreter's bfloat16 handling differs from PyTorch's they take an exact
equivalent (``HW`` false), so the interpreter computes the same bits as a GPU and everything is compared exactly
on both.
"""

import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.codecs.fp8 import FP8Codec  # noqa: E402

from kernel_cases import DEVICES  # noqa: E402  (CPU under the interpreter, and CUDA)
from quant_cases import DTYPES, ROUNDINGS, check_paths, fp8, random_input  # noqa: E402

# Arithmetic on padding rows and on inf/NaN groups is what the format asks for; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


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


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_representable_values_round_trip(device):
    for fmt, f8 in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        values = torch.arange(256).to(torch.uint8).view(f8).float()
        x = values[torch.isfinite(values)].mul(2.0**-5).to(device)
        for gran in ("tensor", "group"):
            codec = FP8Codec(format=fmt, granularity=gran, group_size=32, kernel="triton")
            assert torch.equal(codec.decode(codec.encode(x)), x)
