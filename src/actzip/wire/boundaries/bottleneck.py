"""The ``bottleneck`` boundary (ResBM): ``z = x[..., :b] + enc(LN(x))`` sent, ``x = [z, 0] + dec(z)`` rebuilt.

Both projections start at zero, so the boundary starts as its identity path on the first ``b`` features.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from actzip.wire.boundaries.config import BottleneckConfig
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender

__all__ = ["BottleneckReceiver", "BottleneckSender"]


class BottleneckSender(BoundarySender):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        self.ln = nn.LayerNorm(cfg.n_embd)
        self.enc = nn.Linear(cfg.n_embd, cfg.width)
        nn.init.zeros_(self.enc.weight)  # start as the pure identity path
        nn.init.zeros_(self.enc.bias)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        z = x[..., : self.cfg.width] + self.enc(self.ln(x))
        return self._message(z.to(self.cfg.code_dtype or z.dtype), None, None)


class BottleneckReceiver(BoundaryReceiver):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        self.dec = nn.Linear(cfg.width, cfg.n_embd)
        nn.init.zeros_(self.dec.weight)
        nn.init.zeros_(self.dec.bias)

    def forward(self, msg) -> tuple[torch.Tensor, None]:
        z = self._code(self._open(msg)).to(self.dec.weight.dtype)
        return F.pad(z, (0, self.cfg.n_embd - self.cfg.width)) + self.dec(z), None
