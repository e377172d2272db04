"""The link model's replay of a recorded schedule: each stage's measured actions over modelled uplinks.

:func:`simulate` replays a recorded pipeline schedule (one :class:`~actzip.wire.link.Action` per forward,
backward and optimizer step of each stage, with its measured compute time and the message it waits for and
sends) over a :class:`~actzip.wire.link.LinkSpec`. An action starts when its stage is free and its input has
arrived, and its message leaves when it ends. Every stage has one uplink, as a node has, which carries what it
sends either way in the order it sends it (a FIFO stream: ``max(previous arrival, send + latency) + bits /
bandwidth``). Compute is what was measured; only the wire is modelled, so step times are honest about what
overlaps with what, and the same trace replays at any bandwidth.

A stage's data-parallel sync before its optimizer update (a :class:`Sync`: its host work, the bytes it puts on
the uplink and the one-way latencies of its hops) goes up the same uplink, at the rate the link gives an
exchange that sends both ways at once where one was measured (``LinkSpec.exchange``: over a shaped link a
collective's exchange is slower than one direction alone). Its bytes and the stage's messages
still on the uplink when they arrive there share it equally, as two TCP connections through one shaper do: the
sync takes longer, and those messages arrive later (messages their receiver has already taken are left as
they were; in the schedules recorded here the receiver takes them only after the sync began).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from actzip.wire.link import Action, LinkModel, LinkSpec, Timeline
from actzip.wire.transport import WireError

__all__ = ["Sync", "dp_sync", "dp_sync_seconds", "exchange_seconds", "simulate"]


@dataclass(frozen=True)
class Sync:
    """One stage's data-parallel sync before an optimizer update, as the replay prices it."""

    wire_bytes: float = 0.0  # bytes this replica puts on its uplink (every collective of the sync)
    hops: int = 0  # one-way latencies the collectives wait in turn
    host_s: float = 0.0  # the host's own work (the correction, encoding, decoding, staging copies), measured


def dp_sync(payload: dict[str, int], replicas: int, host_s: float = 0.0) -> Sync:
    """The :class:`Sync` of one replica's ``payload`` (bytes per collective, a ``DPMeter``'s ``by_collective``)
    over ``replicas``: a ring all-reduce puts ``2 (R - 1) / R`` times its payload on the uplink in ``2 (R - 1)``
    hops, an all-gather ``R - 1`` times it in ``R - 1``; ``host_s``: its measured host work."""
    if replicas < 2:
        return Sync(host_s=host_s)
    r, wire, hops = replicas, 0.0, 0
    for collective, nbytes in payload.items():
        if not nbytes:
            continue
        if collective == "all_reduce":
            wire, hops = wire + 2 * (r - 1) * nbytes / r, hops + 2 * (r - 1)
        else:  # all_gather and broadcasts: each replica's part travels to every other
            wire, hops = wire + (r - 1) * nbytes, hops + (r - 1)
    return Sync(wire, hops, host_s)


def dp_sync_seconds(payload: dict[str, int], replicas: int, link: LinkSpec) -> float:
    """Wire time of one data-parallel sync of ``payload`` (see :func:`dp_sync`) over ``replicas`` joined by
    ``link``, alone on the uplink: its bytes as exchanges (:func:`exchange_seconds`) and the latency of each hop."""
    sync = dp_sync(payload, replicas)
    return exchange_seconds(sync, link) + sync.hops * link.latency_ms / 1e3


def exchange_seconds(sync: Sync, link: LinkSpec) -> float:
    """Time ``sync``'s bytes take on ``link`` without latency: each hop of a collective sends its part while it
    receives its neighbour's, so each hop's bytes go at the link's measured exchange rate for their size
    (:meth:`~actzip.wire.link.LinkSpec.exchange_seconds`; the bandwidth where none was measured)."""
    if not sync.hops:
        return link.seconds(sync.wire_bytes)
    return sync.hops * link.exchange_seconds(sync.wire_bytes / sync.hops)


class _Uplink:
    """One stage's uplink: its messages in order (what :class:`LinkModel` times), and where each one was."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec, self.fifo = spec, LinkModel(spec)
        self.sent: list[list] = []  # [message key, start on the wire, end, bytes] of those a sync may meet

    def transmit(self, key: tuple, nbytes: int, send_time: float) -> float:
        start = max(self.fifo.last_arrival, send_time + self.spec.latency_ms / 1e3)
        end = self.fifo.transmit(nbytes, send_time)
        self.sent.append([key, start, end, nbytes])
        return end

    def sync(self, sync: Sync, start: float, arrivals: dict[tuple, float]) -> float:
        """When ``sync``, begun at ``start``, is done; the messages still going up meanwhile are delayed in
        ``arrivals`` (the ones not taken yet)."""
        lat = self.spec.latency_ms / 1e3
        if not sync.wire_bytes and not sync.hops:
            return start + sync.host_s
        enter = start + sync.host_s + lat  # the first hop's latency, as the pipeline's messages pay it
        alone = exchange_seconds(sync, self.spec)
        self.sent = [m for m in self.sent if m[2] > enter]  # the messages still going up when the sync's bytes come
        backlog = sum(end - max(enter, s) for _, s, end, _ in self.sent)  # their seconds still to send
        shared = min(alone, backlog)  # both streams at half the rate until the shorter one is through
        for m in self.sent:
            ahead = m[2] - enter  # its seconds of the backlog, sent alone
            m[2] = enter + (2 * ahead if ahead <= shared else ahead + shared)
            if m[0] in arrivals:  # not taken by its receiver yet
                arrivals[m[0]] = m[2]
            self.fifo.last_arrival = max(self.fifo.last_arrival, m[2])
        return enter + alone + shared + max(0, sync.hops - 1) * lat


def simulate(actions: list[Action], link: LinkSpec, syncs: dict[tuple[int, int], Sync] | None = None) -> Timeline:
    """Replay ``actions`` (each stage's in the order it ran them) over ``link`` (see the module docstring);
    ``syncs[(stage, step)]``: the data-parallel sync a stage runs before its optimizer update of ``step``."""
    stages = sorted({a.stage for a in actions})
    queues = {s: deque(a for a in actions if a.stage == s) for s in stages}
    clock = {s: 0.0 for s in stages}
    busy = {s: 0.0 for s in stages}
    uplinks = {s: _Uplink(link) for s in stages}
    carried: dict[tuple, int] = {}
    arrivals: dict[tuple, float] = {}
    step_end: dict[int, float] = {}
    while any(queues.values()):
        progressed = False
        for s in stages:
            q = queues[s]
            while q and (q[0].recv is None or q[0].recv in arrivals):
                a = q.popleft()
                start = max(clock[s], arrivals.pop(a.recv) if a.recv is not None else 0.0)
                if a.kind == "O" and syncs and (s, a.step) in syncs:
                    start = uplinks[s].sync(syncs[(s, a.step)], start, arrivals)
                clock[s] = start + a.compute_s
                busy[s] += a.compute_s
                if a.send is not None:
                    key = (a.send[0], a.send[1])
                    carried[key] = carried.get(key, 0) + a.send_bytes
                    arrivals[a.send] = uplinks[s].transmit(a.send, a.send_bytes, clock[s])
                if a.kind == "O":
                    step_end[a.step] = max(step_end.get(a.step, 0.0), clock[s])
                progressed = True
        if not progressed:
            waiting = {s: queues[s][0].recv for s in stages if queues[s]}
            raise WireError(f"simulate: the recorded schedule cannot proceed; stages wait for {waiting}")
    return Timeline([step_end[k] for k in sorted(step_end)], [busy[s] for s in stages],
                    {f"b{b}.{c}": n for (b, c), n in sorted(carried.items())})
