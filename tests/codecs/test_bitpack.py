import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from actzip.codecs.bitpack import pack_bits, pack_bool, unpack_bits, unpack_bool


@given(n=st.integers(0, 300).map(lambda k: 8 * k), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_bool_round_trip(n, seed):
    g = torch.Generator().manual_seed(seed)
    flags = torch.rand(n, generator=g) < 0.3
    packed = pack_bool(flags)
    assert packed.dtype == torch.uint8 and packed.numel() == n // 8
    assert torch.equal(unpack_bool(packed), flags)


def test_bool_bit_order_is_little_endian():
    flags = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1], dtype=torch.bool)
    assert pack_bool(flags).tolist() == [1, 2 + 128]


def test_pack_bool_rejects_partial_byte():
    with pytest.raises(ValueError):
        pack_bool(torch.ones(7, dtype=torch.bool))


@given(
    n=st.integers(0, 500),
    width=st.sampled_from([1, 3, 7, 8, 15, 16, 31, 32, 63]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=60, deadline=None)
def test_bits_round_trip(n, width, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64)
    values = raw & ((1 << width) - 1)
    packed = pack_bits(values, width)
    assert packed.numel() == (n * width + 7) // 8
    assert torch.equal(unpack_bits(packed, n, width, torch.int64), values)


def test_bits_full_width_signed_reads_back_twos_complement():
    v = torch.tensor([-1, -32768, 32767, 0, 5], dtype=torch.int16)
    packed = pack_bits(v.to(torch.int64) & 0xFFFF, 16)
    assert torch.equal(unpack_bits(packed, 5, 16, torch.int16), v)


def test_bits_stream_layout():
    # Two 3-bit values 0b101 and 0b011 -> stream bits 1,0,1,1,1,0 -> byte 0b00011101.
    assert pack_bits(torch.tensor([5, 3]), 3).tolist() == [0b00011101]


def test_narrow_widths_keep_the_stream_layout():
    # Widths dividing a byte take a vectorized path; the layout must be the general one.
    assert pack_bits(torch.tensor([1, 2, 3, 0]), 2).tolist() == [1 | 2 << 2 | 3 << 4]
    v = torch.randint(0, 16, (63,))
    fast = pack_bits(torch.cat([v, v[:1]]), 4)  # 64 values: the vectorized path
    slow = pack_bits(v, 4)  # 63 values: the general path
    assert torch.equal(fast[:31], slow[:31])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
@pytest.mark.parametrize("offset", [0, 3, 8])
def test_bool_word_path_matches_the_byte_weights(device, offset):
    # 64-bit word tricks on aligned tensors, byte weights elsewhere: the same bytes either way
    g = torch.Generator().manual_seed(offset)
    for n in (8, 64, 8 * 4097):
        base = (torch.rand(n + offset, generator=g) < 0.4).to(device)
        flags = base[offset:offset + n - n % 8] if offset else base
        ref = (flags.reshape(-1, 8).to(torch.uint8)
               * torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)).sum(1, dtype=torch.uint8)
        packed = pack_bool(flags)
        assert torch.equal(packed, ref)
        back = unpack_bool(packed)
        assert back.dtype == torch.bool and torch.equal(back, flags)
    every = torch.arange(256, dtype=torch.uint8, device=device)  # each byte value spreads and gathers back
    assert torch.equal(pack_bool(unpack_bool(every)), every)
