"""The codec interface: tensor -> payload -> tensor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from actzip.core.dtypes import check_dense_tensor
from actzip.errors import PayloadError
from actzip.core.payload import Payload


class Codec(ABC):
    """Turns a tensor into a :class:`Payload` and back.

    Subclasses set the class attributes below, register with
    :func:`actzip.core.registry.register_codec`, and take their options as keyword-only ``__init__`` arguments
    (that is how ``actzip.codecs.get`` validates them).
    """

    name: ClassVar[str] = "?"  # set by register_codec
    lossless: ClassVar[bool]  # decode(encode(x)) is bit-identical to x
    unbiased: ClassVar[bool]  # E[decode(encode(x))] == x (lossless codecs are trivially unbiased)
    dtypes: ClassVar[tuple[torch.dtype, ...]]  # dtypes encode accepts
    # Payload sizes follow from the tensor's shape and dtype alone (not its values), and payload_layout says
    # them: such a codec can run inside a compiled graph (actzip.memory.cache.compiled_ops).
    fixed_size: ClassVar[bool] = False
    # Its stochastic encodes add the active actzip.codecs.step_noise offset to their keys, so a CUDA graph that
    # captured them draws new noise on every replay.
    follows_step_noise: ClassVar[bool] = False

    def check(self, x: torch.Tensor, name: str = "tensor") -> torch.Tensor:
        """Raise a clear actzip error unless this codec can encode ``x``."""
        return check_dense_tensor(x, name, self.dtypes, self.name)

    def supports(self, x: torch.Tensor) -> str | None:
        """``None`` if ``x`` can be encoded, else the reason it cannot (no exception)."""
        try:
            self.check(x)
        except (TypeError, ValueError) as e:
            return str(e)
        return None

    @abstractmethod
    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        """Encode ``x``; ``name`` is used in error messages."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """Rebuild the tensor from ``payload`` (on the payload's device)."""

    def _own(self, payload: Payload) -> Payload:
        if not isinstance(payload, Payload):
            raise PayloadError(f"{self.name}: decode expects an actzip Payload, got {type(payload).__name__}")
        if payload.codec != self.name:
            raise PayloadError(f"{self.name}: cannot decode a payload made by codec {payload.codec!r}")
        return payload

    def payload_layout(self, x: torch.Tensor) -> tuple[tuple[str, ...], dict]:
        """For a ``fixed_size`` codec: the names of the buffers ``encode(x)`` makes, in a fixed order, and its
        payload's ``meta``, from ``x``'s shape, strides and dtype alone."""
        raise NotImplementedError(f"codec {self.name!r} makes payloads whose size depends on the data")

    def options(self) -> dict:
        """The options this codec was built with (for reports and configs)."""
        return {}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"
