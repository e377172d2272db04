"""The wire transport: message format, exact byte metering, handshake, and faults (one process and gloo)."""

import os
import struct
import time

import pytest
import torch
from gloo_ranks import run_ranks

import actzip
from actzip.errors import ConfigError
from actzip.wire.transport import (
    HEADER_BYTES,
    SCHEMA_SLOTS,
    LoopbackHub,
    Transport,
    WireConfigMismatchError,
    WireDesyncError,
    WirePeerError,
    WireTimeoutError,
)


def pair(cfg_a=None, cfg_b=None):
    hub = LoopbackHub()
    a, b = Transport(hub.backend(0), 0), Transport(hub.backend(1), 1)
    a.send_hello(1, cfg_a or {"codec": "none"})
    b.send_hello(0, cfg_b or {"codec": "none"})
    return hub, a, b


def shake(cfg_a=None, cfg_b=None):
    hub, a, b = pair(cfg_a, cfg_b)
    a.check_hello(1)
    b.check_hello(0)
    return hub, a, b


def counting(backend):
    """Wrap a backend's send so that every byte handed to it is counted independently of the meter."""
    sent = {"bytes": 0, "calls": 0}
    orig = backend.send

    def send(peer, data, what):
        sent["bytes"] += data.numel() * data.element_size()
        sent["calls"] += 1
        return orig(peer, data, what)

    backend.send = send
    return sent


def test_header_is_fixed_size():
    assert HEADER_BYTES == 48


def test_round_trip_of_tensors_and_payloads():
    _, a, b = shake()
    x = torch.randn(3, 5, 7)
    ids = torch.randint(0, 1000, (3, 5))
    flags = torch.rand(13) > 0.5
    half = torch.randn(4, 6).bfloat16().t()  # non-contiguous
    p = actzip.codecs.get("quant", bits=4).encode(torch.randn(8, 64).t())  # meta with a permutation tuple
    a.send(1, {"x": x, "ids": ids, "flags": flags, "half": half, "p": p}, channel="fwd")
    m = b.recv(0, channel="fwd")
    assert list(m.items) == ["x", "ids", "flags", "half", "p"]
    assert torch.equal(m.items["x"], x) and torch.equal(m.items["ids"], ids)
    assert m.items["flags"].dtype == torch.bool and torch.equal(m.items["flags"], flags)
    assert torch.equal(m.items["half"], half)
    got = m.items["p"]
    assert got.meta == p.meta and got.shape == p.shape and got.dtype == p.dtype
    assert torch.equal(actzip.codecs.get("quant", bits=4).decode(got), actzip.codecs.get("quant").decode(p))


def test_meter_counts_every_byte_handed_to_the_backend_and_both_ends_agree():
    hub = LoopbackHub()
    a, b = Transport(hub.backend(0), 0), Transport(hub.backend(1), 1)
    sent = counting(a.backend)
    a.send_hello(1, {"codec": "none"})
    b.send_hello(0, {"codec": "none"})
    a.check_hello(1)
    b.check_hello(0)
    total = 0
    for n in (1, 100, 3, 100, 0, 4096):  # variable sizes, repeated structures, an empty tensor
        total += a.send(1, {"x": torch.randn(n), "i": torch.arange(n)}, channel="fwd")
        b.recv(0, channel="fwd")
    for _ in range(2):  # an empty message: its schema ("[]", 4 + 2 bytes) once, then a bare header
        a.send(1, {}, channel="bwd")
        b.recv(0, channel="bwd")
    assert a.meter.total("sent", "fwd") == total == b.meter.total("received", "fwd")
    assert a.meter.sent["bwd"].total == 2 * HEADER_BYTES + 6 == b.meter.received["bwd"].total
    assert a.meter.total("sent") == sent["bytes"]  # hello + data, headers included
    assert a.meter.total("sent") == b.meter.total("received")


def test_schema_is_sent_once_per_structure():
    _, a, b = shake()
    first = a.send(1, {"x": torch.randn(64)}, channel="fwd")
    second = a.send(1, {"x": torch.randn(64)}, channel="fwd")
    assert second == HEADER_BYTES + 64 * 4  # header and data only
    assert first > second
    for _ in range(2):
        assert b.recv(0, channel="fwd").items["x"].shape == (64,)


def test_schema_cache_evicts_in_step_at_both_ends():
    _, a, b = shake()
    for n in list(range(1, SCHEMA_SLOTS + 10)) + [1, 2, SCHEMA_SLOTS + 5]:
        x = torch.arange(n, dtype=torch.float32)
        a.send(1, {"x": x}, channel="fwd")
        assert torch.equal(b.recv(0, channel="fwd").items["x"], x)


def test_config_mismatch_fails_on_both_ends_naming_the_field():
    _, a, b = pair({"fwd_codec": {"codec": "quant", "bits": 4}, "schedule": "1f1b"},
                   {"fwd_codec": {"codec": "quant", "bits": 8}, "schedule": "1f1b"})
    for t, peer in ((a, 1), (b, 0)):
        with pytest.raises(WireConfigMismatchError, match=r"fwd_codec\.bits: rank \d has 4, rank \d has 8|"
                                                        r"fwd_codec\.bits: rank \d has 8, rank \d has 4"):
            t.check_hello(peer)


def test_send_before_handshake_is_refused():
    hub = LoopbackHub()
    with pytest.raises(ConfigError, match="handshake"):
        Transport(hub.backend(0), 0).send(1, {"x": torch.ones(1)}, channel="fwd")


def test_out_of_order_and_codec_state_desync_are_caught():
    _, a, b = shake()
    a.send(1, {"x": torch.ones(2)}, channel="bwd")
    with pytest.raises(WireDesyncError, match="expected fwd message #0"):
        b.recv(0, channel="fwd")
    _, a, b = shake()
    a.send(1, {"x": torch.ones(2)}, channel="fwd", state=7)
    with pytest.raises(WireDesyncError, match="codec state"):
        b.recv(0, channel="fwd", state=8)


def test_garbage_header_is_caught():
    hub, _, b = shake()
    hub.queues[(0, 1)].append(torch.zeros(HEADER_BYTES, dtype=torch.uint8))
    with pytest.raises(WireDesyncError, match="does not start with an actzip wire header"):
        b.recv(0, channel="fwd")


def test_truncated_body_is_caught():
    hub, a, b = shake()
    a.send(1, {"x": torch.ones(8)}, channel="fwd")
    q = hub.queues[(0, 1)]
    header, body = q.popleft(), q.popleft()
    fields = list(struct.unpack("<4sBBBBIIQQQd", bytes(header)))
    fields[9] -= 4  # announce 4 bytes less
    q.extend([torch.frombuffer(bytearray(struct.pack("<4sBBBBIIQQQd", *fields)), dtype=torch.uint8), body[:-4]])
    with pytest.raises(WireDesyncError, match="too short"):
        b.recv(0, channel="fwd")


def test_loopback_receive_without_a_message_fails_at_once():
    _, _, b = shake()
    with pytest.raises(WireTimeoutError, match="none was sent"):
        b.recv(0, channel="fwd")


def test_a_payload_without_meta_arrives_whole():
    _, a, b = shake()
    p = actzip.codecs.get("cast").encode(torch.randn(3, 4))
    assert p.meta == {}
    a.send(1, {"p": p}, channel="fwd")
    got = b.recv(0, channel="fwd").items["p"]
    assert got.meta == {} and torch.equal(got.buffers["data"], p.buffers["data"]) and got.shape == p.shape


def test_unsendable_meta_is_named():
    _, a, _ = shake()
    p = actzip.codecs.Payload("quant", torch.Size([1]), torch.float32, torch.device("cpu"), {}, {"f": object()})
    with pytest.raises(actzip.errors.PayloadError, match="p.meta.f"):
        a.send(1, {"p": p}, channel="fwd")


# ---- gloo, one process per rank ----------------------------------------------------------------------------


def _exchange(rank, world):
    import torch.distributed as dist

    from actzip.wire.transport import DistBackend, Transport

    counted = {"bytes": 0}
    orig = dist.isend

    def isend(tensor, dst, group=None, tag=0):
        counted["bytes"] += tensor.numel() * tensor.element_size()
        return orig(tensor, dst, group=group, tag=tag)

    backend = DistBackend()  # connecting the neighbours' communicators sends a byte each way: not traffic
    dist.isend = isend
    t = Transport(backend, rank, timeout_s=10)
    t.handshake(1 - rank, {"fwd_codec": {"codec": "none"}})
    g = torch.Generator().manual_seed(0)
    shapes = [(int(n),) for n in torch.randint(1, 5000, (12,), generator=g)]
    p = actzip.codecs.get("mask", keep=0.25)
    ok = True
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=g)
        if rank == 0:
            t.send(1, {"x": x, "m": p.encode(x), "step": torch.tensor([i])}, channel="fwd")
            got = t.recv(1, channel="bwd").items["g"]
            ok &= torch.equal(got, 2 * x)
        else:
            m = t.recv(0, channel="fwd").items
            ok &= torch.equal(m["x"], x) and int(m["step"]) == i
            ok &= torch.equal(p.decode(m["m"]), actzip.codecs.get("mask", keep=0.25).decode(m["m"]))
            t.send(0, {"g": 2 * m["x"]}, channel="bwd")
    t.flush()
    return {"ok": bool(ok), "meter": t.meter.as_dict(), "isend_bytes": counted["bytes"]}


def test_gloo_variable_sizes_and_exact_bytes():
    r0, r1 = run_ranks(_exchange, 2)
    assert r0[0] == "ok" and r1[0] == "ok", (r0, r1)
    m0, m1 = r0[1]["meter"], r1[1]["meter"]
    assert r0[1]["ok"] and r1[1]["ok"]
    for ch in ("fwd", "bwd", "control"):  # what one end put on the wire is what the other took off
        assert m0["sent"][ch] == m1["received"][ch] and m1["sent"][ch] == m0["received"][ch]
    for r in (r0, r1):  # and it is exactly what was handed to torch.distributed.isend
        assert sum(c["total"] for c in r[1]["meter"]["sent"].values()) == r[1]["isend_bytes"]


def _mismatch(rank, world):
    from actzip.wire.transport import DistBackend, Transport

    t = Transport(DistBackend(), rank, timeout_s=10)
    t.handshake(1 - rank, {"bwd_codec": {"codec": "quant", "bits": 8 if rank else 4}})


def test_gloo_config_mismatch_is_an_error_on_both_ranks():
    reports = run_ranks(_mismatch, 2)
    for rank, r in enumerate(reports):
        assert r[0] == "error" and r[1] == "WireConfigMismatchError", r
        assert "bwd_codec.bits" in r[2] and "has 4" in r[2] and "has 8" in r[2]


def _silent_peer(rank, world):
    from actzip.wire.transport import DistBackend, Transport

    t = Transport(DistBackend(), rank, timeout_s=1.5)
    t.handshake(1 - rank, {})
    if rank == 1:
        time.sleep(3.5)  # alive but silent
        return None
    t0 = time.monotonic()
    try:
        t.recv(1, channel="fwd")
    except Exception as e:  # noqa: BLE001 - the test looks at the type and message
        first = (type(e).__name__, str(e), time.monotonic() - t0)
    try:
        t.recv(1, channel="fwd")
    except Exception as e:  # noqa: BLE001
        return first, (type(e).__name__, str(e))


def test_gloo_silent_peer_times_out_in_bounded_time():
    r0, r1 = run_ranks(_silent_peer, 2)
    assert r0[0] == "ok" and r1[0] == "ok", (r0, r1)
    (kind, msg, waited), (kind2, msg2) = r0[1]
    assert kind == "WireTimeoutError" and "waited 1.5 s" in msg and "from rank 1" in msg
    assert 1.2 < waited < 4
    assert kind2 == "WireTimeoutError" and "earlier receive failed" in msg2  # never reads a stale stream


def _dead_peer(rank, world):
    from actzip.wire.transport import DistBackend, Transport

    t = Transport(DistBackend(), rank, timeout_s=20)
    t.handshake(1 - rank, {})
    if rank == 1:
        time.sleep(0.5)
        os._exit(3)  # dies without a word
    t0 = time.monotonic()
    t.recv(1, channel="fwd")
    return time.monotonic() - t0


def test_gloo_dead_peer_is_an_error_at_once():
    r0, r1 = run_ranks(_dead_peer, 2)
    assert r0[0] == "error" and r0[1] == "WirePeerError", r0
    assert "rank 1 went away" in r0[2] and r0[3] < 10  # far below the 20 s timeout
    assert r1[0] == "exited" and r1[1] == 3


def _ahead(rank, world):
    from actzip.wire.transport import DistBackend, Transport

    t = Transport(DistBackend(), rank, timeout_s=10)
    t.handshake(1 - rank, {})
    xs = [torch.arange(n, dtype=torch.float32) for n in (3, 5000, 7)]
    if rank == 0:
        t0, sent = time.monotonic(), []
        for x in xs[:2]:
            t.send(1, {"x": x}, channel="fwd")
            t.flush()  # over gloo a send completes once the receiver has posted its receive
            sent.append(time.monotonic() - t0)
        t.send(1, {"x": xs[2]}, channel="fwd")
        t.abort([1], "boom")
        return {"sent_s": sent, "meter": t.meter.as_dict()}
    t.expect(0, 4)  # two messages, then the third, then what turns out to be an abort
    time.sleep(1.5)  # computing: the first message is received meanwhile
    t0 = time.monotonic()
    got = [t.recv(0, channel="fwd").items["x"] for _ in range(3)]
    first = time.monotonic() - t0
    try:
        t.recv(0, channel="fwd")
        error = None
    except Exception as e:  # noqa: BLE001 - the test looks at the type and message
        error = (type(e).__name__, str(e))
    return {"ok": all(torch.equal(g, x) for g, x in zip(got, xs)), "recv_s": first, "error": error,
            "meter": t.meter.as_dict()}


def test_gloo_messages_are_received_ahead_in_order_and_an_abort_still_arrives():
    r0, r1 = run_ranks(_ahead, 2)
    assert r0[0] == "ok" and r1[0] == "ok", (r0, r1)
    assert r1[1]["ok"]
    # the receiver posted its receive before it asked for the message: the sender's first send completed during
    # the receiver's 1.5 s of compute; the second only once the first was taken (one ahead at a time)
    first, second = r0[1]["sent_s"]
    assert first < 1.0 < second and r1[1]["recv_s"] < 1.0
    assert r1[1]["error"][0] == "WirePeerError" and "boom" in r1[1]["error"][1]
    for ch in ("fwd", "control"):  # received ahead or not, the meters agree
        assert r0[1]["meter"]["sent"][ch] == r1[1]["meter"]["received"][ch]


def test_a_prefetch_hands_over_its_value_its_error_or_a_timeout():
    from actzip.wire.prefetch import Prefetch

    assert Prefetch(lambda: 42, "t").result(5.0, "the answer") == 42

    def fail():
        raise WirePeerError("rank 3 went away")

    with pytest.raises(WirePeerError, match="went away"):
        Prefetch(fail, "t").result(5.0, "a message")
    with pytest.raises(WireTimeoutError, match="a slow message did not arrive within 0.1 s"):
        Prefetch(lambda: time.sleep(1.0), "t").result(0.1, "a slow message")


def test_a_loopback_transport_does_not_receive_ahead():
    hub, a, b = shake()
    b.expect(0, 3)  # one process: a receive cannot wait, so nothing is posted ahead
    a.send(1, {"x": torch.ones(2)}, channel="fwd")
    assert torch.equal(b.recv(0, channel="fwd").items["x"], torch.ones(2))


def test_error_types_are_actzip_errors():
    for cls in (WireConfigMismatchError, WireDesyncError, WirePeerError, WireTimeoutError):
        assert issubclass(cls, actzip.ActzipError)
    assert issubclass(WireTimeoutError, TimeoutError) and issubclass(WireConfigMismatchError, ValueError)
