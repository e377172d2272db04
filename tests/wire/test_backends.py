"""DistBackend's software latency: every send held for the delay, in order, on two gloo ranks."""

import torch
from gloo_ranks import run_ranks


def _ping_pong(rank, world, delay_s, rounds):
    import time

    from actzip.wire.backends import DistBackend

    backend = DistBackend(send_delay_s=delay_s)
    got = []
    t0 = time.monotonic()
    for i in range(rounds):
        if rank == 0:
            backend.send(1, torch.full((4,), i, dtype=torch.uint8), "ping")
            got.append(int(backend.recv(1, 4, "pong", 10.0)[0]))
        else:
            got.append(int(backend.recv(0, 4, "ping", 10.0)[0]))
            backend.send(0, torch.full((4,), 100 + i, dtype=torch.uint8), "pong")
    backend.flush(10.0)
    return got, time.monotonic() - t0


def test_a_send_delay_holds_every_message_and_keeps_their_order():
    reports = run_ranks(_ping_pong, 2, 0.05, 4, timeout_s=20, deadline_s=40)
    assert all(r[0] == "ok" for r in reports), reports
    (pongs, elapsed), (pings, _) = reports[0][1], reports[1][1]
    assert pings == [0, 1, 2, 3] and pongs == [100, 101, 102, 103]
    assert elapsed >= 4 * 2 * 0.05  # each round trip pays the one-way delay twice


def _negative(rank, world):
    from actzip.wire.backends import DistBackend

    DistBackend(send_delay_s=-1.0)


def test_a_negative_delay_is_refused():
    reports = run_ranks(_negative, 2, timeout_s=10, deadline_s=20)
    assert all(r[0] == "error" and r[1] == "ConfigError" and "delay" in r[2] for r in reports), reports
