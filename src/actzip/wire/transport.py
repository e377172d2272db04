"""Tensors and payloads between processes, with every byte on the wire counted.

A message is an ordered set of named items, each a tensor or an actzip :class:`~actzip.core.payload.Payload`.
It travels as two point-to-point sends of uint8 tensors (``torch.distributed`` ``isend``/``irecv``: gloo on CPU,
NCCL on GPU):

1. a fixed :data:`HEADER_BYTES`-byte header (little-endian, :data:`HEADER_FORMAT`): magic ``b"AZW1"``, format
   version, message kind (hello, data, abort), flags, channel (``fwd``, ``bwd``, ``control``), sequence number
   per channel, schema slot, the 64-bit hash of the configuration both ends agreed on, a 64-bit codec-state
   digest, the body's byte count, and the sender's clock (seconds; the link model's send time);
2. the body (absent when empty): the message's schema when the receiver has not seen it yet (4-byte length,
   then compact JSON: item names, codec names, shapes, dtypes, buffer layouts, codec metadata), then the raw
   bytes of every buffer, in schema order.

Schemas are cached at both ends in :data:`SCHEMA_SLOTS` slots per channel, filled and evicted in the same
order on both sides, so a message whose structure was seen before costs its header and its buffers only:
variable sizes work, and steady-state traffic carries no description. The :class:`ByteMeter` counts exactly
the bytes handed to ``isend`` (header included) per channel and direction; the receiver's meter counts what
it took off the wire, and the two agree.

Before data flows, both ends exchange a ``hello`` carrying their configuration (JSON; codecs each direction,
schedule, ...). If the hashes differ, both raise :class:`WireConfigMismatchError` naming the fields that
differ and both values. Every later header carries the agreed hash and a sequence number, so a stray or
reordered message is caught (:class:`WireDesyncError`) instead of being decoded into a wrong tensor.

Faults end in a clear error on every rank within a bounded time: a receive waits at most ``timeout_s``
(:class:`WireTimeoutError`); a peer whose process died closes its sockets (:class:`WirePeerError` at once);
a rank that fails sends ``abort`` with its reason to its peers (:meth:`Transport.abort`), which they raise as
:class:`WirePeerError` quoting it.

:class:`LoopbackBackend` carries the same bytes between stages of one process (the simulated pipeline), so its
meter counts what the distributed transport would send. The backends are in :mod:`actzip.wire.backends`, the
errors in :mod:`actzip.errors`; both are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

from actzip.errors import ConfigError, PayloadError
from actzip.core.payload import Payload
from actzip.wire.backends import DistBackend, LoopbackBackend, LoopbackHub
from actzip.wire.prefetch import Prefetch
from actzip.errors import (
    WireConfigMismatchError,
    WireDesyncError,
    WireError,
    WirePeerError,
    WireTimeoutError,
)

__all__ = [
    "CHANNELS",
    "HEADER_BYTES",
    "HEADER_FORMAT",
    "SCHEMA_SLOTS",
    "ByteMeter",
    "ChannelBytes",
    "DistBackend",
    "LoopbackBackend",
    "LoopbackHub",
    "Message",
    "Transport",
    "WireConfigMismatchError",
    "WireDesyncError",
    "WireError",
    "WirePeerError",
    "WireTimeoutError",
    "config_hash",
]

HEADER_FORMAT = "<4sBBBBIIQQQd"  # magic, version, kind, flags, channel, seq, slot, config, state, body, clock
HEADER_BYTES = struct.calcsize(HEADER_FORMAT)  # 48
MAGIC = b"AZW1"
VERSION = 1
SCHEMA_SLOTS = 64  # cached message structures per channel and direction
CHANNELS = ("fwd", "bwd", "control")
_HELLO, _DATA, _ABORT = 1, 2, 3
_KINDS = {_HELLO: "hello", _DATA: "data", _ABORT: "abort"}
_INLINE_SCHEMA = 1  # flags bit: the body starts with the schema
_MAX_BODY = 1 << 40  # a header announcing more than this is garbage, not a message
_RAW = "tensor"  # codec name of a plain tensor item (not a registered codec)

Item = torch.Tensor | Payload


def config_hash(config: dict) -> tuple[int, bytes]:
    """The 64-bit hash of a JSON-able configuration and its canonical bytes (sorted keys, compact)."""
    try:
        raw = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str).encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"wire configuration is not JSON-serializable: {e}") from None
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little"), raw


@dataclass
class ChannelBytes:
    """Messages and bytes of one channel in one direction."""

    messages: int = 0
    header_bytes: int = 0
    body_bytes: int = 0

    @property
    def total(self) -> int:
        return self.header_bytes + self.body_bytes


@dataclass
class ByteMeter:
    """Exact bytes this end put on the wire (``sent``) and took off it (``received``), by channel."""

    sent: dict[str, ChannelBytes] = field(default_factory=lambda: {c: ChannelBytes() for c in CHANNELS})
    received: dict[str, ChannelBytes] = field(default_factory=lambda: {c: ChannelBytes() for c in CHANNELS})

    def add(self, direction: str, channel: str, body_bytes: int, header_bytes: int = HEADER_BYTES) -> None:
        c = getattr(self, direction)[channel]
        c.messages += 1
        c.header_bytes += header_bytes
        c.body_bytes += body_bytes

    def total(self, direction: str = "sent", channel: str | None = None) -> int:
        """Bytes in ``direction`` ("sent" or "received"), on one channel or all."""
        d = getattr(self, direction)
        return sum(c.total for name, c in d.items() if channel in (None, name))

    def reset(self) -> None:
        for d in (self.sent, self.received):
            for c in d.values():
                c.messages = c.header_bytes = c.body_bytes = 0

    def as_dict(self) -> dict:
        return {d: {c: {"messages": v.messages, "header_bytes": v.header_bytes, "body_bytes": v.body_bytes,
                        "total": v.total} for c, v in getattr(self, d).items()} for d in ("sent", "received")}


@dataclass
class Message:
    """What :meth:`Transport.recv` returns."""

    items: dict[str, Item]  # tensors and payloads by name, in the sender's order
    channel: str
    seq: int  # position in the channel, from 0
    clock: float  # the sender's clock when it sent the message
    state: int  # the sender's codec-state digest (0 when none)
    nbytes: int  # bytes on the wire, header included


# ---- schemas: the structure of a message, as compact JSON ---------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise WireDesyncError(f"message schema names an unknown dtype {name!r}")
    return dt


def _meta_out(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"dt": _dtype_name(value)}
    if isinstance(value, torch.Size):
        return {"sz": list(value)}
    if isinstance(value, tuple):
        return {"tu": [_meta_out(v, where) for v in value]}
    if isinstance(value, list):
        return [_meta_out(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"di": {k: _meta_out(v, f"{where}.{k}") for k, v in value.items()}}
    raise PayloadError(f"payload meta {where} is a {type(value).__name__}, which cannot be sent; codec metadata "
                       f"must be None, bool, int, float, str, dtype, torch.Size, or tuples/lists/dicts of those")


def _meta_in(value: Any) -> Any:
    if isinstance(value, list):
        return [_meta_in(v) for v in value]
    if isinstance(value, dict):
        (tag, v), = value.items()
        if tag == "dt":
            return _dtype(v)
        if tag == "sz":
            return torch.Size(v)
        if tag == "tu":
            return tuple(_meta_in(x) for x in v)
        return {k: _meta_in(x) for k, x in v.items()}
    return value


def _describe(items: dict[str, Item]) -> tuple[bytes, list[torch.Tensor]]:
    """The schema bytes of ``items`` and their buffers in schema order."""
    desc, buffers = [], []
    for name, item in items.items():
        if isinstance(item, torch.Tensor):
            p = Payload(_RAW, item.shape, item.dtype, item.device, {"data": item})
        elif isinstance(item, Payload):
            p = item
        else:
            raise PayloadError(f"message item {name!r} is a {type(item).__name__}; send tensors or actzip Payloads")
        bufs = []
        for bname, b in p.buffers.items():
            bufs.append([bname, _dtype_name(b.dtype), list(b.shape)])
            buffers.append(b)
        desc.append([name, p.codec, list(p.shape), _dtype_name(p.dtype), bufs,
                     _meta_out(p.meta, f"{name}.meta") if p.meta else {}])
    return json.dumps(desc, separators=(",", ":")).encode(), buffers


def _as_bytes(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    t = t.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.contiguous().reshape(-1).view(torch.uint8).to(device)


# ---- the transport ------------------------------------------------------------------------------------------


class Transport:
    """Messages between this rank and its peers over a backend, metered, checked and bounded in time.

    ``backend``: :class:`DistBackend` (processes) or a :class:`LoopbackBackend` (one process).
    ``timeout_s``: the longest a receive (or :meth:`flush`) waits before :class:`WireTimeoutError`.
    """

    def __init__(self, backend, rank: int, *, timeout_s: float = 60.0, meter: ByteMeter | None = None) -> None:
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or timeout_s <= 0:
            raise ConfigError(f"Transport: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.backend = backend
        self.rank = rank
        self.timeout_s = float(timeout_s)
        self.meter = meter if meter is not None else ByteMeter()
        self._configs: dict[int, tuple[int, bytes]] = {}  # peer -> (hash, bytes) of this end's config
        self._agreed: dict[int, int] = {}  # peer -> agreed config hash
        self._seq_out: dict[tuple[int, str], int] = {}
        self._seq_in: dict[tuple[int, str], int] = {}
        self._tx_schemas: dict[tuple[int, str], dict[bytes, int]] = {}
        self._tx_slots: dict[tuple[int, str], list[bytes | None]] = {}
        self._rx_schemas: dict[tuple[int, str], list[list | None]] = {}
        self._tx_count: dict[tuple[int, str], int] = {}
        self._expected: dict[int, int] = {}  # peer -> messages announced by expect() and not yet received ahead
        self._ahead: dict[int, Prefetch] = {}  # peer -> its next message, being received ahead

    @property
    def device(self) -> torch.device:
        return self.backend.device

    # -- handshake --

    def handshake(self, peer: int, config: dict) -> None:
        """Exchange configurations with ``peer``; raise :class:`WireConfigMismatchError` on both ends if they
        differ. ``config`` is JSON-able and must describe the link the same way on both ends."""
        self.send_hello(peer, config)
        self.check_hello(peer)

    def send_hello(self, peer: int, config: dict) -> None:
        h, raw = config_hash(config)
        self._configs[peer] = (h, raw)
        self._post(peer, _HELLO, "control", 0, h, 0, torch.frombuffer(bytearray(raw), dtype=torch.uint8), 0.0,
                   "hello")

    def check_hello(self, peer: int) -> None:
        if peer not in self._configs:
            raise ConfigError(f"rank {self.rank}: send_hello({peer}, ...) must come before check_hello({peer})")
        mine_h, mine_raw = self._configs[peer]
        hdr, body = self._recv_raw(peer, "the hello (configuration exchange)")
        if hdr["kind"] != _HELLO:
            raise WireDesyncError(f"rank {self.rank} expected a hello from rank {peer}, got a "
                                  f"{_KINDS.get(hdr['kind'], '?')} message")
        if hdr["config"] != mine_h:
            error = WireConfigMismatchError(self._mismatch(peer, json.loads(mine_raw), json.loads(bytes(body.cpu()))))
            # The peer raises the same error only once it has this end's hello: let the send finish before this
            # end stops (else the peer may see a vanished process instead of the mismatch).
            with contextlib.suppress(WirePeerError, WireTimeoutError):
                self.flush()
            raise error
        self._agreed[peer] = mine_h

    def _mismatch(self, peer: int, mine: dict, theirs: dict) -> str:
        def flat(d, prefix=""):
            out = {}
            for k, v in d.items():
                if isinstance(v, dict):
                    out.update(flat(v, f"{prefix}{k}."))
                else:
                    out[f"{prefix}{k}"] = v
            return out

        a, b = flat(mine), flat(theirs)
        diffs = [f"{k}: rank {self.rank} has {a.get(k, '(absent)')!r}, rank {peer} has {b.get(k, '(absent)')!r}"
                 for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        return (f"wire configuration mismatch between rank {self.rank} and rank {peer}; both ends must be built "
                f"with the same settings: " + "; ".join(diffs))

    # -- data --

    def expect(self, peer: int, count: int) -> None:
        """``count`` more messages will come from ``peer`` (a step's schedule says so): each is received ahead,
        one at a time, while this rank computes, where the backend allows it (``backend.prefetches``: gloo).
        Each receive ahead waits at most ``timeout_s`` from its start."""
        if count > 0 and getattr(self.backend, "prefetches", False):
            self._expected[peer] = self._expected.get(peer, 0) + count
            self._receive_ahead(peer)

    def _receive_ahead(self, peer: int) -> None:
        if self._expected.get(peer, 0) > 0 and peer not in self._ahead:
            self._expected[peer] -= 1
            self._ahead[peer] = Prefetch(lambda: self._read(peer, f"the next message from rank {peer}"),
                                         name=f"actzip-recv-{self.rank}-from-{peer}")

    def send(self, peer: int, items: dict[str, Item], *, channel: str, state: int = 0, clock: float = 0.0) -> int:
        """Send ``items`` to ``peer`` on ``channel`` ("fwd" or "bwd"); returns the bytes put on the wire."""
        if peer not in self._agreed:
            raise ConfigError(f"rank {self.rank}: no handshake with rank {peer} yet; call handshake() first")
        if channel not in ("fwd", "bwd"):
            raise ConfigError(f"Transport.send: channel must be 'fwd' or 'bwd', got {channel!r}")
        schema, buffers = _describe(items)
        key = (peer, channel)
        known = self._tx_schemas.setdefault(key, {})
        slot = known.get(schema)
        parts = []
        flags = 0
        if slot is None:
            slots = self._tx_slots.setdefault(key, [None] * SCHEMA_SLOTS)
            slot = self._tx_count.get(key, 0) % SCHEMA_SLOTS
            self._tx_count[key] = self._tx_count.get(key, 0) + 1
            if slots[slot] is not None:
                del known[slots[slot]]
            slots[slot] = schema
            known[schema] = slot
            flags |= _INLINE_SCHEMA
            parts.append(torch.frombuffer(bytearray(struct.pack("<I", len(schema)) + schema), dtype=torch.uint8))
        dev = self.device
        parts = [p.to(dev) for p in parts] + [_as_bytes(b, dev) for b in buffers]
        body = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8, device=dev)
        seq = self._seq_out.get(key, 0)
        self._seq_out[key] = seq + 1
        self._post(peer, _DATA, channel, seq, self._agreed[peer], state, body, clock, f"{channel} message #{seq}",
                   slot=slot, flags=flags)
        return HEADER_BYTES + body.numel()

    def recv(self, peer: int, *, channel: str, state: int | None = None,
             device: torch.device | str | None = None) -> Message:
        """The next message from ``peer`` on ``channel``; buffers land on ``device`` (default: the backend's).

        ``state``: the receiver's codec-state digest; a message encoded under another state raises
        :class:`WireDesyncError` instead of being decoded.
        """
        key = (peer, channel)
        seq = self._seq_in.get(key, 0)
        what = f"{channel} message #{seq}"
        hdr, body = self._recv_raw(peer, what)
        if hdr["kind"] != _DATA:
            raise WireDesyncError(f"rank {self.rank} expected {what} from rank {peer}, got a "
                                  f"{_KINDS.get(hdr['kind'], '?')} message")
        if hdr["channel"] != CHANNELS.index(channel) or hdr["seq"] != seq:
            got = CHANNELS[hdr["channel"]] if hdr["channel"] < len(CHANNELS) else hdr["channel"]
            raise WireDesyncError(f"rank {self.rank} expected {what} from rank {peer}, got {got} message "
                                  f"#{hdr['seq']}: the two ends disagree on the message order")
        if hdr["config"] != self._agreed.get(peer):
            raise WireConfigMismatchError(
                f"rank {self.rank}: {what} from rank {peer} was sent under configuration hash {hdr['config']:#018x}, "
                f"not the one agreed in the handshake ({self._agreed.get(peer, 0):#018x}): a peer changed its "
                f"configuration after the handshake")
        if state is not None and hdr["state"] != state:
            raise WireDesyncError(
                f"rank {self.rank}: {what} from rank {peer} was encoded under codec state {hdr['state']:#018x} but "
                f"the receiver's codec is in state {state:#018x} (codebooks or caches out of sync); refusing to "
                f"decode it into a wrong tensor")
        self._seq_in[key] = seq + 1
        items = self._unpack(peer, channel, hdr, body, what, torch.device(device) if device else None)
        return Message(items, channel, seq, hdr["clock"], hdr["state"], HEADER_BYTES + hdr["body"])

    def _unpack(self, peer, channel, hdr, body, what, device) -> dict[str, Item]:
        table = self._rx_schemas.setdefault((peer, channel), [None] * SCHEMA_SLOTS)
        off = 0
        if hdr["flags"] & _INLINE_SCHEMA:
            (n,) = struct.unpack("<I", bytes(body[:4].cpu()))
            try:
                table[hdr["slot"]] = json.loads(bytes(body[4 : 4 + n].cpu()))
            except (ValueError, IndexError):
                raise WireDesyncError(f"rank {self.rank}: {what} from rank {peer} has a damaged schema") from None
            off = 4 + n
        schema = table[hdr["slot"]] if hdr["slot"] < SCHEMA_SLOTS else None
        if schema is None:
            raise WireDesyncError(f"rank {self.rank}: {what} from rank {peer} refers to schema slot {hdr['slot']}, "
                                  f"which the receiver never got (the ends' schema caches are out of sync)")
        items: dict[str, Item] = {}
        for name, codec, shape, dtype, bufs, meta in schema:
            buffers = {}
            for bname, bdtype, bshape in bufs:
                dt = _dtype(bdtype)
                n = torch.Size(bshape).numel() * dt.itemsize
                if off + n > body.numel():
                    raise WireDesyncError(f"rank {self.rank}: {what} from rank {peer} is {body.numel()} bytes, too "
                                          f"short for its schema (item {name!r}, buffer {bname!r})")
                chunk = body[off : off + n].clone()
                off += n
                t = chunk.view(torch.uint8 if dt == torch.bool else dt).reshape(bshape)
                t = t.bool() if dt == torch.bool else t
                buffers[bname] = t.to(device) if device is not None else t
            dev = device if device is not None else body.device
            if codec == _RAW:
                items[name] = buffers["data"]
            else:
                items[name] = Payload(codec, torch.Size(shape), _dtype(dtype), dev, buffers,
                                      _meta_in(meta) if meta else {})  # a payload without meta sends {}
        if off != body.numel():
            raise WireDesyncError(f"rank {self.rank}: {what} from rank {peer} has {body.numel() - off} bytes more "
                                  f"than its schema describes")
        return items

    # -- faults --

    def abort(self, peers, reason: str, grace_s: float = 2.0) -> None:
        """Tell ``peers`` this rank failed (best effort, waiting at most ``grace_s``); they raise
        :class:`WirePeerError` with ``reason`` when they next receive from this rank."""
        raw = reason.encode()[:4000]
        for peer in peers:
            try:
                self._post(peer, _ABORT, "control", 0, 0, 0, torch.frombuffer(bytearray(raw), dtype=torch.uint8),
                           0.0, "abort", count=False)
            except Exception:  # noqa: BLE001, S110 - the peer may be gone already; the abort is best effort
                pass
        try:
            self.backend.flush(grace_s)
        except WireError:
            pass
        self.backend.drop_pending()

    def flush(self) -> None:
        """Wait (at most ``timeout_s``) until the peers took every message sent so far."""
        self.backend.flush(self.timeout_s)

    # -- raw messages --

    def _post(self, peer, kind, channel, seq, cfg, state, body, clock, what, slot=0, flags=0, count=True) -> None:
        header = struct.pack(HEADER_FORMAT, MAGIC, VERSION, kind, flags, CHANNELS.index(channel), seq, slot, cfg,
                             state & 0xFFFFFFFFFFFFFFFF, body.numel(), float(clock))
        self.backend.send(peer, torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device),
                          f"the header of {what}")
        if body.numel():
            self.backend.send(peer, body.to(self.device), f"the body of {what}")
        if count:
            self.meter.add("sent", channel, body.numel())

    def _recv_raw(self, peer: int, what: str) -> tuple[dict, torch.Tensor]:
        ahead = self._ahead.pop(peer, None)
        hdr, body = ahead.result(self.timeout_s, what) if ahead is not None else self._read(peer, what)
        self._receive_ahead(peer)
        kind, channel, body_n = hdr["kind"], hdr["channel"], hdr["body"]
        if kind == _ABORT:
            raise WirePeerError(f"rank {peer} failed and reported: {bytes(body.cpu()).decode(errors='replace')}")
        if kind in (_HELLO, _DATA):
            self.meter.add("received", CHANNELS[channel] if channel < len(CHANNELS) else "control", body_n)
        return hdr, body

    def _read(self, peer: int, what: str) -> tuple[dict, torch.Tensor]:
        """The next header and body from ``peer``, off the backend (no meter: a thread may run this)."""
        raw = bytes(self.backend.recv(peer, HEADER_BYTES, f"the header of {what}", self.timeout_s).cpu())
        magic, version, kind, flags, channel, seq, slot, cfg, state, body_n, clock = struct.unpack(HEADER_FORMAT, raw)
        if magic != MAGIC or version != VERSION or kind not in _KINDS or body_n > _MAX_BODY:
            raise WireDesyncError(f"rank {self.rank}: {what} from rank {peer} does not start with an actzip wire "
                                  f"header (magic {magic!r}, version {version}): the peer is not speaking this "
                                  f"protocol, or the stream is out of step")
        hdr = {"kind": kind, "flags": flags, "channel": channel, "seq": seq, "slot": slot, "config": cfg,
               "state": state, "body": body_n, "clock": clock}
        body = (self.backend.recv(peer, body_n, f"the body of {what}", self.timeout_s) if body_n
                else torch.empty(0, dtype=torch.uint8, device=self.device))
        return hdr, body
