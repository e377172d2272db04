"""The strongest hand-written alternative to the fused sparse MLP: a dense autograd function for
``down(relu(up(n))²)`` that keeps only ``relu(up(n))`` (and ``n``, which plain PyTorch keeps too) for backward.

Plain PyTorch keeps both ``r = relu(h)`` (for relu's and square's backward) and ``r²`` (down's input); this
keeps ``r`` once and rebuilds ``r²`` from it in backward, which is what the public BitSparse code compares
against. Its backward runs the same operations autograd runs for ``F.linear`` on 2-D inputs, ``square`` and
``relu``, in the same order, so its gradients are meant to be bit-identical to plain PyTorch's (the benchmark
checks it on every run).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from actzip.errors import ConfigError
from actzip.memory.modules.relu_mlp import relu_grad_dense

__all__ = ["ReluSquaredMLPKeepingRelu", "relu_squared_mlp_keeping_relu"]


class ReluSquaredMLPKeepingRelu(torch.autograd.Function):
    """``down(relu(up(n))²)`` for a 2-D ``n`` and bias-free weights, saving ``n`` and ``relu(up(n))``."""

    @staticmethod
    def forward(ctx, n: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
        r = F.relu(F.linear(n, w_up))
        ctx.save_for_backward(n, r, w_up, w_down)
        return F.linear(r.square(), w_down)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        n, r, w_up, w_down = ctx.saved_tensors
        s = r.square()  # rebuilt: the same bits as the forward's
        grad_w_down = g.t().mm(s)  # F.linear's weight gradient for a 2-D input, as autograd computes it
        grad_h = relu_grad_dense(g.mm(w_down), r, square=True)  # square's, then relu's, as autograd computes them
        grad_w_up = grad_h.t().mm(n)
        grad_n = grad_h.mm(w_up) if ctx.needs_input_grad[0] else None
        return grad_n, grad_w_up, grad_w_down


def relu_squared_mlp_keeping_relu(n: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """:class:`ReluSquaredMLPKeepingRelu` on ``n`` (rows x d); a ConfigError for any other input rank."""
    if n.dim() != 2:
        raise ConfigError(f"relu-only MLP: the input must be 2-D (rows x d), got shape {tuple(n.shape)}")
    return ReluSquaredMLPKeepingRelu.apply(n, w_up, w_down)
