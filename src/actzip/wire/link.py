"""Slow links: a software model with a schedule simulator, and a real one made of network namespaces.

**Software link.** :class:`LinkModel` is one direction of a link with a bandwidth and a one-way latency. A
message of ``b`` bytes sent at time ``t`` arrives at

    arrival = max(previous arrival, t + latency) + 8 b / bandwidth

(FIFO, bits serialized at the bandwidth, latency paid once per message while the link keeps streaming: a
message can start on the wire while the previous one is still in flight, as a TCP stream does). With
``serialize_latency=True`` it is ``max(previous arrival, t) + 8 b / bandwidth + latency`` instead: no two
messages in flight, a stop-and-wait link; the pessimistic bound.

:func:`actzip.wire.replay.simulate` replays a recorded schedule (:class:`Action` per forward, backward and
optimizer step) over such links.

**Real link.** :class:`NetnsLink` puts two processes in two network namespaces joined by a veth pair whose
egress is shaped by ``tc netem rate ... delay ...`` each way, so they talk TCP through a real slow link, and
reads the interface byte counters. On a kernel without ``sch_netem`` the rate is shaped by ``tc tbf`` and the
one-way latency is added in software: each sending process holds every message that long before it goes on
the wire (a FIFO delay line, as the model's latency). It needs root, ``ip`` and ``tc``;
:func:`netns_unavailable_reason` says what is missing, :func:`shaping_qdisc` which shaping is used.
:class:`NetnsMesh` does the same for many processes: one namespace each, all on one bridge, each one's uplink
shaped (an S x R mesh through real slow links).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Sequence

from actzip.errors import ConfigError
from actzip.wire.transport import WireError

__all__ = ["Action", "LinkModel", "LinkSpec", "NetnsLink", "NetnsMesh", "Timeline", "netns_unavailable_reason",
           "shaping_qdisc"]


@dataclass(frozen=True)
class LinkSpec:
    """A link's speed; the same each way."""

    bandwidth_mbps: float | None = None  # megabits (10**6 bits) per second; None: infinitely fast
    latency_ms: float = 0.0  # one-way latency in milliseconds
    serialize_latency: bool = False  # True: stop-and-wait (each message pays latency after the previous one)
    # measured (bytes, seconds) of exchanges that send both ways at once, as a collective between two replicas
    # does (``actzip bench link``'s all-gathers, latency apart); empty: such an exchange goes at the bandwidth
    exchange: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        bw = self.bandwidth_mbps
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or not bw > 0):
            raise ConfigError(f"LinkSpec.bandwidth_mbps must be a positive number or None, got {bw!r}")
        lat = self.latency_ms
        if isinstance(lat, bool) or not isinstance(lat, (int, float)) or lat < 0:
            raise ConfigError(f"LinkSpec.latency_ms must be a number >= 0, got {lat!r}")
        points = tuple((int(n), float(t)) for n, t in self.exchange)
        if points and (bw is None or any(n < 1 or not t > 0 for n, t in points)
                       or any(a[0] >= b[0] for a, b in zip(points, points[1:]))):
            raise ConfigError("LinkSpec.exchange takes (bytes, seconds) pairs of positive values in increasing "
                              f"bytes, on a link with a bandwidth; got {self.exchange!r} at {bw!r} Mbit/s")
        object.__setattr__(self, "exchange", points)

    def seconds(self, nbytes: int) -> float:
        """Time to put ``nbytes`` on the wire (without latency)."""
        return 0.0 if self.bandwidth_mbps is None else 8.0 * nbytes / (self.bandwidth_mbps * 1e6)

    def exchange_seconds(self, nbytes: float) -> float:
        """Time to put ``nbytes`` on the wire while the other direction carries as many (without latency): the
        measured ``exchange`` times' ratio to :meth:`seconds`, interpolated in log bytes between the measured
        sizes and held beyond them; :meth:`seconds` without measurements."""
        alone = self.seconds(nbytes)
        if not self.exchange or nbytes <= 0:
            return alone
        ratios = [(math.log(n), t / self.seconds(n)) for n, t in self.exchange]
        x = math.log(nbytes)
        if x <= ratios[0][0]:
            return alone * ratios[0][1]
        for (x0, r0), (x1, r1) in zip(ratios, ratios[1:]):
            if x <= x1:
                return alone * (r0 + (r1 - r0) * (x - x0) / (x1 - x0))
        return alone * ratios[-1][1]

    def __str__(self) -> str:
        bw = "inf" if self.bandwidth_mbps is None else f"{self.bandwidth_mbps:g} Mbps"
        return f"{bw}, {self.latency_ms:g} ms" + (", exchanges as measured" if self.exchange else "")


class LinkModel:
    """One direction of a link: arrival times of messages in the order they are sent."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.last_arrival = 0.0
        self.bytes = 0
        self.messages = 0

    def transmit(self, nbytes: int, send_time: float) -> float:
        """Arrival time of a message of ``nbytes`` bytes sent at ``send_time`` (seconds)."""
        s = self.spec
        lat = s.latency_ms / 1e3
        if s.serialize_latency:
            arrival = max(self.last_arrival, send_time) + s.seconds(nbytes) + lat
        else:
            arrival = max(self.last_arrival, send_time + lat) + s.seconds(nbytes)
        self.last_arrival = arrival
        self.bytes += nbytes
        self.messages += 1
        return arrival


@dataclass
class Action:
    """One unit of a stage's schedule, as measured."""

    stage: int
    step: int
    kind: str  # "F" forward, "B" backward, "O" optimizer step
    mb: int  # microbatch (-1 for "O")
    compute_s: float  # measured time, decode and encode included, waiting excluded
    recv: tuple | None = None  # (boundary, channel, step, mb) of the message it waits for
    send: tuple | None = None  # (boundary, channel, step, mb) of the message it sends
    send_bytes: int = 0  # bytes of that message on the wire, header included

    def as_tuple(self) -> tuple:
        return (self.stage, self.step, self.kind, self.mb, self.compute_s, self.recv, self.send, self.send_bytes)

    @classmethod
    def from_tuple(cls, t) -> Action:
        s, step, kind, mb, c, recv, send, nb = t
        return cls(s, step, kind, mb, c, tuple(recv) if recv else None, tuple(send) if send else None, nb)


@dataclass
class Timeline:
    """What :func:`simulate` found."""

    step_end_s: list[float]  # time each step's last optimizer update finished
    busy_s: list[float]  # compute time per stage
    link_bytes: dict[str, int] = field(default_factory=dict)  # "b0.fwd" -> bytes carried

    @property
    def total_s(self) -> float:
        return self.step_end_s[-1] if self.step_end_s else 0.0

    @property
    def step_times_s(self) -> list[float]:
        ends = self.step_end_s
        return [b - a for a, b in zip([0.0, *ends[:-1]], ends)]

    @property
    def median_step_s(self) -> float:
        t = self.step_times_s
        return statistics.median(t[1:] if len(t) > 2 else t) if t else 0.0


# ---- the real link: network namespaces, a veth pair, netem --------------------------------------------------

_counter = itertools.count()


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise WireError(f"`{' '.join(argv)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def _probe_qdisc(ns: str, dev: str, args: list[str]) -> str | None:
    r = _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", *args], check=False)
    return r.stderr.strip() if r.returncode else None


@functools.lru_cache(maxsize=None)
def shaping_qdisc() -> str | None:
    """``"netem"`` when this kernel has ``sch_netem`` (rate and delay in the kernel), ``"tbf"`` when it has only
    the token bucket (rate in the kernel, latency added in software by the senders), None when neither can be
    set up here (no root, no ``tc``, no network namespaces)."""
    if netns_unavailable_reason(shaped=False) is not None or shutil.which("tc") is None:
        return None
    ns = f"azqd{os.getpid()}"
    try:
        if _run(["ip", "netns", "add", ns], check=False).returncode:
            return None
        if _run(["ip", "-n", ns, "link", "add", "azq0", "type", "veth", "peer", "name", "azq1"], check=False).returncode:
            return None
        if _probe_qdisc(ns, "azq0", ["netem", "delay", "1ms"]) is None:
            return "netem"
        if _probe_qdisc(ns, "azq0", ["tbf", "rate", "100mbit", "burst", "128kb", "limit", "1mb"]) is None:
            return "tbf"
        return None
    finally:
        _run(["ip", "netns", "del", ns], check=False)


def netns_unavailable_reason(shaped: bool = True) -> str | None:
    """``None`` if :class:`NetnsLink` can run here (with shaping if ``shaped``: netem, or tbf with the latency
    added in software), else why not."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces and veth pairs needs root (CAP_NET_ADMIN); run as root to use it"
    for tool in ("ip", "tc") if shaped else ("ip",):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    ns = f"azprobe{os.getpid()}"
    try:
        r = _run(["ip", "netns", "add", ns], check=False)
        if r.returncode:
            return f"cannot create a network namespace: {r.stderr.strip()}"
        r = _run(["ip", "-n", ns, "link", "add", "azp0", "type", "veth", "peer", "name", "azp1"], check=False)
        if r.returncode:
            return f"cannot create a veth pair: {r.stderr.strip()}"
        if shaped:
            netem = _probe_qdisc(ns, "azp0", ["netem", "delay", "1ms"])
            tbf = netem and _probe_qdisc(ns, "azp0", ["tbf", "rate", "100mbit", "burst", "128kb", "limit", "1mb"])
            if netem and tbf:
                return (f"neither tc netem ({netem}) nor tc tbf ({tbf}) can shape a link here: this kernel lacks "
                        "the sch_netem and sch_tbf qdiscs")
    finally:
        _run(["ip", "netns", "del", ns], check=False)
    return None


netns_unavailable_reason = functools.cache(netns_unavailable_reason)  # probing creates namespaces: once a process


def _shape_egress(ns: str, ifname: str, link: LinkSpec, qdisc: str | None) -> None:
    """Shape what ``ifname`` in namespace ``ns`` sends: netem's rate and delay, or tbf's rate alone (the latency
    then added by the senders)."""
    bw = link.bandwidth_mbps
    if qdisc == "netem":
        shape = (["rate", f"{bw:g}mbit"] if bw is not None else []) + (
            ["delay", f"{link.latency_ms:g}ms"] if link.latency_ms > 0 else [])
        if shape:
            _run(["tc", "-n", ns, "qdisc", "add", "dev", ifname, "root", "netem", *shape, "limit", "100000"])
    elif bw is not None:  # tbf: a bucket of 4 ms at the rate (a few packets at least), a queue that drops nothing
        burst = max(4_000, int(bw * 1e6 / 8 * 0.004))
        _run(["tc", "-n", ns, "qdisc", "add", "dev", ifname, "root", "tbf", "rate", f"{bw:g}mbit",
              "burst", str(burst), "limit", str(64 * 2**20)])


def _interface_counters(ns: str, ifname: str) -> dict[str, int]:
    stats = {}
    for key in ("tx_bytes", "rx_bytes", "tx_packets", "rx_packets"):
        r = _run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{ifname}/statistics/{key}"])
        stats[key] = int(r.stdout.strip())
    return stats


class NetnsLink:
    """Two network namespaces joined by a veth pair, each side's egress shaped by netem (a context manager).

    Side 0 has address ``addresses[0]`` on interface ``ifnames[0]``; side 1 the others. ``popen(side, argv)``
    runs a command in a side's namespace; ``counters()`` reads both interfaces' byte and packet counters.
    """

    def __init__(self, link: LinkSpec | None = None) -> None:
        self.link = link or LinkSpec()
        shaped = self.link.bandwidth_mbps is not None or self.link.latency_ms > 0
        why = netns_unavailable_reason(shaped)
        if why is not None:
            raise WireError(f"NetnsLink cannot run here: {why}")
        self.qdisc = shaping_qdisc() if shaped else None
        # with tbf the kernel shapes the rate only: each sender holds its messages for the one-way latency
        self.send_delay_ms = self.link.latency_ms if self.qdisc == "tbf" else 0.0
        n = next(_counter)
        tag = f"{os.getpid() % 100000}x{n}"
        self.namespaces = (f"aznsa{tag}", f"aznsb{tag}")
        self.ifnames = (f"aza{tag}"[:15], f"azb{tag}"[:15])
        octet = 16 + (os.getpid() + n) % 200
        self.addresses = (f"10.213.{octet}.1", f"10.213.{octet}.2")
        self._up = False

    def __enter__(self):  # -> NetnsLink
        (na, nb), (ia, ib) = self.namespaces, self.ifnames
        try:
            for ns in self.namespaces:
                _run(["ip", "netns", "add", ns])
            self._up = True
            _run(["ip", "link", "add", ia, "netns", na, "type", "veth", "peer", "name", ib, "netns", nb])
            for ns, ifname, addr in zip(self.namespaces, self.ifnames, self.addresses):
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
                _run(["ip", "-n", ns, "link", "set", ifname, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _shape_egress(ns, ifname, self.link, self.qdisc)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._up:
            for ns in self.namespaces:  # deleting a namespace deletes its end of the veth pair, and so both
                _run(["ip", "netns", "del", ns], check=False)
            self._up = False

    def popen(self, side: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` in side ``side``'s namespace (told the software latency, if any, through
        ``ACTZIP_SEND_DELAY_MS``: :class:`~actzip.wire.backends.DistBackend` holds every send that long)."""
        env = dict(os.environ if env is None else env)
        if self.send_delay_ms:
            env["ACTZIP_SEND_DELAY_MS"] = f"{self.send_delay_ms:g}"
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[side], *argv], env=env, **kw)

    def counters(self) -> list[dict[str, int]]:
        """Per side: bytes and packets its interface sent and received (IP packets, headers included)."""
        return [_interface_counters(ns, ifname) for ns, ifname in zip(self.namespaces, self.ifnames)]


class NetnsMesh:
    """``nodes`` network namespaces on one switch (a bridge in a namespace of its own), each node's uplink (its
    veth's egress) shaped by ``link`` as :class:`NetnsLink` shapes one, or by its own of a sequence of one
    :class:`LinkSpec` a node (a server's uplink faster than its clients', say): every message between two nodes
    crosses its sender's uplink once, so a node's sends share its uplink's rate. A context manager.

    Node ``i`` has address ``addresses[i]`` on interface ``ifnames[i]``; ``popen(i, argv)`` runs a command in its
    namespace, told the software latency (``ACTZIP_SEND_DELAY_MS``, with tbf) and gloo's interface
    (``GLOO_SOCKET_IFNAME``); ``counters()`` reads every node's interface counters.
    """

    def __init__(self, nodes: int, link: LinkSpec | Sequence[LinkSpec] | None = None) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 2 <= nodes <= 200:
            raise ConfigError(f"NetnsMesh: nodes must be an int in [2, 200], got {nodes!r}")
        links = list(link) if isinstance(link, (list, tuple)) else [link or LinkSpec()] * nodes
        if len(links) != nodes or not all(isinstance(spec, LinkSpec) for spec in links):
            raise ConfigError(f"NetnsMesh: link must be a LinkSpec or one LinkSpec a node ({nodes}), got {link!r}")
        self.links = links
        shaped = any(spec.bandwidth_mbps is not None or spec.latency_ms > 0 for spec in links)
        why = netns_unavailable_reason(shaped)
        if why is not None:
            raise WireError(f"NetnsMesh cannot run here: {why}")
        self.qdisc = shaping_qdisc() if shaped else None
        # each node's software latency (tbf shapes the rate alone)
        self.send_delay_ms = [spec.latency_ms if self.qdisc == "tbf" else 0.0 for spec in links]
        tag = f"{os.getpid() % 100000}x{next(_counter)}"
        self.hub = f"azhub{tag}"
        self.namespaces = [f"aznode{tag}n{i}" for i in range(nodes)]
        self.ifnames = [f"azn{tag}n{i}"[:15] for i in range(nodes)]
        octet = 16 + os.getpid() % 200
        self.addresses = [f"10.214.{octet}.{i + 1}" for i in range(nodes)]
        self._made: list[str] = []

    def __enter__(self):  # -> NetnsMesh
        try:
            _run(["ip", "netns", "add", self.hub])
            self._made.append(self.hub)
            _run(["ip", "-n", self.hub, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", "br0", "up"])
            for i, (ns, ifname, addr) in enumerate(zip(self.namespaces, self.ifnames, self.addresses)):
                _run(["ip", "netns", "add", ns])
                self._made.append(ns)
                port = f"azport{i}"
                _run(["ip", "link", "add", ifname, "netns", ns, "type", "veth", "peer", "name", port, "netns",
                      self.hub])
                _run(["ip", "-n", self.hub, "link", "set", port, "master", "br0"])
                _run(["ip", "-n", self.hub, "link", "set", port, "up"])
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", ifname])
                _run(["ip", "-n", ns, "link", "set", ifname, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _shape_egress(ns, ifname, self.links[i], self.qdisc)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in reversed(self._made):  # a namespace's end of each veth pair goes with it
            _run(["ip", "netns", "del", ns], check=False)
        self._made = []

    def popen(self, node: int, argv: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` in node ``node``'s namespace (see the class docstring for what it is told)."""
        env = dict(os.environ if env is None else env, GLOO_SOCKET_IFNAME=self.ifnames[node])
        if self.send_delay_ms[node]:
            env["ACTZIP_SEND_DELAY_MS"] = f"{self.send_delay_ms[node]:g}"
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[node], *argv], env=env, **kw)

    def counters(self) -> list[dict[str, int]]:
        """Per node: bytes and packets its interface sent and received (IP packets, headers included)."""
        return [_interface_counters(ns, ifname) for ns, ifname in zip(self.namespaces, self.ifnames)]
