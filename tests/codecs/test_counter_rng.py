"""The counter-based random stream (:mod:`actzip.codecs.counter_rng`): reproducible, keyed, and never the global RNG."""

import torch

from actzip.codecs.counter_rng import hash_uniform, mix32, round_bits, round_bits_like, stream_keys


def test_stream_keys_are_32_bit_and_differ_by_seed_and_count():
    keys = {stream_keys(seed, count) for seed in range(4) for count in range(4)}
    assert len(keys) == 16 and all(0 <= k < 2**32 for pair in keys for k in pair)
    assert stream_keys(3, 2) == stream_keys(3, 2)


def test_mix32_is_a_32_bit_hash_in_place():
    h = torch.tensor([0, 1, 2**32 - 1], dtype=torch.int64)
    out = mix32(h)
    assert out is h and out[0] == 0 and ((out >= 0) & (out < 2**32)).all() and out[1] != out[2]


def test_round_bits_are_15_bit_and_the_layout_takes_pairs_in_order():
    keys = stream_keys(11, 0)
    pairs = torch.arange(8, dtype=torch.int64)
    r = round_bits(pairs, keys)
    assert r.shape == (8, 2) and ((r >= 0) & (r < 2**15)).all()
    assert torch.equal(round_bits(pairs, keys, wide=False), r)  # every p < 2**32: the high part is 0
    assert torch.equal(round_bits_like(torch.zeros(3, 5), keys), r.view(-1)[:15].view(3, 5))


def test_hash_uniform_is_on_the_grid_and_the_global_rng_is_untouched():
    state = torch.get_rng_state()
    u = hash_uniform(torch.arange(10_000, dtype=torch.int64), stream_keys(0, 0))
    assert u.dtype == torch.float32 and ((u >= 0) & (u < 1)).all()
    assert torch.equal(u * 2**24, (u * 2**24).round())
    assert abs(float(u.mean()) - 0.5) < 0.02
    assert torch.equal(torch.get_rng_state(), state)
