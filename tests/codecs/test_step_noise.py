"""Step noise: a device-side offset of the first key of every stochastic quant encode while it is active, the
same bits as moving the host key by as much (kernels and the PyTorch code alike), and nothing else changed."""

import pytest
import torch

from actzip.codecs.counter_rng import stream_keys
from actzip.codecs.quant import QuantCodec
from actzip.codecs.step_noise import StepNoise, current_offset
from actzip.kernels import quant as K

M32 = 0xFFFFFFFF


def test_offsets_are_made_per_device_on_first_use_advanced_together_and_scoped_to_the_block():
    noise = StepNoise()
    assert current_offset(torch.device("cpu")) is None
    with noise:
        off = current_offset(torch.device("cpu"))
        assert off.dtype == torch.int32 and off.tolist() == [0]
        noise.advance()
        noise.advance()
        assert current_offset(torch.device("cpu")) is off and off.tolist() == [2]
        inner = StepNoise()
        with inner:
            assert current_offset(torch.device("cpu")).tolist() == [0]  # the innermost one answers
        assert current_offset(torch.device("cpu")) is off
    assert current_offset(torch.device("cpu")) is None


@pytest.mark.parametrize("offset", [3, -5, 1 << 30])
def test_the_pytorch_code_moves_the_first_key_by_the_offset_modulo_2_32(offset):
    x = torch.randn(3, 200)
    noisy, moved = QuantCodec(bits=4, seed=11, kernel="torch"), QuantCodec(bits=4, seed=11, kernel="torch")
    k0, k1 = stream_keys(11, 0)
    moved._next_keys = lambda: ((k0 + offset) & M32, k1)
    with StepNoise() as noise:
        noise.offset(torch.device("cpu")).fill_(offset)
        a = noisy.encode(x)
    b = moved.encode(x)
    assert torch.equal(a.buffers["codes"], b.buffers["codes"])
    plain = QuantCodec(bits=4, seed=11, kernel="torch").encode(x)
    assert not torch.equal(plain.buffers["codes"], a.buffers["codes"])  # the offset changed the draw


def test_nearest_rounding_ignores_the_offset():
    x = torch.randn(4, 256)
    with StepNoise() as noise:
        noise.offset(torch.device("cpu")).fill_(9)
        a = QuantCodec(bits=4, rounding="nearest", kernel="torch").encode(x)
    b = QuantCodec(bits=4, rounding="nearest", kernel="torch").encode(x)
    assert torch.equal(a.buffers["codes"], b.buffers["codes"])


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_adds_the_offset_on_the_device_as_the_host_key_would(bits, dtype):
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on a CPU
    torch.manual_seed(bits)
    x = torch.randn(1000, device=device).to(dtype)
    k0, k1 = 0xFFFFFFF0, 12345  # the offset wraps the first key past 2**32
    for offset in (0, 7, 40):
        noise = torch.tensor([offset], dtype=torch.int32, device=device)
        got = K.quant_encode(x, bits, 128, False, True, (k0, k1), noise=noise)
        want = K.quant_encode(x, bits, 128, False, True, ((k0 + offset) & M32, k1))
        assert all(torch.equal(got[name], want[name]) for name in want)
        ref = QuantCodec(bits=bits, seed=0, kernel="torch", check=False)
        ref._next_keys = lambda: ((k0 + offset) & M32, k1)
        assert torch.equal(ref.encode(x.cpu()).buffers["codes"].to(device), got["codes"])
