"""The ``dense`` boundary: the activation itself crosses the link."""

from __future__ import annotations

import torch

from actzip.errors import ConfigError
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender

__all__ = ["DenseReceiver", "DenseSender"]


class DenseSender(BoundarySender):
    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        return x


class DenseReceiver(BoundaryReceiver):
    def forward(self, msg) -> tuple[torch.Tensor, None]:
        if not isinstance(msg, torch.Tensor) or msg.dim() != 3 or msg.shape[-1] != self.cfg.n_embd:
            got = tuple(msg.shape) if isinstance(msg, torch.Tensor) else f"a {type(msg).__name__}"
            raise ConfigError(
                f"wire boundary (dense): expected an activation of shape (batch, seq, {self.cfg.n_embd}), got {got}; "
                "build both ends of a boundary from the same config"
            )
        return msg, None
