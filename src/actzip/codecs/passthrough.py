"""The identity codec: keeps the tensor as it is. The baseline every other codec is measured against."""

from __future__ import annotations

import torch

from actzip.codecs.base import Codec
from actzip.core.payload import Payload
from actzip.core.registry import register_codec


@register_codec("passthrough")
class PassthroughCodec(Codec):
    """Holds a reference to the tensor (no copy). ``nbytes`` counts the tensor's elements."""

    lossless = True
    unbiased = True
    dtypes = ()  # any dtype

    def __init__(self) -> None:
        pass

    def check(self, x: torch.Tensor, name: str = "tensor") -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"passthrough: {name} must be a torch.Tensor, got {type(x).__name__}")
        return x

    def encode(self, x: torch.Tensor, *, name: str = "tensor") -> Payload:
        self.check(x, name)
        return Payload(self.name, x.shape, x.dtype, x.device, {"data": x.detach()})

    def decode(self, payload: Payload) -> torch.Tensor:
        return self._own(payload).buffers["data"]

