"""AQ-SGD-style delta compression of activations against a per-sample cache (``delta``).

Training over a fixed set of samples sends the activation of the same sample once per epoch, and between two
epochs it changes only as much as the weights did. Both ends of a boundary keep, per sample id, the value the
receiver reconstructed last time (the sender decodes its own payload to know it), and the sender transmits the
``bits``-bit quantization (actzip's ``quant`` codec, stochastic rounding by default) of the change:

    sender:   m = cache[id] (0 the first time);  q = quant(x - m);  cache[id] = m + dequant(q);  send q
    receiver: m = cache[id];                     x' = m + dequant(q);  cache[id] = x'

With stochastic rounding ``E[x'] = x``, and the error shrinks as the activations settle: the quantization step
scales with the range of the change, not of the activation. The cost is memory: one float32 copy of a sample's
activation at each end (``samples * numel_per_sample * 4`` bytes).

The payload carries, besides the quantized change, each sample's visit count (int32, 4 bytes a sample): the
receiver checks it against its own cache and raises :class:`~actzip.wire.transport.WireDesyncError` on any
difference (a restarted peer, a dropped message), so a stale cache is never added to a delta silently. Both
ends must run the same device type for bit-identical caches (CPU and CUDA may round a fused multiply-add
differently). Without sample ids (``ids=None``, e.g. evaluation) the tensor is quantized directly and no cache
is touched.
"""

from __future__ import annotations

import torch

from actzip.codecs.quant import QuantCodec
from actzip.core.dtypes import LOSSY_DTYPES, check_dense_tensor
from actzip.errors import ConfigError, PayloadError
from actzip.core.payload import Payload
from actzip.wire.transport import WireDesyncError


class DeltaCodec:
    """Per-sample delta quantization (not a registry codec: it needs sample ids and keeps state).

    Options (keyword-only, as for registry codecs):
      bits, group_size, scale, rounding, seed: those of the inner ``quant`` codec.
      check: refuse inf/NaN (one host sync per encode).

    ``encode(x, ids)`` / ``decode(payload, ids)``: ``x`` has the samples along dimension 0, ``ids`` is a 1-D
    integer tensor (or sequence) of one id per sample.
    """

    name = "delta"
    lossless = False
    dtypes = LOSSY_DTYPES

    def __init__(self, *, bits: int = 4, group_size: int = 128, scale: str = "minmax", rounding: str = "stochastic",
                 seed: int | None = None, check: bool = True) -> None:
        self.quant = QuantCodec(bits=bits, group_size=group_size, scale=scale, rounding=rounding, seed=seed,
                                check=check)
        self.unbiased = self.quant.unbiased
        self._cache: dict[int, torch.Tensor] = {}  # sample id -> the receiver's last value (float32 / float64)
        self._visits: dict[int, int] = {}  # sample id -> times sent

    def options(self) -> dict:
        o = dict(self.quant.options())
        o.pop("check")
        return o

    def __repr__(self) -> str:
        return f"DeltaCodec({', '.join(f'{k}={v!r}' for k, v in self.options().items())})"

    @property
    def cached_samples(self) -> int:
        return len(self._cache)

    def cache_nbytes(self) -> int:
        """Bytes this end's cache holds."""
        return sum(t.numel() * t.element_size() for t in self._cache.values())

    def clear(self) -> None:
        self._cache.clear()
        self._visits.clear()

    def _ids(self, ids, x_rows: int, name: str) -> list[int]:
        if isinstance(ids, torch.Tensor):
            if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 1:
                raise ConfigError(f"delta: sample ids for {name} must be a 1-D integer tensor, got "
                                  f"{ids.dtype} of shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        if len(ids) != x_rows:
            raise ConfigError(f"delta: {name} has {x_rows} samples along dimension 0 but {len(ids)} ids were given")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"delta: sample ids for {name} repeat; each sample must appear once per message")
        return ids

    def _previous(self, ids: list[int], like: torch.Tensor, work: torch.dtype) -> torch.Tensor:
        zero = None
        rows = []
        for i in ids:
            r = self._cache.get(i)
            if r is None or r.shape != like.shape[1:]:
                if r is not None:
                    raise WireDesyncError(f"delta: sample {i} was cached with shape {tuple(r.shape)}, now "
                                          f"{tuple(like.shape[1:])}")
                zero = zero if zero is not None else torch.zeros(like.shape[1:], dtype=work, device=like.device)
                r = zero
            rows.append(r.to(like.device))
        return torch.stack(rows) if rows else torch.zeros_like(like, dtype=work)

    def encode(self, x: torch.Tensor, ids=None, *, name: str = "tensor") -> Payload:
        check_dense_tensor(x, name, self.dtypes, "delta")
        x = x.detach()
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        if ids is None:
            q = self.quant.encode(x, name=name)
            return Payload(self.name, x.shape, x.dtype, x.device, dict(q.buffers), {"q": q.meta, "cached": False})
        if x.dim() == 0:
            raise ConfigError(f"delta: {name} is 0-dimensional; it needs samples along dimension 0")
        ids = self._ids(ids, x.shape[0], name)
        prev = self._previous(ids, x, work)
        q = self.quant.encode(x.to(work) - prev, name=name)  # the change, in the working precision
        recon = prev + self.quant.decode(q)
        visits = [self._visits.get(i, 0) for i in ids]
        for row, i in enumerate(ids):
            self._cache[i] = recon[row].clone()
            self._visits[i] = visits[row] + 1
        buffers = dict(q.buffers)
        buffers["visits"] = torch.tensor(visits, dtype=torch.int32, device=x.device)
        return Payload(self.name, x.shape, x.dtype, x.device, buffers, {"q": q.meta, "cached": True})

    def decode(self, payload: Payload, ids=None) -> torch.Tensor:
        if not isinstance(payload, Payload) or payload.codec != self.name:
            got = payload.codec if isinstance(payload, Payload) else type(payload).__name__
            raise PayloadError(f"delta: cannot decode a payload made by {got!r}")
        buffers = {k: v for k, v in payload.buffers.items() if k != "visits"}
        work = torch.float64 if payload.dtype == torch.float64 else torch.float32
        cached = payload.meta["cached"]
        inner = Payload("quant", payload.shape, work if cached else payload.dtype, payload.device, buffers,
                        payload.meta["q"])
        delta = self.quant.decode(inner)
        if not cached:
            return delta
        if ids is None:
            raise WireDesyncError("delta: the payload was encoded against the per-sample cache but the receiver "
                                  "was given no sample ids")
        ids = self._ids(ids, payload.shape[0], "the payload")
        theirs = payload.buffers["visits"].tolist()
        mine = [self._visits.get(i, 0) for i in ids]
        if theirs != mine:
            bad = [f"{i} (sender {a}, receiver {b})" for i, a, b in zip(ids, theirs, mine) if a != b]
            raise WireDesyncError(f"delta: per-sample caches out of sync for sample(s) {', '.join(bad[:5])}"
                                  f"{' ...' if len(bad) > 5 else ''}; refusing to add a delta to a stale value")
        recon = self._previous(ids, delta, work) + delta
        for row, i in enumerate(ids):
            self._cache[i] = recon[row].clone()
            self._visits[i] = mine[row] + 1
        return recon.to(payload.dtype)
