"""Time messages over a real shaped link, to check it against the link model.

:func:`transfer_times` sets up a :class:`~actzip.wire.link.NetnsLink`, starts a receiver in one namespace and a
sender in the other (this module run as a script: ``python -m actzip.wire.link_probe serve|send``), and times
each message from the first byte sent to the receiver's one-byte acknowledgement, after an idle gap such as a
training step leaves between its transfers. :func:`model_seconds` is what the link model gives the same message.
:func:`gather_times` does the same for a data-parallel sync's collective: two gloo ranks on a
:class:`~actzip.wire.link.NetnsMesh`, each all-gathering a payload (``... gather``), timed on both; a step waits
for the slower.
The software latency of a tbf-shaped link is added by actzip's own transport, not by raw sockets: probe a link
with ``latency_ms=0`` to check its rate.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

from actzip.errors import ConfigError, WireError
from actzip.wire.link import LinkSpec, NetnsLink, NetnsMesh

__all__ = ["DEFAULT_SIZES", "gather_times", "model_seconds", "transfer_times"]

DEFAULT_SIZES = (16_000, 64_000, 256_000, 1_000_000, 4_000_000)  # bytes: a microbatch's codes to a whole bucket
_PORT = 5601


def model_seconds(link: LinkSpec, nbytes: int) -> float:
    """The link model's time for one message of ``nbytes``: its transfer plus one one-way latency."""
    return link.seconds(nbytes) + link.latency_ms / 1e3


def _checked(who: str, sizes, repeats: int) -> list[int]:
    """``sizes`` as ints, after a clear error for a bad size list or repeat count."""
    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 1 for s in sizes):
        raise ConfigError(f"{who}: sizes must be positive byte counts, got {sizes!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"{who}: repeats must be an int >= 1, got {repeats!r}")
    return sizes


def transfer_times(link: LinkSpec, sizes=DEFAULT_SIZES, repeats: int = 7, idle_s: float = 0.2,
                   timeout_s: float = 120.0) -> dict[int, float]:
    """Median seconds per message of each size in ``sizes`` (bytes) over ``link``, ``repeats`` messages each,
    ``idle_s`` apart. Needs what :class:`NetnsLink` needs (root, iproute2)."""
    sizes = _checked("transfer_times", sizes, repeats)
    with NetnsLink(link) as net:
        me = [sys.executable, "-m", "actzip.wire.link_probe"]
        server = net.popen(1, [*me, "serve", net.addresses[1]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            sender = net.popen(0, [*me, "send", net.addresses[1], json.dumps(sizes), str(repeats), str(idle_s)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = sender.communicate(timeout=timeout_s)
        finally:
            server.kill()
            server.wait()
        if sender.returncode != 0:
            raise WireError(f"transfer_times: the sender failed: {err.strip()[-500:]}")
    return {int(k): v for k, v in json.loads(out).items()}


def gather_times(link: LinkSpec, sizes=DEFAULT_SIZES, repeats: int = 7, idle_s: float = 0.2,
                 timeout_s: float = 180.0) -> dict[int, float]:
    """Median seconds per all-gather of each size in ``sizes`` (bytes a replica contributes) between two gloo
    ranks, each in a namespace with its uplink shaped to ``link``; per repeat the slower rank's time counts."""
    sizes = _checked("gather_times", sizes, repeats)
    with NetnsMesh(2, link) as net:
        argv = [sys.executable, "-m", "actzip.wire.link_probe", "gather", json.dumps(sizes), str(repeats), str(idle_s)]
        procs = [net.popen(i, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "RANK": str(i), "WORLD_SIZE": "2", "MASTER_ADDR": net.addresses[0],
                                "MASTER_PORT": str(_PORT + 1)}) for i in range(2)]
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    if any(p.returncode for p in procs):
        raise WireError(f"gather_times: a rank failed: {' | '.join(e.strip()[-300:] for _, e in outs)}")
    ranks = [{int(k): v for k, v in json.loads(o.strip().splitlines()[-1]).items()} for o, _ in outs]
    return {n: statistics.median(max(a, b) for a, b in zip(ranks[0][n], ranks[1][n])) for n in sizes}


def _gather(sizes: list[int], repeats: int, idle_s: float) -> dict[int, list[float]]:
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    got = {}
    for size in sizes:
        mine = torch.zeros(size, dtype=torch.uint8)
        parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        times = []
        for _ in range(repeats):
            dist.barrier()
            time.sleep(idle_s)
            t0 = time.perf_counter()
            dist.all_gather(parts, mine)
            times.append(time.perf_counter() - t0)
        got[size] = times
    dist.barrier()  # every rank done before any closes its connections
    dist.destroy_process_group()
    return got


def _serve(address: str) -> None:
    listener = socket.create_server((address, _PORT))
    conn, _ = listener.accept()
    while True:
        head = conn.recv(8, socket.MSG_WAITALL)
        if len(head) < 8:
            return
        left = int.from_bytes(head, "little")
        while left:
            left -= len(conn.recv(min(1 << 20, left)))
        conn.sendall(b"k")


def _send(address: str, sizes: list[int], repeats: int, idle_s: float) -> dict[int, float]:
    deadline = time.monotonic() + 10
    while True:  # the receiver may still be starting
        try:
            conn = socket.create_connection((address, _PORT), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    got = {}
    for size in sizes:
        message = size.to_bytes(8, "little") + bytes(size)
        times = []
        for _ in range(repeats):
            time.sleep(idle_s)
            t0 = time.perf_counter()
            conn.sendall(message)
            conn.recv(1)
            times.append(time.perf_counter() - t0)
        got[size] = statistics.median(times)
    return got


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve(sys.argv[2])
    elif sys.argv[1] == "gather":
        print(json.dumps(_gather(json.loads(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))))
    else:
        print(json.dumps(_send(sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))))
