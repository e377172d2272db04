"""Byte codecs on a pipeline boundary, one per direction.

A boundary carries activations forward and their gradients backward; each direction gets its own codec, named
by a spec string::

    none                               raw tensors (the dense baseline)
    quant:bits=4                       any registry codec with its options (quant, fp8, mask, sketch, ...)
    mask:keep=0.05,mode=topk+quant:bits=8
                                       a chain: the second codec encodes the first one's floating-point
                                       buffers (here: top-k's kept values, quantized to 8 bits)
    delta:bits=4                       AQ-SGD delta against a per-sample cache (forward only; needs sample ids)

Each codec of a chain is written in :mod:`actzip.core.spec`'s grammar, so ``"quant:bits=4,group_size=128"``
means here what it means to ``actzip.codecs.get``. Only floating-point tensors are encoded: integer and bool
tensors (token ids, masks) always travel raw and exact. The codec's options, not the text, are what the two
ends compare in their handshake, so ``quant`` and ``quant:bits=4`` agree when 4 is the default.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from actzip.compat import deprecated
from actzip.errors import ConfigError, PayloadError
from actzip.core.payload import Payload
from actzip.core.registry import codec_class, get
from actzip.core.spec import format_spec, parse_spec
from actzip.wire.delta import DeltaCodec
from actzip.wire.transport import WireConfigMismatchError

__all__ = ["DIRECTIONS", "ChainCodec", "CodecSpec", "WireCodec", "parse_codec"]

DIRECTIONS = ("fwd", "bwd")


@dataclass(frozen=True)
class CodecSpec:
    """One codec by name with options, optionally followed by a chained codec."""

    name: str = "none"  # "none", "delta", or a registry codec name
    options: tuple[tuple[str, object], ...] = ()  # (option, value) pairs, sorted
    then: CodecSpec | None = None  # codec applied to this one's floating-point buffers

    def __str__(self) -> str:
        return format_spec(self.name, dict(self.options)) + (f"+{self.then}" if self.then else "")


def parse_codec(text: str | CodecSpec | None) -> CodecSpec:
    """A :class:`CodecSpec` from ``"name[:opt=value,...][+name[:...]]"`` (``None`` or ``""`` mean ``none``)."""
    if isinstance(text, CodecSpec):
        return text
    if text is None or not str(text).strip():
        return CodecSpec()
    if not isinstance(text, str):
        raise ConfigError(f"codec spec must be a string like 'quant:bits=4', got {type(text).__name__}")
    head, _, rest = text.strip().partition("+")
    name, options = parse_spec(head)
    spec = CodecSpec(name, tuple(sorted(options.items())), parse_codec(rest) if rest else None)
    if spec.then is not None and (spec.name in ("none", "delta") or spec.then.name in ("none", "delta")
                                  or spec.then.then is not None):
        raise ConfigError(f"codec spec {text!r}: a chain is two registry codecs ('mask:keep=0.1+quant:bits=8'); "
                          f"'none' and 'delta' cannot be chained")
    return spec


def _with_seed(name: str, options: dict, seed: int) -> dict:
    params = inspect.signature(codec_class(name).__init__).parameters
    if "seed" in params and "seed" not in options:
        options = {**options, "seed": seed}
    return options


class ChainCodec:
    """``first`` encodes the tensor; ``second`` encodes each floating-point buffer of ``first``'s payload.

    The result is one payload named ``"first+second"`` whose buffers are ``first``'s other buffers and
    ``"<buffer>.<second's buffer>"``. Unbiased when both codecs are (and ``second`` is applied to values that
    enter ``first``'s decode linearly, as mask's values do).
    """

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second
        self.name = f"{first.name}+{second.name}"
        self.unbiased = first.unbiased and second.unbiased

    def options(self) -> dict:
        return {"first": {"codec": self.first.name, **self.first.options()},
                "second": {"codec": self.second.name, **self.second.options()}}

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        p = self.first.encode(x, name=name)
        buffers, inner = {}, {}
        for bname, b in p.buffers.items():
            if b.dtype.is_floating_point and b.numel() and self.second.supports(b) is None:
                q = self.second.encode(b, name=f"{name}.{bname}")
                inner[bname] = {"shape": tuple(b.shape), "dtype": b.dtype, "meta": q.meta}
                buffers.update({f"{bname}.{k}": v for k, v in q.buffers.items()})
            else:
                buffers[bname] = b
        return Payload(self.name, p.shape, p.dtype, p.device, buffers, {"first": p.meta, "inner": inner})

    def decode(self, payload: Payload) -> torch.Tensor:
        if payload.codec != self.name:
            raise PayloadError(f"{self.name}: cannot decode a payload made by {payload.codec!r}")
        buffers = {k: v for k, v in payload.buffers.items() if k.partition(".")[0] not in payload.meta["inner"]}
        for bname, info in payload.meta["inner"].items():
            sub = {k.partition(".")[2]: v for k, v in payload.buffers.items() if k.partition(".")[0] == bname}
            q = Payload(self.second.name, torch.Size(info["shape"]), info["dtype"], payload.device, sub, info["meta"])
            buffers[bname] = self.second.decode(q)
        first = Payload(self.first.name, payload.shape, payload.dtype, payload.device, buffers,
                        payload.meta["first"])
        return self.first.decode(first)


class WireCodec:
    """How one direction of one boundary encodes the floating-point tensors of a message.

    ``spec``: a codec spec (see the module docstring). ``direction``: "fwd" (activations) or "bwd" (gradients).
    ``seed``: seed of the codec's random draws, for codecs that take one and were not given one.
    """

    def __init__(self, spec: str | CodecSpec | None = "none", *, direction: str = "fwd", seed: int = 0) -> None:
        if direction not in DIRECTIONS:
            raise ConfigError(f"WireCodec: direction must be one of {DIRECTIONS}, got {direction!r}")
        self.spec = parse_codec(spec)
        self.direction = direction
        s = self.spec
        opts = dict(s.options)
        if s.name == "none":
            if opts:
                raise ConfigError(f"{direction} codec 'none' takes no options, got {sorted(opts)}")
            self.codec = None
        elif s.name == "delta":
            if direction != "fwd":
                raise ConfigError("bwd codec 'delta' is not possible: the per-sample cache holds activations, which "
                                  "change slowly; gradients change every step. Use quant or mask for bwd")
            try:
                self.codec = DeltaCodec(**{"seed": seed, **opts})
            except TypeError as e:
                raise ConfigError(f"{direction} codec {str(s)!r}: {e}") from None
        else:
            first = get(s.name, **_with_seed(s.name, opts, seed))
            self.codec = first
            if s.then is not None:
                second = get(s.then.name, **_with_seed(s.then.name, dict(s.then.options), seed + 1))
                self.codec = ChainCodec(first, second)

    @property
    def needs_ids(self) -> bool:
        """Does this codec need the samples' ids (the per-sample delta cache)?"""
        return isinstance(self.codec, DeltaCodec)

    def describe(self) -> dict:
        """What the two ends of the boundary must agree on (seeds left out: only the sender draws)."""
        if self.codec is None:
            return {"codec": "none"}
        opts = {k: v for k, v in self.codec.options().items() if k != "seed"}
        for sub in ("first", "second"):
            if isinstance(opts.get(sub), dict):
                opts[sub] = {k: v for k, v in opts[sub].items() if k != "seed"}
        return {"codec": self.codec.name, **opts}

    def state_digest(self) -> int:
        """The codec's state digest (codecs with state that must match at both ends define ``state_digest``)."""
        fn = getattr(self.codec, "state_digest", None)
        return int(fn()) if callable(fn) else 0

    def encode(self, items: dict[str, torch.Tensor], ids=None, exact=()) -> dict[str, torch.Tensor | Payload]:
        """Encode the floating-point tensors of ``items``; the others, and those named in ``exact`` (state both
        ends must hold bit for bit, such as a codebook update), pass unchanged."""
        out = {}
        for name, t in items.items():
            if not isinstance(t, torch.Tensor):
                raise ConfigError(f"{self.direction} item {name!r} is a {type(t).__name__}; stages exchange tensors")
            t = t.detach()
            if self.codec is None or not t.dtype.is_floating_point or t.numel() == 0 or name in exact:
                out[name] = t
            elif self.needs_ids:
                out[name] = self.codec.encode(t, ids, name=f"{self.direction} tensor {name!r}")
            else:
                out[name] = self.codec.encode(t, name=f"{self.direction} tensor {name!r}")
        return out

    def decode(self, items: dict, ids=None, exact=()) -> dict[str, torch.Tensor]:
        """Decode a received message's items back to tensors (those named in ``exact`` arrive raw)."""
        out = {}
        for name, item in items.items():
            if isinstance(item, Payload):
                if self.codec is None or item.codec != self.codec.name:
                    raise WireConfigMismatchError(
                        f"{self.direction} item {name!r} arrived encoded with {item.codec!r} but this end's "
                        f"{self.direction} codec is {str(self.spec)!r}")
                out[name] = self.codec.decode(item, ids) if self.needs_ids else self.codec.decode(item)
            else:
                if self.codec is not None and item.dtype.is_floating_point and item.numel() and name not in exact:
                    raise WireConfigMismatchError(
                        f"{self.direction} item {name!r} arrived raw but this end's {self.direction} codec is "
                        f"{str(self.spec)!r}")
                out[name] = item
        return out


BoundaryCodec = deprecated(WireCodec, "actzip.wire.BoundaryCodec", "actzip.wire.WireCodec")
