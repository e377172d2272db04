import itertools
import math

import pytest
import torch

from actzip.codecs.rvq import (
    CodebookDelta,
    CodebookDesyncError,
    RVQCodebook,
    RVQConfig,
    RVQLearner,
    codebook_checksum,
    straight_through,
)
from actzip.errors import ActzipError, ConfigError


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: see tests/conftest.py


def _clusters(n=2048, dim=4, centers=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(centers, dim, generator=g) * 2.0
    pick = torch.randint(centers, (n,), generator=g)
    return c[pick] + 0.05 * torch.randn(n, dim, generator=g)


def _train(book, learner, data, steps, receiver=None):
    for _ in range(steps):
        idx, _q, inputs = book.quantize(data)
        learner.observe(idx, inputs)
        learner.update()
        if receiver is not None:
            delta = learner.take_message()
            if delta is not None:
                receiver.apply_delta(delta)
    return float((book.quantize(data)[1] - data).square().mean())


@pytest.mark.parametrize(
    "field,value",
    [
        ("dim", 0),
        ("levels", 0),
        ("codebook_size", 1),
        ("decay", 1.0),
        ("tol", -1.0),
        ("delta_dtype", torch.int8),
        ("max_rows", 0),
    ],
)
def test_config_rejects_bad_values(field, value):
    kwargs = {"dim": 4, field: value}
    with pytest.raises(ConfigError, match=field):
        RVQConfig(**kwargs)


def test_bits_per_vector():
    assert RVQConfig(dim=8, levels=4, codebook_size=256).bits_per_vector == 32
    assert RVQConfig(dim=8, levels=3, codebook_size=100).bits_per_vector == 21


def test_quantize_is_a_sum_of_rows_and_residuals_shrink():
    cfg = RVQConfig(dim=4, levels=3, codebook_size=32, init_std=1.0)
    book = RVQCodebook(cfg)
    x = torch.randn(256, 4)
    idx, q, inputs = book.quantize(x)
    assert idx.shape == (256, 3) and inputs.shape == (3, 256, 4)
    assert torch.allclose(q, book.lookup(idx), atol=1e-6)
    assert torch.equal(inputs[0], x)
    errs = [float(inputs[level].square().sum()) for level in range(3)] + [float((x - q).square().sum())]
    assert all(b <= a for a, b in itertools.pairwise(errs))


@pytest.mark.parametrize("size", [256, 100, 2])
def test_payload_round_trip_and_exact_size(size):
    cfg = RVQConfig(dim=6, levels=3, codebook_size=size, init_std=1.0)
    sender, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    x = torch.randn(5, 7, 6)
    payload = sender.encode(x)
    assert payload.nbytes == math.ceil(35 * cfg.bits_per_vector / 8)
    out = receiver.decode(payload)
    _idx, q, _ = sender.quantize(x.reshape(-1, 6))
    assert out.shape == x.shape and torch.equal(out.reshape(-1, 6), q)


def test_learner_fits_clusters_and_receiver_tracks_it_bit_exactly():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=32, decay=0.8, dead_after=2, tol=1e-3, sync_every=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    data = _clusters()
    before = float((book.quantize(data)[1] - data).square().mean())
    after = _train(book, learner, data, 40, receiver)
    assert after < 0.05 * before
    assert torch.equal(receiver.codebook, book.codebook)
    assert receiver.version == book.version > 0
    assert receiver.checksum == book.checksum == codebook_checksum(book.codebook)


def test_deltas_carry_only_changed_rows():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=64, decay=0.5, dead_after=1000, tol=1e-2, sync_every=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    data = _clusters(centers=8)
    sizes = []
    for _ in range(30):
        idx, _, inputs = book.quantize(data)
        learner.observe(idx, inputs)
        learner.update()
        delta = learner.take_message()
        if delta is not None:
            sizes.append(delta.rows.numel())
            receiver.apply_delta(delta)
    full = cfg.levels * cfg.codebook_size
    assert sizes[0] == full  # the first update restarts every seeded row from data
    assert max(sizes[1:]) < full // 4  # then only rows that moved travel
    assert sum(sizes[-5:]) < sum(sizes[1:6])  # and fewer as the codebook settles
    assert torch.equal(receiver.codebook, book.codebook)


def test_max_rows_bounds_each_update_and_keeps_both_ends_in_sync():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=32, decay=0.5, dead_after=2, max_rows=5)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    data = _clusters()
    for _ in range(12):
        idx, _, inputs = book.quantize(data)
        learner.observe(idx, inputs)
        learner.update()
        delta = learner.take_message()
        assert delta is not None and delta.rows.numel() <= 5
        receiver.apply_delta(delta)
    assert torch.equal(receiver.codebook, book.codebook)


def test_sync_every_and_merged_pending_deltas():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=16, sync_every=2, dead_after=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    data = _clusters(n=512)
    idx, _, inputs = book.quantize(data)
    learner.observe(idx, inputs)
    assert learner.update() is None  # first of two updates: nothing published
    for _ in range(3):  # two publications, never taken in between: merged into one delta
        idx, _, inputs = book.quantize(data)
        learner.observe(idx, inputs)
        learner.update()
    delta = learner.take_message()
    assert delta.base_version == 0 and delta.version == book.version == 2
    receiver.apply_delta(delta)
    assert torch.equal(receiver.codebook, book.codebook)


def test_bfloat16_deltas_keep_both_ends_identical():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=16, delta_dtype=torch.bfloat16, dead_after=1, sync_every=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    _train(book, RVQLearner(book), _clusters(n=512), 5, receiver)
    assert torch.equal(receiver.codebook, book.codebook)
    assert torch.equal(book.codebook, book.codebook.bfloat16().float())


def test_desync_is_detected_and_a_snapshot_resyncs():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=16, dead_after=1, sync_every=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    data = _clusters(n=512)
    _train(book, learner, data, 3, receiver)
    x = data[:10]
    assert torch.equal(receiver.decode(book.encode(x)), book.quantize(x)[1])

    # A corrupted receiver row: the checksum no longer matches, decoding refuses.
    with torch.no_grad():
        receiver.codebook[1, 3, 0] += 1.0
    receiver.checksum = codebook_checksum(receiver.codebook)
    with pytest.raises(CodebookDesyncError, match="desync"):
        receiver.decode(book.encode(x))

    # A lost delta: the next one does not apply on top of the receiver's version.
    learner.request_resync()
    receiver.apply_delta(learner.take_message())  # full snapshot repairs it
    assert torch.equal(receiver.decode(book.encode(x)), book.quantize(x)[1])
    idx, _, inputs = book.quantize(data)
    learner.observe(idx * 0 + 1, inputs)  # force changes
    learner.update()
    lost = learner.take_message()
    assert lost is not None
    idx, _, inputs = book.quantize(data)
    learner.observe(idx, inputs)
    learner.update()
    nxt = learner.take_message()
    with pytest.raises(CodebookDesyncError, match="lost or reordered"):
        receiver.apply_delta(nxt)
    learner.request_resync()
    receiver.apply_delta(learner.take_message())
    assert torch.equal(receiver.codebook, book.codebook)


def test_tampered_delta_fails_its_checksum():
    cfg = RVQConfig(dim=4, levels=1, codebook_size=8, dead_after=1, sync_every=1)
    book, receiver = RVQCodebook(cfg), RVQCodebook(cfg)
    learner = RVQLearner(book)
    idx, _, inputs = book.quantize(_clusters(n=256))
    learner.observe(idx, inputs)
    learner.update()
    delta = learner.take_message()
    bad = CodebookDelta(delta.base_version, delta.version, delta.rows, delta.values + 1e-3, delta.checksum)
    with pytest.raises(CodebookDesyncError, match="checksum"):
        receiver.apply_delta(bad)
    x = torch.randn(4, 4)
    with pytest.raises(CodebookDesyncError):  # refused until resynchronized
        receiver.decode(book.encode(x))
    receiver.apply_delta(CodebookDelta.from_tensors(book.snapshot().to_tensors()))  # over the wire format
    assert torch.equal(receiver.codebook, book.codebook)
    assert torch.equal(receiver.decode(book.encode(x)), book.quantize(x)[1])


@pytest.mark.parametrize("field,value", [("levels", 3), ("codebook_size", 128), ("dim", 5)])
def test_config_mismatch_is_a_clear_error(field, value):
    base = {"dim": 4, "levels": 2, "codebook_size": 256}
    sender = RVQCodebook(RVQConfig(**base))
    receiver = RVQCodebook(RVQConfig(**{**base, field: value}))
    with pytest.raises(ConfigError, match=field) as info:
        receiver.decode(sender.encode(torch.randn(3, 4)))
    assert isinstance(info.value, ActzipError)


def test_straight_through_gradient_and_commitment():
    x = torch.randn(6, 4, requires_grad=True)
    q = torch.randn(6, 4)
    out = straight_through(x, q)
    assert torch.equal(out, q)
    g = torch.randn(6, 4)
    out.backward(g)
    assert torch.equal(x.grad, g)
    x.grad = None
    straight_through(x, q, commitment=0.5).backward(g)
    expected = g + 2 * 0.5 * (x.detach() - q) / x.numel()
    assert torch.allclose(x.grad, expected)


def test_state_dict_round_trip_keeps_version():
    cfg = RVQConfig(dim=4, levels=2, codebook_size=16, dead_after=1, sync_every=1)
    book = RVQCodebook(cfg)
    _train(book, RVQLearner(book), _clusters(n=256), 2)
    copy = RVQCodebook(cfg)
    copy.load_state_dict(book.state_dict())
    assert (copy.version, copy.checksum) == (book.version, book.checksum)
    assert torch.equal(copy.codebook, book.codebook)
