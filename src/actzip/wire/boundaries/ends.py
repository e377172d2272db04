"""The two ends of a stage boundary: a sender module at the end of stage ``i``, a receiver at the start of ``i+1``.

Both are ordinary modules trained with the model. ``sender(x, ids)`` returns the *message*, exactly what
crosses the link (see :mod:`actzip.wire.protocol`); ``receiver(message)`` returns ``(x, ids or None)``. The hooks
below let a runner keep state both ends hold (a codebook, a shared projection) in step; the base classes do
nothing there.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from actzip.errors import ConfigError
from actzip.wire.boundaries.config import BoundaryConfig
from actzip.wire.protocol import check_header, header, pack_ids, unpack_ids

__all__ = ["BoundaryEnd", "BoundaryReceiver", "BoundarySender"]


class BoundaryEnd(nn.Module):
    """What both ends have: their config and its header (one hash per shared field)."""

    exact_keys: ClassVar[tuple[str, ...]] = ()  # message items a lossy byte codec must not touch (synced state)

    def __init__(self, cfg: BoundaryConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.header_names, hdr = header(cfg.header_fields())
        self.register_buffer("header", hdr, persistent=False)

    def after_optimizer_step(self) -> None:
        """Work after the optimizer step (a Stiefel step, a codebook update); nothing by default."""


class BoundarySender(BoundaryEnd):
    """End of stage ``i``: ``forward(x, ids)`` -> the message (a tensor or a dict of tensors)."""

    def _message(self, code: torch.Tensor, ids: torch.Tensor | None, vocab: int | None) -> dict[str, torch.Tensor]:
        msg = {"code": code, "cfg": self.header}
        if ids is not None and vocab is not None:
            msg["ids"] = pack_ids(ids, vocab)
        return msg

    def wire_encode(self, out):
        """What actually goes on the link, given what :meth:`forward` returned (identity unless RVQ)."""
        return out

    def request_resync(self) -> None:
        """Send the full state with the next message (after the receiver reported a desync)."""

    def wire_backward_accept(self, items: dict[str, torch.Tensor]) -> None:
        """Take what the receiver returned with its last gradient message of a step (see
        :meth:`BoundaryReceiver.wire_backward_items`); a sender that expects nothing refuses anything."""
        if items:
            raise ConfigError(
                f"wire boundary ({self.cfg.kind}): the sender got {sorted(items)} with a gradient message "
                "but expects nothing there; build both ends of a boundary from the same config"
            )


class BoundaryReceiver(BoundaryEnd):
    """Start of stage ``i+1``: ``forward(message)`` -> ``(x (batch, seq, n_embd), ids or None)``."""

    def _open(self, msg) -> dict[str, torch.Tensor]:
        if not isinstance(msg, dict) or "cfg" not in msg:
            kind = "a tensor (a 'dense' sender?)" if isinstance(msg, torch.Tensor) else type(msg).__name__
            raise ConfigError(
                f"wire boundary: a {self.cfg.kind!r} receiver expects a message dict with 'cfg', got {kind}; "
                "build both ends of a boundary from the same config"
            )
        check_header(self.cfg, self.header_names, self.header, msg["cfg"])
        return msg

    def _ids(self, msg: dict, vocab: int) -> torch.Tensor:
        if "ids" not in msg:
            raise ConfigError(f"wire boundary ({self.cfg.kind}): the message has no token ids ('ids')")
        return unpack_ids(msg["ids"], vocab)

    def _code(self, msg: dict) -> torch.Tensor:
        code = msg.get("code")
        if code is None or code.dim() != 3 or code.shape[-1] != self.cfg.width:
            got = None if code is None else tuple(code.shape)
            raise ConfigError(
                f"wire boundary ({self.cfg.kind}): expected a code of shape (batch, seq, {self.cfg.width}) "
                f"(width {self.cfg.width}), got {got}"
            )
        return code

    def wire_decode(self, msg, stale_ok: bool = False):
        """The stage input rebuilt from what arrived on the link (identity unless RVQ)."""
        return msg

    def wire_backward_items(self) -> dict[str, torch.Tensor]:
        """Tensors for the sender, sent with the last gradient message of a step, once this end's backward for
        the step is done (a shared projection's gradient); none by default."""
        return {}
