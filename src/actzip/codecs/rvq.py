"""Residual vector quantization (RVQ) with a codebook that two ends keep in sync.

A vector ``x`` of width ``dim`` is coded by ``levels`` codebooks of ``codebook_size`` rows each:
``r_0 = x``; at level ``l`` the nearest row ``C_l[i_l]`` of ``r_l`` is chosen and ``r_{l+1} = r_l - C_l[i_l]``.
The code is the indices ``(i_0, ..., i_{L-1})``: ``L * ceil(log2 K)`` bits per vector, packed densely
(:func:`actzip.codecs.bitpack.pack_bits`); it decodes to ``q = sum_l C_l[i_l]``. Lossy and biased.

Both ends hold a :class:`RVQCodebook` (a module with the ``(L, K, dim)`` codebook as a buffer, a ``version``
and a ``checksum``: the first 63 bits of a BLAKE2b hash of the codebook's float32 bytes). Both start from the
same seeded draw. Only the sending end learns (:class:`RVQLearner`, EMA k-means):

- ``observe(...)`` during forward accumulates, on the device, how many vectors each row received and their
  sum (no host synchronization);
- ``update()`` (after the optimizer step) folds them into exponential moving averages, restarts rows that
  received nothing for ``dead_after`` updates from recent residuals, and every ``sync_every`` updates
  *publishes*: the rows whose live value moved by more than ``tol`` (relative) are copied into the
  codebook both ends use (rounded to ``delta_dtype``), the version is bumped, the checksum recomputed, and a
  :class:`CodebookDelta` holding only those rows (at most ``max_rows``, those that moved most: a bounded
  stream) is queued for the receiver. Publishing reads the changed-row count and the codebook bytes on the
  host: one synchronization per publication, not per forward. Publishing rarely (``sync_every`` > 1) makes
  every level's rows jump at once, and the deeper levels were fitted to the old residuals: measured, it
  makes the training loss spike at every publication. ``max_rows`` bounds the stream without that.

The receiver applies a delta only on top of the version it was computed from, recomputes the checksum and
compares; every decode also checks the payload's version and checksum against its own codebook. Any mismatch
raises :class:`CodebookDesyncError`, never returns a tensor decoded with the wrong rows. Recovery is a full
snapshot: ``learner.request_resync()`` makes the next message carry the whole codebook
(``base_version = -1``). A payload whose levels, codebook size or width differ from the receiver's raises
:class:`ConfigError` naming the option.

Gradient: the straight-through estimator. :func:`straight_through` returns ``q`` in forward and passes the
incoming gradient to ``x`` unchanged, plus, with ``commitment = beta > 0``, the gradient of
``beta * mean((x - q)^2)`` (it pulls the encoder's output towards the codebook without a loss term at the end
of the model).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from actzip.codecs.bitpack import pack_bits, unpack_bits
from actzip.errors import CodebookDesyncError, ConfigError, PayloadError
from actzip.core.payload import Payload

__all__ = [
    "CodebookDelta",
    "CodebookDesyncError",
    "RVQCodebook",
    "RVQConfig",
    "RVQLearner",
    "codebook_checksum",
    "straight_through",
]

_DELTA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass
class RVQConfig:
    """Residual vector quantization of ``dim``-wide vectors, and how the sender's codebook learns and syncs."""

    dim: int  # width of the vectors quantized (the projected code width)
    levels: int = 4  # L: residual stages; the code is L indices per vector
    codebook_size: int = 256  # K: rows per stage; an index costs ceil(log2 K) bits (256 -> one byte)
    seed: int = 0  # both ends draw the initial codebooks from this seed
    init_std: float = 0.02  # std of the initial rows (unused rows are soon restarted from data anyway)
    decay: float = 0.99  # EMA decay of the k-means statistics (sender only)
    dead_after: int = 10  # updates without any assignment after which a row restarts from a recent residual
    sync_every: int = 1  # publish the changed rows every n-th update (> 1 makes the codebook jump; see above)
    tol: float = 1e-2  # publish a row when ||live - published|| > tol * max(||published||, 1e-6)
    max_rows: int | None = None  # publish at most this many rows per publication, those that moved most
    delta_dtype: torch.dtype = torch.float32  # dtype rows travel in; both ends store the rounded value
    commitment: float = 0.0  # beta: weight of the commitment gradient added to the code's gradient

    def __post_init__(self) -> None:
        for name in ("dim", "levels", "dead_after", "sync_every", "max_rows"):
            value = getattr(self, name)
            if name == "max_rows" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"RVQConfig.{name} must be a positive int, got {value!r}")
        k = self.codebook_size
        if not isinstance(k, int) or isinstance(k, bool) or not (2 <= k <= 1 << 16):
            raise ConfigError(f"RVQConfig.codebook_size must be an int in [2, 65536], got {k!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ConfigError(f"RVQConfig.seed must be a non-negative int, got {self.seed!r}")
        for name, lo, hi in (("decay", 0.0, 1.0), ("tol", 0.0, math.inf)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (lo <= value < hi):
                raise ConfigError(f"RVQConfig.{name} must be a number in [{lo}, {hi}), got {value!r}")
        for name in ("init_std", "commitment"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"RVQConfig.{name} must be a non-negative number, got {value!r}")
        if self.delta_dtype not in _DELTA_DTYPES:
            raise ConfigError(
                f"RVQConfig.delta_dtype must be one of {[str(d) for d in _DELTA_DTYPES]}, got {self.delta_dtype!r}"
            )

    @property
    def index_bits(self) -> int:
        """Bits per index: ``ceil(log2(codebook_size))``."""
        return max(1, math.ceil(math.log2(self.codebook_size)))

    @property
    def bits_per_vector(self) -> int:
        """``levels * index_bits``: what one coded vector costs on the wire."""
        return self.levels * self.index_bits


def codebook_checksum(codebook: torch.Tensor) -> int:
    """First 63 bits of BLAKE2b over the codebook's float32 bytes (a host read of the codebook)."""
    raw = codebook.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "little") & ((1 << 63) - 1)


@dataclass
class CodebookDelta:
    """Rows of a codebook that changed between two versions, or a full snapshot (``base_version == -1``)."""

    base_version: int  # version the receiver must hold to apply it; -1: a full snapshot
    version: int  # version after applying it
    rows: torch.Tensor  # flat row indices in [0, levels * codebook_size), int64
    values: torch.Tensor  # (len(rows), dim) in the config's delta_dtype
    checksum: int  # checksum of the whole codebook after applying it

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: row indices as int32, the values, and a 24-byte header."""
        return self.rows.numel() * 4 + self.values.numel() * self.values.element_size() + 24

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The delta as tensors, for a message dict (``rvq_sync``, ``rvq_rows``, ``rvq_values``)."""
        dev = self.values.device
        head = torch.tensor([self.base_version, self.version, self.checksum], dtype=torch.int64, device=dev)
        return {"rvq_sync": head, "rvq_rows": self.rows.to(device=dev, dtype=torch.int32), "rvq_values": self.values}

    @classmethod
    def from_tensors(cls, msg: dict[str, torch.Tensor]) -> CodebookDelta:
        base, version, checksum = (int(v) for v in msg["rvq_sync"].tolist())
        return cls(base, version, msg["rvq_rows"].long(), msg["rvq_values"], checksum)


def _init_codebook(cfg: RVQConfig) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(cfg.seed)
    shape = (cfg.levels, cfg.codebook_size, cfg.dim)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * cfg.init_std).float()


class RVQCodebook(nn.Module):
    """One end's copy of the codebooks: quantize, encode to a payload, decode, and stay in sync."""

    def __init__(self, cfg: RVQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("codebook", _init_codebook(cfg))
        self.version = 0
        self.checksum = codebook_checksum(self.codebook)

    # ---- quantization -------------------------------------------------------------------------

    @torch.no_grad()
    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(indices (N, L) int64, q (N, dim) float32, residual inputs (L, N, dim))`` for ``x`` of shape (N, dim)."""
        self._check_width(x.shape[-1], "quantize")
        r = x.detach().float()
        idx = torch.empty(r.shape[0], self.cfg.levels, dtype=torch.int64, device=r.device)
        inputs = torch.empty(self.cfg.levels, *r.shape, dtype=torch.float32, device=r.device)
        for level in range(self.cfg.levels):
            book = self.codebook[level]
            inputs[level] = r
            # ||r - c||^2 = ||r||^2 - 2 r.c + ||c||^2; the first term does not change the argmin.
            dist = book.square().sum(1) - 2.0 * (r @ book.t())
            i = dist.argmin(dim=1)
            idx[:, level] = i
            r = r - book[i]
        # q as the receiver computes it (a sum of rows), not x - r: both ends must agree to the bit.
        return idx, self.lookup(idx), inputs

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        """``sum_l C_l[idx[..., l]]`` (float32) for indices of shape (..., L)."""
        q = None
        for level in range(self.cfg.levels):
            row = self.codebook[level][idx[..., level]]
            q = row if q is None else q + row
        return q

    def pack(self, idx: torch.Tensor) -> torch.Tensor:
        """Indices (N, L) as a dense byte stream of ``ceil(N * L * index_bits / 8)`` bytes."""
        return pack_bits(idx.reshape(-1), self.cfg.index_bits)

    def unpack(self, packed: torch.Tensor, n: int) -> torch.Tensor:
        """Inverse of :meth:`pack` for ``n`` vectors: (n, L) int64."""
        levels = self.cfg.levels
        idx = unpack_bits(packed, n * levels, self.cfg.index_bits, torch.int64).reshape(n, levels)
        # Only a codebook size below 2**index_bits leaves room for an out-of-range index (one host read).
        full = self.cfg.codebook_size == 1 << self.cfg.index_bits
        if not full and idx.numel() and int(idx.max()) >= self.cfg.codebook_size:
            raise PayloadError(f"rvq: an index is >= codebook_size {self.cfg.codebook_size}; the payload is damaged")
        return idx

    def encode(self, x: torch.Tensor) -> Payload:
        """``x`` (..., dim) as a payload of packed indices, stamped with this codebook's version and checksum."""
        flat = x.reshape(-1, x.shape[-1])
        idx, _, _ = self.quantize(flat)
        meta = dict(self.header(), n=flat.shape[0])
        return Payload("rvq", x.shape, x.dtype, x.device, buffers={"indices": self.pack(idx)}, meta=meta)

    def decode(self, payload: Payload) -> torch.Tensor:
        """The quantized tensor; raises unless the payload matches this codebook's config, version and checksum."""
        if not isinstance(payload, Payload) or payload.codec != "rvq":
            raise PayloadError(f"rvq: decode expects an 'rvq' Payload, got {payload!r}")
        self.check_header(payload.meta)
        idx = self.unpack(payload.buffers["indices"], payload.meta["n"])
        return self.lookup(idx).reshape(payload.shape).to(payload.dtype)

    # ---- synchronization ----------------------------------------------------------------------

    def header(self) -> dict[str, int]:
        """What a payload carries so the receiver can check it: config fields, version, checksum."""
        return {
            "levels": self.cfg.levels,
            "codebook_size": self.cfg.codebook_size,
            "dim": self.cfg.dim,
            "version": self.version,
            "checksum": self.checksum,
        }

    def check_header(self, meta: dict) -> None:
        """Raise :class:`ConfigError` on a config mismatch, :class:`CodebookDesyncError` on a state mismatch."""
        for name in ("levels", "codebook_size", "dim"):
            mine = getattr(self.cfg, name)
            if meta.get(name) != mine:
                raise ConfigError(
                    f"rvq: the sender's RVQConfig.{name} is {meta.get(name)!r} but the receiver's is {mine!r}; "
                    "both ends must be built from the same RVQConfig"
                )
        self.verify(meta["version"], meta["checksum"])

    def verify(self, version: int, checksum: int) -> None:
        """Raise :class:`CodebookDesyncError` unless this copy is at ``version`` with ``checksum``."""
        if version != self.version or checksum != self.checksum:
            raise CodebookDesyncError(
                f"rvq: codebook desync: the sender encoded with version {version} (checksum {checksum:#x}) but "
                f"the receiver holds version {self.version} (checksum {self.checksum:#x}); request a full "
                "snapshot (RVQLearner.request_resync) and apply it before decoding"
            )

    @torch.no_grad()
    def apply_delta(self, delta: CodebookDelta) -> None:
        """Apply a delta (or a snapshot); raise :class:`CodebookDesyncError` if it does not fit or verify."""
        if delta.base_version != -1 and delta.base_version != self.version:
            raise CodebookDesyncError(
                f"rvq: codebook desync: a delta from version {delta.base_version} arrived but the receiver holds "
                f"version {self.version} (an update was lost or reordered); request a full snapshot"
            )
        flat = self.codebook.view(-1, self.cfg.dim)
        rows = delta.rows.to(device=flat.device, dtype=torch.int64)
        if delta.values.shape != (rows.numel(), self.cfg.dim):
            raise ConfigError(
                f"rvq: a codebook update has rows of width {tuple(delta.values.shape)[1:]} but the receiver's "
                f"RVQConfig.dim is {self.cfg.dim}"
            )
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= flat.shape[0]):
            raise PayloadError(f"rvq: a codebook update names a row outside [0, {flat.shape[0]}); it is damaged")
        flat[rows] = delta.values.to(device=flat.device, dtype=flat.dtype)
        self.version = delta.version
        self.checksum = codebook_checksum(self.codebook)
        if self.checksum != delta.checksum:
            raise CodebookDesyncError(
                f"rvq: codebook desync: after applying the update to version {delta.version} the receiver's "
                f"checksum is {self.checksum:#x}, the sender's {delta.checksum:#x}; request a full snapshot"
            )

    def snapshot(self) -> CodebookDelta:
        """The whole codebook as a delta that any receiver can apply."""
        rows = torch.arange(self.cfg.levels * self.cfg.codebook_size, device=self.codebook.device)
        values = self.codebook.view(-1, self.cfg.dim).to(self.cfg.delta_dtype).clone()
        return CodebookDelta(-1, self.version, rows, values, self.checksum)

    def get_extra_state(self) -> dict:
        return {"version": self.version, "checksum": self.checksum}

    def set_extra_state(self, state: dict) -> None:
        self.version = int(state["version"])
        self.checksum = int(state["checksum"])

    def _check_width(self, width: int, where: str) -> None:
        if width != self.cfg.dim:
            raise ConfigError(f"rvq.{where}: vectors have width {width} but RVQConfig.dim is {self.cfg.dim}")


class RVQLearner(nn.Module):
    """The sender's EMA k-means over its codebook, publishing only the rows that changed.

    Holds the live (unpublished) statistics; the codebook it publishes into is the sender's
    :class:`RVQCodebook`, which is what the sender encodes with, so sender and receiver always decode the
    same indices to the same values.
    """

    def __init__(self, codebook: RVQCodebook, sample_size: int = 4096) -> None:
        super().__init__()
        cfg = codebook.cfg
        self.cfg = cfg
        self._books = (codebook,)  # not a submodule: its owner registers it once
        self.sample_size = sample_size
        L, K, D = cfg.levels, cfg.codebook_size, cfg.dim
        self.register_buffer("ema_count", torch.zeros(L, K))
        self.register_buffer("ema_sum", torch.zeros(L, K, D))
        self.register_buffer("acc_count", torch.zeros(L, K))
        self.register_buffer("acc_sum", torch.zeros(L, K, D))
        # Updates since each row last received a vector; initial rows count as stale, so the first update
        # restarts every row that data did not reach.
        self.register_buffer("age", torch.full((L, K), float(cfg.dead_after)))
        self.register_buffer("live", codebook.codebook.clone())
        self._sample: torch.Tensor | None = None
        self._updates = 0
        self._pending: CodebookDelta | None = None
        self._resync = False
        self._gen = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
        self.published_bytes = 0  # bytes of every delta handed out so far

    @torch.no_grad()
    def observe(self, idx: torch.Tensor, inputs: torch.Tensor) -> None:
        """Accumulate assignments: ``idx`` (N, L) and the residual inputs (L, N, dim) of each level."""
        L, K = self.cfg.levels, self.cfg.codebook_size
        offs = (torch.arange(L, device=idx.device) * K).unsqueeze(0)
        flat = (idx + offs).t().reshape(-1)  # level-major, matching inputs.reshape(-1, dim)
        self.acc_count.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=self.acc_count.dtype))
        self.acc_sum.view(-1, self.cfg.dim).index_add_(0, flat, inputs.reshape(-1, self.cfg.dim))
        n = inputs.shape[1]
        if n > self.sample_size:
            pick = torch.randint(n, (self.sample_size,), generator=self._gen).to(inputs.device)
            inputs = inputs[:, pick]
        self._sample = inputs.detach().clone()

    @torch.no_grad()
    def update(self) -> CodebookDelta | None:
        """Fold the accumulated statistics in; publish every ``sync_every`` updates. Returns the new delta."""
        if self._sample is None:
            return None  # nothing observed since the last update
        cfg = self.cfg
        used = self.acc_count > 0
        self.ema_count.mul_(cfg.decay).add_(self.acc_count, alpha=1 - cfg.decay)
        self.ema_sum.mul_(cfg.decay).add_(self.acc_sum, alpha=1 - cfg.decay)
        mean = self.ema_sum / self.ema_count.clamp_min(1e-12).unsqueeze(-1)
        self.live.copy_(torch.where((self.ema_count > 0).unsqueeze(-1), mean, self.live))
        self.age.add_(1).masked_fill_(used, 0)
        dead = self.age >= cfg.dead_after
        # Restart dead rows from residuals that reached their level (random picks; no host sync).
        n = self._sample.shape[1]
        pick = torch.randint(n, dead.shape, generator=self._gen).to(dead.device)
        fresh = torch.gather(self._sample, 1, pick.unsqueeze(-1).expand(-1, -1, cfg.dim))
        self.live.copy_(torch.where(dead.unsqueeze(-1), fresh, self.live))
        self.ema_sum.copy_(torch.where(dead.unsqueeze(-1), fresh, self.ema_sum))
        self.ema_count.masked_fill_(dead, 1.0)
        self.age.masked_fill_(dead, 0)
        self.acc_count.zero_()
        self.acc_sum.zero_()
        self._sample = None
        self._updates += 1
        if self._updates % cfg.sync_every:
            return None
        return self.publish()

    @torch.no_grad()
    def publish(self) -> CodebookDelta | None:
        """Copy rows that moved by more than ``tol`` into the codebook; queue and return their delta."""
        cfg = self.cfg
        pub = self.book.codebook.view(-1, cfg.dim)
        live = self.live.view(-1, cfg.dim)
        change = (live - pub).norm(dim=1) / pub.norm(dim=1).clamp_min(1e-6)
        rows = (change > cfg.tol).nonzero().squeeze(1)  # host sync: once per publication
        if rows.numel() == 0:
            return None
        if cfg.max_rows is not None and rows.numel() > cfg.max_rows:
            # A bounded stream: the rows that moved most go first, the others wait for a later publication.
            rows = rows[change[rows].topk(cfg.max_rows).indices].sort().values
        values = live[rows].to(cfg.delta_dtype)
        pub[rows] = values.to(pub.dtype)
        base = self.book.version
        self.book.version += 1
        self.book.checksum = codebook_checksum(self.book.codebook)
        delta = CodebookDelta(base, self.book.version, rows, values, self.book.checksum)
        self._pending = delta if self._pending is None else _merge(self._pending, delta, pub)
        return delta

    @property
    def book(self) -> RVQCodebook:
        """The codebook this learner publishes into."""
        return self._books[0]

    def request_resync(self) -> None:
        """Make the next :meth:`take_message` a full snapshot (after a receiver reported a desync)."""
        self._resync = True

    def take_message(self) -> CodebookDelta | None:
        """The update the next message must carry (merged since the last message), or ``None``."""
        if self._resync:
            self._resync = False
            self._pending = None
            out = self.book.snapshot()
        else:
            out, self._pending = self._pending, None
        if out is not None:
            self.published_bytes += out.nbytes
        return out


def _merge(old: CodebookDelta, new: CodebookDelta, pub: torch.Tensor) -> CodebookDelta:
    # Two unsent deltas become one: the union of their rows at their current (published) values.
    rows = torch.unique(torch.cat([old.rows, new.rows]))
    return CodebookDelta(old.base_version, new.version, rows, pub[rows].to(new.values.dtype), new.checksum)


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, q: torch.Tensor, beta: float) -> torch.Tensor:
        ctx.beta = beta
        if beta:
            ctx.save_for_backward(x.detach() - q.to(x.dtype))
        return q.to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.beta:
            (diff,) = ctx.saved_tensors
            grad = grad + (2.0 * ctx.beta / diff.numel()) * diff
        return grad, None, None


def straight_through(x: torch.Tensor, q: torch.Tensor, commitment: float = 0.0) -> torch.Tensor:
    """``q`` in forward; in backward the gradient goes to ``x`` as is (plus the commitment term, if any)."""
    return _StraightThrough.apply(x, q.detach(), float(commitment))
