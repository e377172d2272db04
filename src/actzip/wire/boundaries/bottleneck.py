"""The ``bottleneck`` boundary (ResBM): a learned encoder to ``b`` values added to an identity path on the first ``b``
features, decoded on the receiver. Two styles (``BottleneckConfig.style``):

- ``"linear"``: ``z = x[..., :b] + enc(LN(x))`` sent, ``x = [z, 0] + dec(z)`` rebuilt; both projections start at
  zero, so the boundary starts as its identity path.
- ``"resbm"`` (the published architecture): the encoder is a sublayer, a SiLU and a ``d -> b`` projection,
  ``z = x[..., :b] + enc(SiLU(sublayer(x)))``; the receiver decodes ``ReLU(dec(z))`` into a sublayer whose output
  is added to the identity path, ``x = [z, 0] + sublayer(ReLU(dec(z)))``: the decoded features feed the next
  layer, they are not written into the residual stream. Projections start at normal(0, 0.02). A model split
  gives the ends its own sublayers (the stage's last MLP to the sender, the next stage's first attention to the
  receiver, as ResBM does; :func:`adopt_sublayer`); by default each end owns a pre-norm MLP of width ``4 d``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from actzip.errors import ConfigError
from actzip.wire.boundaries.config import BottleneckConfig
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender

__all__ = ["BottleneckReceiver", "BottleneckSender", "adopt_sublayer"]


def _default_sublayer(d: int) -> nn.Module:
    return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


def _projection(n_in: int, n_out: int, style: str) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=style == "linear")
    if style == "linear":  # start as the pure identity path
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
    else:
        nn.init.normal_(lin.weight, std=0.02)
    return lin


def adopt_sublayer(end: BoundarySender | BoundaryReceiver, sublayer: nn.Module) -> None:
    """Give a ``resbm``-style bottleneck end the model's own sublayer (``d -> d``, e.g. a block's normed MLP for
    the sender, its normed attention for the receiver) in place of the end's default MLP."""
    if not isinstance(end, (BottleneckSender, BottleneckReceiver)) or end.cfg.style != "resbm":
        raise ConfigError(f"adopt_sublayer: needs an end of a style='resbm' bottleneck, got {type(end).__name__}"
                          f"{'' if not hasattr(end, 'cfg') else ' of ' + repr(getattr(end.cfg, 'style', None))}")
    if not isinstance(sublayer, nn.Module):
        raise ConfigError(f"adopt_sublayer: sublayer must be an nn.Module, got {type(sublayer).__name__}")
    end.sublayer = sublayer


class BottleneckSender(BoundarySender):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        d = cfg.n_embd
        if cfg.style == "linear":
            self.ln = nn.LayerNorm(d)
        else:
            self.sublayer = _default_sublayer(d)
        self.enc = _projection(d, cfg.width, cfg.style)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        b = self.cfg.width
        if self.cfg.style == "linear":
            z = x[..., :b] + self.enc(self.ln(x))
        else:
            z = x[..., :b] + self.enc(F.silu(self.sublayer(x)))
        return self._message(z.to(self.cfg.code_dtype or z.dtype), None, None)


class BottleneckReceiver(BoundaryReceiver):
    def __init__(self, cfg: BottleneckConfig) -> None:
        super().__init__(cfg)
        self.dec = _projection(cfg.width, cfg.n_embd, cfg.style)
        if cfg.style == "resbm":
            self.sublayer = _default_sublayer(cfg.n_embd)

    def forward(self, msg) -> tuple[torch.Tensor, None]:
        z = self._code(self._open(msg)).to(self.dec.weight.dtype)
        base = F.pad(z, (0, self.cfg.n_embd - self.cfg.width))
        if self.cfg.style == "linear":
            return base + self.dec(z), None
        return base + self.sublayer(F.relu(self.dec(z))), None
