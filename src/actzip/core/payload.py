"""The payload: what a codec makes of a tensor, and exactly how many bytes it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Payload:
    """A tensor in encoded form.

    ``buffers`` hold all the encoded data; ``meta`` holds small Python values (shape, dtype, options) needed to
    decode. ``nbytes`` counts every element of every buffer, so it is the memory the payload keeps alive as long
    as codecs hand out buffers that own their storage (every actzip codec does, except ``passthrough``, which
    holds the tensor it was given).
    """

    codec: str  # registry name of the codec that made it
    shape: torch.Size  # shape of the encoded tensor
    dtype: torch.dtype  # dtype of the encoded tensor
    device: torch.device  # device the buffers live on
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the payload's buffers."""
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    @property
    def dense_nbytes(self) -> int:
        """Bytes the tensor would take uncompressed."""
        return self.shape.numel() * self.dtype.itemsize

    @property
    def ratio(self) -> float:
        """Compression ratio: dense bytes over payload bytes (>1 means smaller)."""
        n = self.nbytes
        return float("inf") if n == 0 else self.dense_nbytes / n

    def __repr__(self) -> str:
        return (
            f"Payload(codec={self.codec!r}, shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"nbytes={self.nbytes}, ratio={self.ratio:.3f})"
        )
