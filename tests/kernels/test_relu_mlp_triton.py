"""The relu-MLP backward kernels against their PyTorch oracles, bit for bit."""

import pytest
import torch

import actzip
from actzip.memory.relu_mlp import activation_from_payload, relu_grad_from_payload

pytest.importorskip("triton")
from actzip.kernels import relu_mlp_triton as K  # noqa: E402
from actzip.kernels import runtime  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(runtime.unavailable_reason("cpu") is not None, reason="no interpreter")),
    pytest.param("cuda", marks=pytest.mark.cuda),
]
# bf16 arithmetic is not reproduced by Triton's CPU interpreter: 16-bit floats are checked on CUDA only.
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.cuda), pytest.param(torch.float16, marks=pytest.mark.cuda)]


def pre_activation(shape, dtype, device, g):
    h = torch.randn(shape, generator=g) * 3
    h = h.to(dtype)
    flat = h.view(-1)
    # The corner cases of relu and its gradient: -0.0, +0.0, NaN, +-inf, huge values.
    special = torch.tensor([-0.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e-30]).to(dtype)
    flat[: special.numel()] = special[: flat.numel()]
    return h.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("square", [True, False])
@pytest.mark.parametrize("shape,tile", [((3, 100), 64), ((7, 129), 256), ((1,), 64), ((0, 5), 64)])
def test_kernels_match_oracle(device, dtype, sign_pack, square, shape, tile):
    g = torch.Generator().manual_seed(hash((shape, tile, sign_pack, square)) % 2**31)
    r = torch.relu(pre_activation(shape, dtype, device, g))
    codec = actzip.codecs.get("sparse", tile_size=tile, sign_pack=sign_pack, check=False, kernel="torch")
    if sign_pack:
        r = torch.where(torch.signbit(r), torch.zeros_like(r), r)  # sign packing needs no sign bit set
    p = codec.encode(r)
    grad = (torch.randn(shape, generator=g) * 5).to(dtype).to(device)
    b = p.buffers
    want_g = relu_grad_from_payload(grad, p, codec, square)
    got_g = K.relu_grad(grad, b["mask"], b["tile_offsets"], b["values"], dtype, tile, sign_pack, square)
    assert torch.equal(got_g.view(-1).view(torch.uint8), want_g.contiguous().view(-1).view(torch.uint8))
    want_a = activation_from_payload(p, codec, square)
    got_a = K.activation(b["mask"], b["tile_offsets"], b["values"], r.shape, dtype, tile, sign_pack, square)
    assert torch.equal(got_a.view(-1).view(torch.uint8), want_a.contiguous().view(-1).view(torch.uint8))


def test_bad_dtype():
    from actzip.errors import ConfigError

    with pytest.raises(ConfigError, match="float32, float16 or bfloat16"):
        K.activation(None, None, None, (4,), torch.float8_e4m3fn, 64, False, True)
