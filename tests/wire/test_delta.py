"""AQ-SGD-style delta codec: both ends' caches agree, the error shrinks with the change, desync is refused."""

import pytest
import torch

from actzip.errors import ConfigError
from actzip.wire.codecs import WireCodec
from actzip.wire.delta import DeltaCodec
from actzip.wire.transport import WireDesyncError


def test_caches_agree_and_receiver_tracks_the_sender():
    send, recv = DeltaCodec(bits=4, seed=1), DeltaCodec(bits=4)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, 32, generator=g)
    ids = torch.tensor([10, 11, 12, 13, 14, 15])
    errors = []
    for epoch in range(6):
        x = base + 0.01 * epoch * torch.randn(base.shape, generator=g)  # slowly drifting activations
        p = send.encode(x, ids)
        y = recv.decode(p, ids)
        errors.append(float((y - x).abs().max()))
        for i in ids.tolist():
            assert torch.equal(send._cache[i], recv._cache[i])  # bit-identical at both ends
    assert errors[-1] < errors[0] / 5  # the step scales with the change, not the activation
    assert send.cached_samples == recv.cached_samples == 6
    assert send.cache_nbytes() == 6 * 5 * 32 * 4


def test_first_visit_is_plain_quantization_and_bounded():
    send, recv = DeltaCodec(bits=8), DeltaCodec(bits=8)
    x = torch.randn(4, 256)
    y = recv.decode(send.encode(x, [0, 1, 2, 3]), [0, 1, 2, 3])
    step = (x.view(-1, 128).amax(1) - x.view(-1, 128).amin(1)) / 255
    assert ((y - x).abs().view(-1, 128) <= step[:, None] * 1.0001).all()


def test_unbiased_on_average():
    x = torch.randn(2, 128)
    total = torch.zeros_like(x)
    n = 200
    for s in range(n):
        send, recv = DeltaCodec(bits=2, seed=s), DeltaCodec(bits=2)
        total += recv.decode(send.encode(x, [0, 1]), [0, 1])
    step = (x.view(-1, 128).amax(1) - x.view(-1, 128).amin(1)).max() / 3
    assert (total / n - x).abs().max() < 4 * step / n**0.5


def test_payload_bytes_are_the_quantized_change_plus_visit_counts():
    send = DeltaCodec(bits=4, group_size=64)
    p = send.encode(torch.randn(3, 128), [7, 8, 9])
    assert p.nbytes == 3 * 128 // 2 + (3 * 128 // 64) * 8 + 3 * 4


def test_without_ids_nothing_is_cached():
    send, recv = DeltaCodec(), DeltaCodec()
    x = torch.randn(2, 64)
    p = send.encode(x)
    assert "visits" not in p.buffers and not p.meta["cached"]
    assert recv.decode(p).shape == x.shape and send.cached_samples == recv.cached_samples == 0


def test_a_stale_cache_is_refused():
    send, recv = DeltaCodec(), DeltaCodec()
    x = torch.randn(2, 64)
    recv.decode(send.encode(x, [0, 1]), [0, 1])
    recv.clear()  # the receiver restarted
    with pytest.raises(WireDesyncError, match=r"sample\(s\) 0 \(sender 1, receiver 0\)"):
        recv.decode(send.encode(x, [0, 1]), [0, 1])
    with pytest.raises(WireDesyncError, match="no sample ids"):
        recv.decode(send.encode(x, [5, 6]))


def test_bad_ids_are_named():
    d = DeltaCodec()
    with pytest.raises(ConfigError, match="2 samples along dimension 0 but 3 ids"):
        d.encode(torch.randn(2, 8), [0, 1, 2])
    with pytest.raises(ConfigError, match="repeat"):
        d.encode(torch.randn(2, 8), [4, 4])
    with pytest.raises(ConfigError, match="integer"):
        d.encode(torch.randn(2, 8), torch.tensor([0.0, 1.0]))


def test_boundary_codec_uses_it_forward_only():
    fwd = WireCodec("delta:bits=2", direction="fwd")
    assert fwd.needs_ids and fwd.describe()["codec"] == "delta"
    with pytest.raises(ConfigError, match="bwd codec 'delta' is not possible"):
        WireCodec("delta", direction="bwd")
    with pytest.raises(ConfigError, match="delta"):
        WireCodec("delta:bitz=2", direction="fwd")
