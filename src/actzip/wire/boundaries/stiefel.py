"""The two ends of a ``stiefel`` (MAPL) boundary: an orthonormal projection, anchors, optional RVQ.

Sender: ``code = x V`` (``V``: ``d x k``, orthonormal columns, kept on the Stiefel manifold by
:class:`actzip.wire.stiefel.StiefelStepper`), optionally residual-vector-quantized. Receiver: ``x = code V^T``
plus the part of a learned token/position anchor outside ``span(V)`` (all of it with ``anchor_whole``). The
anchor is built from the token ids the receiver already has: each position's token, its position and, with
``anchor_context > 1``, the tokens before it.

Two ways to hold ``V`` (:attr:`StiefelConfig.tie`):

- untied (default): each end owns a ``V``, started equal, each stepped with its own share of the gradient. No
  extra bytes, but ``V_r V_s^T`` drifts from the identity, so the boundary is not exact even at ``k = d``;
- tied: one ``V``. The receiver's share of its gradient (``dL/dV = g^T code`` over the step's tokens) goes back
  with the step's last gradient message (:meth:`StiefelReceiver.wire_backward_items`), the sender adds it to its
  own share, steps, and sends the new ``V`` with its next message (``v_sync``, with the version it replaces in
  ``v_state``). The receiver overwrites its copy, so both ends compute with the same ``V`` at every step; at
  ``k = d`` the boundary passes ``x`` through unchanged. Cost: ``d * k * 4`` bytes each way per step.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from actzip.codecs.rvq import CodebookDelta, RVQCodebook, RVQLearner, straight_through
from actzip.codecs.sketch import derive_seed
from actzip.errors import ConfigError, WireDesyncError
from actzip.wire.boundaries.config import StiefelConfig
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender
from actzip.wire.stiefel import StiefelStepper, random_stiefel

__all__ = ["StiefelReceiver", "StiefelSender"]

_RVQ_KEYS = ("rvq_sync", "rvq_rows", "rvq_values")
_V_GRAD = "v_grad"  # the receiver's share of V's gradient, returned once per step
_STATE_KEYS = ("v_sync", "v_state", *_RVQ_KEYS, "rvq_state", "rvq_idx")  # both ends hold these bit for bit


def _hold_projection(end: nn.Module, cfg: StiefelConfig) -> None:
    """Give ``end`` its V (the seeded start both ends share), the stepper that keeps V on the manifold, and the
    version of V it holds (``tie``: steps taken on the sender, updates applied on the receiver)."""
    end.V = nn.Parameter(random_stiefel(cfg.n_embd, cfg.width, derive_seed(cfg.seed, 3)))
    end.stepper = StiefelStepper(end.V, lr=cfg.lr, method=cfg.method, retraction=cfg.retraction)
    end.v_version = 0


class StiefelSender(BoundarySender):
    exact_keys = _STATE_KEYS

    def __init__(self, cfg: StiefelConfig) -> None:
        super().__init__(cfg)
        _hold_projection(self, cfg)
        self._v_sent = 0  # tie: the version the receiver has (or will have from a message already built)
        self._peer_grad = False  # tie: the receiver's share arrived since the last step
        if cfg.rvq is not None:
            self.book = RVQCodebook(cfg.rvq)
            self.learner = RVQLearner(self.book)
            # squared error of the quantized training codes and their squared norm, summed on the device
            self.register_buffer("rvq_err", torch.zeros(2), persistent=False)

    def rvq_relative_error(self) -> float | None:
        """``||q - c|| / ||c||`` over every training code quantized so far (one host read); None without RVQ."""
        if self.cfg.rvq is None or not float(self.rvq_err[1]):
            return None
        return float((self.rvq_err[0] / self.rvq_err[1]).sqrt())

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        if cfg.anchor_rank and ids is None:
            raise ConfigError("wire boundary (stiefel): the sender needs the token ids for the receiver's anchors")
        code = x @ self.V.to(x.dtype)
        vocab = cfg.vocab_size if cfg.anchor_rank else None
        if cfg.rvq is None:
            msg = self._message(code.to(cfg.code_dtype or code.dtype), ids, vocab)
        else:
            msg = self._rvq_message(code, ids, vocab)
        if cfg.tie and self._v_sent != self.v_version:
            msg["v_sync"] = self.V.detach().float().clone()
            msg["v_state"] = torch.tensor([self._v_sent, self.v_version], dtype=torch.int64).to(
                x.device, non_blocking=True
            )
            self._v_sent = self.v_version
        return msg

    def _rvq_message(self, code: torch.Tensor, ids: torch.Tensor | None, vocab: int | None) -> dict:
        cfg = self.cfg
        B, T, k = code.shape
        flat = code.reshape(B * T, k)
        idx, q, inputs = self.book.quantize(flat)
        if self.training and torch.is_grad_enabled():
            self.learner.observe(idx, inputs)
            with torch.no_grad():
                c = flat.detach().float()
                self.rvq_err += torch.stack(((q - c).square().sum(), c.square().sum()))
        port = straight_through(flat.float(), q, cfg.rvq.commitment).view(B, T, k)
        msg = self._message(port.to(cfg.code_dtype or torch.float32), ids, vocab)
        state = [self.book.version, self.book.checksum, B, T]
        msg["rvq_state"] = torch.tensor(state, dtype=torch.int64).to(code.device, non_blocking=True)
        msg["rvq_idx"] = self.book.pack(idx)
        delta = self.learner.take_message()
        if delta is not None:
            msg.update(delta.to_tensors())
        return msg

    def wire_encode(self, out):
        """Drop the float ``code`` when RVQ indices replace it: the receiver rebuilds it from the codebook."""
        if self.cfg.rvq is None:
            return out
        return {k: v for k, v in out.items() if k != "code"}

    def wire_backward_accept(self, items: dict[str, torch.Tensor]) -> None:
        """Add the receiver's share of ``V``'s gradient (``tie``) to this end's."""
        if not self.cfg.tie or set(items) != {_V_GRAD}:
            if not items:
                return
            raise ConfigError(
                f"wire boundary (stiefel, tie={self.cfg.tie}): the sender got {sorted(items)} with a gradient "
                f"message; build both ends of a boundary from the same config"
            )
        self.stepper.add_grad(items[_V_GRAD])
        self._peer_grad = True

    def after_optimizer_step(self) -> None:
        if self.cfg.tie and self.stepper.pending and not self._peer_grad:
            raise ConfigError(
                "wire boundary (stiefel, tie=True): V is about to step without the receiver's share of its "
                "gradient; a runner must pass the receiver's wire_backward_items() to the sender's "
                "wire_backward_accept() after the backward (actzip.wire.Pipeline does; with run_chain call "
                "actzip.wire.exchange_backward)"
            )
        self._peer_grad = False
        if self.stepper.step() and self.cfg.tie:
            self.v_version += 1
        if self.cfg.rvq is not None:
            self.learner.update()

    def request_resync(self) -> None:
        if self.cfg.rvq is not None:
            self.learner.request_resync()


class StiefelReceiver(BoundaryReceiver):
    exact_keys = _STATE_KEYS

    def __init__(self, cfg: StiefelConfig) -> None:
        super().__init__(cfg)
        _hold_projection(self, cfg)  # tied, its stepper only collects this end's gradient share; it never steps
        r = cfg.anchor_rank
        if r:
            self.anchor_tok = nn.Parameter(torch.randn(cfg.vocab_size, r) * 0.02)
            self.anchor_pos = nn.Parameter(torch.randn(cfg.block_size, r) * 0.02)
            self.anchor_out = nn.Parameter(torch.randn(r, cfg.n_embd) / math.sqrt(r))
            if cfg.anchor_context > 1:  # one table per earlier token; row vocab_size: before the sequence start
                self.anchor_before = nn.Parameter(torch.randn(cfg.anchor_context - 1, cfg.vocab_size + 1, r) * 0.02)
        if cfg.rvq is not None:
            self.book = RVQCodebook(cfg.rvq)

    def wire_decode(self, msg, stale_ok: bool = False):
        """Apply a codebook update, check it, rebuild ``code`` (``stale_ok``: with this codebook as it is)."""
        if self.cfg.rvq is None:
            return msg
        return self._rvq_decode(self._open(msg), stale_ok)

    def _rvq_decode(self, msg: dict, stale_ok: bool = False) -> dict:
        if "rvq_sync" in msg:
            delta = CodebookDelta.from_tensors(msg)
            if not stale_ok or delta.base_version in (-1, self.book.version):
                self.book.apply_delta(delta)
            msg = {k: v for k, v in msg.items() if k not in _RVQ_KEYS}
        if "rvq_state" not in msg or "rvq_idx" not in msg:
            raise ConfigError("wire boundary (stiefel-rvq): the message lacks 'rvq_state' or 'rvq_idx'")
        version, checksum, B, T = msg["rvq_state"].tolist()
        if stale_ok:  # decoded under this end's codebook: the forward's own check compares against it
            version, checksum = self.book.version, self.book.checksum
            msg = dict(msg, rvq_state=msg["rvq_state"].new_tensor([version, checksum, B, T]))  # caller's untouched
        self.book.verify(version, checksum)
        if "code" not in msg:
            idx = self.book.unpack(msg["rvq_idx"], B * T)
            code = self.book.lookup(idx).view(B, T, self.cfg.width)
            msg = dict(msg, code=code.to(self.cfg.code_dtype or torch.float32))
        return msg

    def _apply_v_sync(self, msg: dict) -> None:
        if not self.cfg.tie:
            if "v_sync" in msg:
                raise ConfigError("wire boundary (stiefel): the message carries a shared V ('v_sync') but this "
                                  "receiver is untied; build both ends of a boundary from the same config")
            return
        if "v_sync" not in msg:
            return
        base, version = msg["v_state"].tolist()  # once per step, with the new V
        if base != self.v_version:
            raise WireDesyncError(
                f"wire boundary (stiefel, tie=True): the receiver's V is at version {self.v_version} but the update "
                f"that arrived replaces version {base}; a message carrying V was lost or not passed to this receiver"
            )
        v = msg["v_sync"]
        if tuple(v.shape) != tuple(self.V.shape):
            raise ConfigError(f"wire boundary (stiefel): 'v_sync' has shape {tuple(v.shape)}, expected "
                              f"{tuple(self.V.shape)}")
        with torch.no_grad():
            self.V.copy_(v.to(self.V.device, self.V.dtype))
        self.v_version = version

    def forward(self, msg) -> tuple[torch.Tensor, torch.Tensor | None]:
        msg = self._open(msg)
        if self.cfg.rvq is not None:
            msg = self._rvq_decode(msg)
        self._apply_v_sync(msg)
        cfg = self.cfg
        code = self._code(msg)
        V = self.V.to(torch.float32 if code.dtype in (torch.bfloat16, torch.float16) else code.dtype)
        x = code.to(V.dtype) @ V.t()
        if not cfg.anchor_rank:
            return x, None
        ids = self._ids(msg, cfg.vocab_size)
        anchor = self._anchor_embedding(ids) @ self.anchor_out
        if cfg.anchor_whole:
            return x + anchor, ids
        # Only the anchor's component outside span(V) is added: the code owns the span.
        return x + anchor - (anchor @ V) @ V.t(), ids

    def _anchor_embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """Rank-r anchor of every position: its token and position, plus the ``anchor_context - 1`` tokens before."""
        emb = self.anchor_tok[ids] + self.anchor_pos[: ids.shape[1]]
        for lag in range(1, self.cfg.anchor_context):
            before = torch.full_like(ids, self.cfg.vocab_size)
            before[:, lag:] = ids[:, :-lag]
            emb = emb + self.anchor_before[lag - 1][before]
        return emb

    def wire_backward_items(self) -> dict[str, torch.Tensor]:
        """Tied: this end's share of ``V``'s gradient since the last call (for the sender)."""
        if not self.cfg.tie:
            return {}
        g = self.stepper.take_grad()
        return {} if g is None else {_V_GRAD: g.float()}

    def after_optimizer_step(self) -> None:
        if not self.cfg.tie:  # tied, the sender steps V and sends it
            self.stepper.step()
