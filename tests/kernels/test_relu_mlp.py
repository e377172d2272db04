"""The relu-MLP backward kernels (:mod:`actzip.kernels.relu_mlp`) against their PyTorch oracles, bit for bit, and
their ``ok`` flag: a payload an arena refused gives NaN and is never read."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import actzip
from actzip.errors import ConfigError
from actzip.memory.modules import relu_mlp as R
from actzip.memory.modules.relu_mlp import activation_from_payload, relu_grad_from_payload

pytest.importorskip("triton")
from actzip.kernels import relu_mlp as K  # noqa: E402
from actzip.kernels import runtime  # noqa: E402

from kernel_cases import assert_bit_equal, random_tensor, special_values  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(runtime.unavailable_reason("cpu") is not None, reason="no interpreter")),
    pytest.param("cuda", marks=pytest.mark.cuda),
]
# bf16 arithmetic is not reproduced by Triton's CPU interpreter: 16-bit float arithmetic is checked on CUDA only,
# its bit moves and exactly representable results everywhere (test_16bit_*).
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


def random_cases(dtype, sign_pack, seed, count=3):
    """(shape, tile, codec, r, payload, grad): random shapes, tiles and densities; r and grad of every float
    class (NaN payloads, signalling ones too, +-inf, subnormals, -0.0; no sign bit in r with sign packing)."""
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        shape = (int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g)))
        tile = (64, 128, 256)[int(torch.randint(0, 3, (1,), generator=g))]
        density = (0.0, 0.2, 0.6, 1.0)[int(torch.randint(0, 4, (1,), generator=g))]
        r = random_tensor(shape, dtype, density, seed=seed + i, signed=not sign_pack)
        special = special_values(dtype, signed=not sign_pack)
        k = min(special.numel(), r.numel())
        r.view(-1)[:k] = special[:k]
        codec = actzip.codecs.get("sparse", tile_size=tile, sign_pack=sign_pack, check=False, kernel="torch")
        yield shape, tile, codec, r, codec.encode(r), random_tensor(shape, dtype, 0.9, seed=seed + 100 + i)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sign_pack", [False, True])
def test_16bit_bit_moves_match_oracle(device, dtype, sign_pack):
    # Decoding r and selecting the gradient move bits only: exact under the interpreter too.
    for shape, tile, codec, r, p, grad in random_cases(dtype, sign_pack, seed=11 + 2 * sign_pack):
        want_a = codec.decode(p)
        assert_bit_equal(want_a, r)
        b = {k: v.to(device) for k, v in p.buffers.items()}
        args = (b["mask"], b["tile_offsets"], b["values"], dtype, tile, sign_pack, False)
        assert_bit_equal(K.activation(*args[:3], shape, *args[3:]), want_a)
        # threshold_backward's select, as CUDA runs it; the CPU's vectorized one goes through float32 and
        # quiets signalling NaNs of grad, so it is no bit oracle here.
        want_g = torch.where(want_a <= 0, torch.zeros_like(grad), grad)
        got_g = K.relu_grad(grad.to(device), *args)
        if device == "cuda":
            assert_bit_equal(R.relu_grad_dense(grad.to(device), want_a.to(device), False), want_g)
        elif dtype == torch.bfloat16:
            # The interpreter holds bf16 as uint16 and compares it as unsigned integers: r <= 0 comes out right
            # for what a ReLU gives (sign clear, or NaN) and wrong for -0.0 and negatives, which the encoders'
            # ReLU and CUDA's never give (-0.0 becomes +0.0). Those are checked on CUDA.
            relu_like = ~torch.signbit(want_a) | want_a.isnan()
            got_g, want_g = got_g[relu_like], want_g[relu_like]
        assert_bit_equal(got_g, want_g)


def exact_operands(shape, dtype, g, signed):
    """m * 2**e with m < 16, e in -3..3, and zeros: r², 2r and grad * 2r are exact in bf16 and fp16, so any
    rounding gives PyTorch's result."""
    m = torch.randint(0, 16, shape, generator=g).float()
    x = m * torch.exp2(torch.randint(-3, 4, shape, generator=g).float())
    if signed:
        x = torch.where(torch.rand(shape, generator=g) < 0.5, -x, x)
    return x.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_squares_exact_when_representable(device, dtype):
    g = torch.Generator().manual_seed(3)
    for i, (shape, tile, sign_pack) in enumerate([((3, 150), 64, False), ((2, 333), 256, True)]):
        r = exact_operands(shape, dtype, g, signed=False)
        grad = exact_operands(shape, dtype, g, signed=True)
        codec = actzip.codecs.get("sparse", tile_size=tile, sign_pack=sign_pack, check=False, kernel="torch")
        b = {k: v.to(device) for k, v in codec.encode(r).buffers.items()}
        args = (b["mask"], b["tile_offsets"], b["values"], dtype, tile, sign_pack, True)
        assert_bit_equal(K.activation(*args[:3], shape, *args[3:]), r.square())
        assert_bit_equal(K.relu_grad(grad.to(device), *args), R.relu_grad_dense(grad, r, True))


def test_bad_dtype():
    with pytest.raises(ConfigError, match="float32, float16 or bfloat16"):
        K.activation(None, None, None, (4,), torch.float8_e4m3fn, 64, False, True)


# -- the ok flag in the backward kernels -----------------------------------------------------------------------


def relu_payload(shape, dtype, device, tile, sign_pack, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.relu((torch.randn(shape, generator=g) * 3).to(dtype))
    r = torch.where(torch.signbit(r), torch.zeros_like(r), r).to(device)  # no -0.0: sign packing drops the sign
    codec = actzip.codecs.get("sparse", tile_size=tile, sign_pack=sign_pack, check=False, kernel="torch")
    grad = (torch.randn(shape, generator=g) * 5).to(dtype).to(device)
    return r, codec.encode(r), codec, grad


def bits_of(t):
    return t.contiguous().view(-1).view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sign_pack", [False, True])
@pytest.mark.parametrize("tile", [64, 256, 1024])
def test_ok_flag_true_changes_no_bit_false_gives_nan(device, dtype, sign_pack, tile):
    rng = torch.Generator().manual_seed(tile + 7 * sign_pack + hash(str(dtype)) % 1000)
    for i in range(2):
        shape = (int(torch.randint(1, 4, (1,), generator=rng)), int(torch.randint(1, 700, (1,), generator=rng)))
        _, p, codec, grad = relu_payload(shape, dtype, device, tile, sign_pack, seed=i)
        b = p.buffers
        args = (b["mask"], b["tile_offsets"], b["values"], dtype, tile, sign_pack)
        # The values at an offset, as in an arena, with the flag as the encoder (int64) or reserve (bool) gives it.
        pad = 16 if sign_pack else 32
        shifted = torch.cat([torch.full((pad,), 5, dtype=b["values"].dtype, device=device), b["values"]])
        off = torch.tensor([pad], dtype=torch.int64, device=device)
        at = (b["mask"], b["tile_offsets"], shifted, dtype, tile, sign_pack)
        for square in (True, False):
            want_g = K.relu_grad(grad, *args, square)
            want_a = K.activation(*args[:3], shape, *args[3:], square)
            if device == "cuda" or dtype == torch.float32:  # 16-bit float arithmetic: exact on CUDA only
                assert torch.equal(bits_of(want_g), bits_of(R.relu_grad_from_payload(grad, p, codec, square)))
                assert torch.equal(bits_of(want_a), bits_of(R.activation_from_payload(p, codec, square)))
            for ok in (torch.ones(1, dtype=torch.int64, device=device), torch.ones(1, dtype=torch.bool, device=device)):
                got_g = K.relu_grad(grad, *at, square, values_offset=off, ok=ok)
                got_a = K.activation(*at[:3], shape, *at[3:], square, values_offset=off, ok=ok)
                assert torch.equal(bits_of(got_g), bits_of(want_g)) and torch.equal(bits_of(got_a), bits_of(want_a))
            refused = torch.zeros(1, dtype=torch.int64, device=device)
            assert K.relu_grad(grad, *at, square, values_offset=off, ok=refused).isnan().all()
            assert K.activation(*at[:3], shape, *at[3:], square, values_offset=off, ok=refused).isnan().all()


_NO_READ_SCRIPT = textwrap.dedent("""
    import sys, torch, actzip
    from actzip.kernels import relu_mlp as K
    device = sys.argv[1]
    for dtype in (torch.float32, torch.bfloat16):
        for sign_pack in (False, True):
            r = torch.relu(torch.randn(3, 300)).to(dtype).to(device)
            codec = actzip.codecs.get("sparse", tile_size=64, sign_pack=sign_pack, check=False, kernel="torch")
            b = codec.encode(r).buffers
            grad = torch.randn(3, 300).to(dtype).to(device)
            args = (b["mask"], b["tile_offsets"], b["values"], dtype, 64, sign_pack)
            # A values offset far past the buffer (unmapped memory): reading it would fault.
            kw = dict(values_offset=torch.tensor([1 << 40], device=device), ok=torch.zeros(1, device=device))
            for square in (True, False):
                assert K.relu_grad(grad, *args, square, **kw).isnan().all()
                assert K.activation(*args[:3], r.shape, *args[3:], square, **kw).isnan().all()
    if device == "cuda":
        torch.cuda.synchronize()
    print("NO-READ")
""")


@pytest.mark.parametrize("device", DEVICES)
def test_refused_payload_values_are_never_read(device):
    # In a fresh process: a regression faults (a segfault, or an illegal address on CUDA) and must not take
    # the test run down with it.
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(root, "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _NO_READ_SCRIPT, device], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "NO-READ" in done.stdout, (done.returncode, done.stderr[-3000:])


@pytest.mark.parametrize("device", DEVICES)
def test_ok_flag_checked(device):
    _, p, _, grad = relu_payload((2, 70), torch.float32, device, 64, False, seed=0)
    b = p.buffers
    with pytest.raises(ConfigError, match="ok must be a one-element tensor"):
        K.relu_grad(grad, b["mask"], b["tile_offsets"], b["values"], torch.float32, 64, False, True,
                    ok=torch.ones(2, device=device))
