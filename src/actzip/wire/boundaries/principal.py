"""The ``pca`` boundary: what crosses is the activation's coordinates in the sender's own principal subspace.

A pretrained model's activations at a stage boundary are far from isotropic: most of their variance lies in
few directions, and those directions move slowly while the model adapts. The sender keeps the statistics of
what it sends (mean ``mu`` and second moment of its outputs, summed over every training microbatch), and every
``refresh`` optimizer steps folds them into an exponential average (``decay``: the old average's weight) and
takes the top-``width`` eigenvectors ``U`` (``d x k``) of its covariance. The code is ``(x - mu) U``; the
receiver rebuilds ``mu + code U^T``. Equivalently: a fixed mask that keeps the first ``k`` coordinates of
``x - mu`` in the basis of its principal directions, the basis refreshed from the data.

Both ends compute with the same ``mu`` and ``U`` at every step: when the sender takes a new basis it sends it
once (``pca_sync``: ``mu`` and ``U`` as one float32 ``d x (k + 1)`` tensor, with ``pca_state`` = ``[version it
replaces, new version]``), the receiver overwrites its copy and checks the versions follow each other
(:class:`~actzip.errors.WireDesyncError` otherwise). Those bytes are on the link and metered like the rest;
at ``refresh = 8`` they are a small share of a step's messages.

The gradient needs nothing more: the receiver's gradient with respect to the code (``k`` values a token) goes
back, and autograd on the sender turns it into ``g U^T``, the exact gradient of the model with this boundary.
No anchor pass and no correction is needed for it: the compressed model's gradient is what the fast circuit
computes. The statistics cost one ``d x d`` product per microbatch on the sender, and a refresh one
eigendecomposition (one host synchronization where the solver checks its result) every ``refresh`` steps.

The first training or evaluation forward without a basis takes one from its own input at once, so the very
first message is already compressed.
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError, WireDesyncError
from actzip.wire.boundaries.config import PCAConfig
from actzip.wire.boundaries.ends import BoundaryReceiver, BoundarySender

__all__ = ["PCAReceiver", "PCASender", "principal_basis"]

_SYNC, _STATE = "pca_sync", "pca_state"


def principal_basis(mean: torch.Tensor, second: torch.Tensor, width: int) -> torch.Tensor:
    """The top-``width`` eigenvectors (``d x width`` float32, largest first) of the covariance ``second - mean
    mean^T`` (float64 statistics: ``mean`` of the rows, ``second`` their mean outer product)."""
    cov = second - torch.outer(mean, mean)
    cov = (cov + cov.T) / 2
    _, vectors = torch.linalg.eigh(cov)  # ascending eigenvalues
    return vectors[:, -width:].flip(1).to(torch.float32).contiguous()


class PCASender(BoundarySender):
    exact_keys = (_SYNC, _STATE)

    def __init__(self, cfg: PCAConfig) -> None:
        super().__init__(cfg)
        d, k = cfg.n_embd, cfg.width
        self.register_buffer("mean", torch.zeros(d))  # mu of the basis in use
        self.register_buffer("basis", torch.zeros(d, k))  # U in use
        self.register_buffer("avg_mean", torch.zeros(d, dtype=torch.float64))  # the exponential averages
        self.register_buffer("avg_second", torch.zeros(d, d, dtype=torch.float64))
        self.register_buffer("sum_rows", torch.zeros(d, dtype=torch.float64))  # since the last refresh
        self.register_buffer("sum_outer", torch.zeros(d, d, dtype=torch.float64))
        self.register_buffer("rows", torch.zeros((), dtype=torch.float64))
        self.version = 0  # bases taken (0: none yet)
        self._sent = 0  # the version the receiver holds, or will once the messages already built arrive
        self._steps = 0

    def _observe(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)
        self.sum_rows += flat.sum(0, dtype=torch.float64)
        self.sum_outer += (flat.T @ flat).to(torch.float64)
        self.rows += flat.shape[0]

    @torch.no_grad()
    def refresh(self) -> bool:
        """Fold the statistics gathered since the last refresh into the averages and take a new basis; False
        (nothing changes) when no row was seen since."""
        n = float(self.rows)
        if n == 0:
            return False
        mean, second = self.sum_rows / n, self.sum_outer / n
        if self.version == 0:
            self.avg_mean.copy_(mean)
            self.avg_second.copy_(second)
        else:
            d = self.cfg.decay
            self.avg_mean.mul_(d).add_(mean, alpha=1 - d)
            self.avg_second.mul_(d).add_(second, alpha=1 - d)
        self.basis.copy_(principal_basis(self.avg_mean, self.avg_second, self.cfg.width))
        self.mean.copy_(self.avg_mean)
        self.sum_rows.zero_()
        self.sum_outer.zero_()
        self.rows.zero_()
        self.version += 1
        return True

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.cfg.n_embd:
            raise ConfigError(f"wire boundary (pca): expected an activation of shape (batch, seq, {self.cfg.n_embd}), "
                              f"got {tuple(x.shape)}")
        learning = self.training and torch.is_grad_enabled()
        if learning or self.version == 0:
            with torch.no_grad():
                self._observe(x)
        if self.version == 0:
            self.refresh()
        code = (x - self.mean.to(x.dtype)) @ self.basis.to(x.dtype)
        msg = self._message(code.to(self.cfg.code_dtype or code.dtype), None, None)
        if self._sent != self.version:
            msg[_SYNC] = torch.cat([self.mean[:, None], self.basis], dim=1)
            msg[_STATE] = torch.tensor([self._sent, self.version], dtype=torch.int64).to(x.device, non_blocking=True)
            self._sent = self.version
        return msg

    def after_optimizer_step(self) -> None:
        self._steps += 1
        if self._steps % self.cfg.refresh == 0:
            self.refresh()


class PCAReceiver(BoundaryReceiver):
    exact_keys = (_SYNC, _STATE)

    def __init__(self, cfg: PCAConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("mean", torch.zeros(cfg.n_embd))
        self.register_buffer("basis", torch.zeros(cfg.n_embd, cfg.width))
        self.version = 0

    def _apply_sync(self, msg: dict) -> None:
        if _SYNC not in msg:
            if self.version == 0:
                raise WireDesyncError("wire boundary (pca): a code arrived before any basis; the message that "
                                      "carried the sender's first basis was lost or not passed to this receiver")
            return
        base, version = msg[_STATE].tolist()  # once per refresh
        if base != self.version:
            raise WireDesyncError(
                f"wire boundary (pca): the receiver's basis is at version {self.version} but the update that "
                f"arrived replaces version {base}; a message carrying a basis was lost or not passed to this receiver")
        both = msg[_SYNC]
        if tuple(both.shape) != (self.cfg.n_embd, self.cfg.width + 1):
            raise ConfigError(f"wire boundary (pca): '{_SYNC}' has shape {tuple(both.shape)}, expected "
                              f"{(self.cfg.n_embd, self.cfg.width + 1)}")
        with torch.no_grad():
            both = both.to(self.mean.device, torch.float32)
            self.mean.copy_(both[:, 0])
            self.basis.copy_(both[:, 1:])
        self.version = version

    def forward(self, msg) -> tuple[torch.Tensor, None]:
        msg = self._open(msg)
        self._apply_sync(msg)
        code = self._code(msg)
        dtype = torch.float32 if code.dtype in (torch.bfloat16, torch.float16) else code.dtype
        return self.mean.to(dtype) + code.to(dtype) @ self.basis.to(dtype).T, None
