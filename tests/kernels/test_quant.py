"""The quant codec's Triton kernels (:mod:`actzip.kernels.quant`), and what both lossy codecs' kernels do
alike, against their PyTorch implementation, bit for bit.

Every case runs on the CPU under Triton's interpreter (see conftest.py) and on CUDA when there is a GPU. The
kernels compute in float32 (minima and maxima, which are exact, in the input dtype on a GPU) and make fp8 codes
with integer operations; where the interpreter's bfloat16 handling differs from PyTorch's they take an exact
equivalent (``HW`` false), so the interpreter computes the same bits as a GPU and everything is compared exactly
on both.
"""

import math
import random

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'actzip[triton]')")

from actzip.codecs.fp8 import FP8Codec  # noqa: E402
from actzip.codecs.quant import QuantCodec  # noqa: E402
from actzip.errors import ConfigError, InvalidValueError, KernelUnavailableError  # noqa: E402
from actzip.kernels import fp8 as F8  # noqa: E402
from actzip.kernels import quant as K  # noqa: E402
from actzip.kernels import quant_tiles as tiles  # noqa: E402
from actzip.kernels import runtime  # noqa: E402

from kernel_cases import DEVICES  # noqa: E402  (CPU under the interpreter, and CUDA)
from quant_cases import (  # noqa: E402
    DTYPES,
    QUANT_CONFIGS,
    ROUNDINGS,
    check_paths,
    fp8,
    quant,
    random_input,
    special_inputs,
)

# Arithmetic on padding rows and on inf/NaN groups is what the format asks for; numpy (the interpreter) warns.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


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
    with pytest.raises(KernelUnavailableError, match=r"quant\(kernel='triton'\).*float64 has no Triton kernel"):
        QuantCodec(kernel="triton").encode(torch.ones(4, dtype=torch.float64))
    p = FP8Codec(granularity="group", group_size=8192, kernel="torch").encode(torch.ones(10000))
    with pytest.raises(KernelUnavailableError, match=r"group_size=8192 is above the kernels' largest"):
        FP8Codec(kernel="triton").decode(p)


def test_triton_unavailable_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(runtime, "unavailable_reason", lambda device: "no GPU here")
    with pytest.raises(KernelUnavailableError, match=r"fp8\(kernel='triton'\) cannot run: no GPU here"):
        FP8Codec(kernel="triton").encode(torch.ones(4))
    QuantCodec(kernel="auto").encode(torch.ones(4))  # auto on the CPU: PyTorch, no warning needed


def test_wrappers_check_their_inputs():
    with pytest.raises(ConfigError, match="contiguous 1-D"):
        K.quant_encode(torch.zeros(4, 4), 4, 8, False, False)
    with pytest.raises(ConfigError, match="float32, float16 and bfloat16"):
        F8.fp8_encode(torch.zeros(4, dtype=torch.float64), "e4m3", None, False)
    with pytest.raises(ConfigError, match="multiple of 8 from 8 to 4096"):
        tiles.check_group_size(12)
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
