"""LoRA dropout whose mask is kept as bits, as bytes, or drawn again in backward from the saved RNG state.

Each runs what ``F.dropout`` runs (``native_dropout`` where ATen fuses it, its composite elsewhere): the same
draws, the same output, and a gradient bit-identical to autograd's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from actzip.codecs.bitpack import pack_bool
from actzip.errors import ConfigError

__all__ = ["dropout_backward_from_mask", "dropout_backward_regenerated", "dropout_with_mask", "pack_mask",
           "rng_state"]


def _rng_module(device: torch.device):
    if device.type == "cpu":
        return torch
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "get_rng_state") or not hasattr(mod, "set_rng_state"):
        raise ConfigError(f"LoRA dropout on device {device}: its RNG state cannot be saved, so the mask could not "
                          "be regenerated in backward; use lora_dropout=0 there")
    return mod


def rng_state(device: torch.device) -> torch.Tensor:
    """The state of ``device``'s default generator (what ``"regenerate"`` keeps to draw the mask again)."""
    mod = _rng_module(device)
    return mod.get_rng_state() if device.type == "cpu" else mod.get_rng_state(device)


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    mod = _rng_module(device)
    if device.type == "cpu":
        mod.set_rng_state(state)
    else:
        mod.set_rng_state(state, device)


_FUSED_DROPOUT = ("cuda", "xpu", "lazy", "privateuseone")  # where F.dropout runs native_dropout (ATen's choice)


def dropout_with_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.dropout(x, p, True)``, the same draws and output, and its keep-mask (bool).

    It runs what ``F.dropout`` runs: ``native_dropout`` where ATen fuses it, elsewhere ATen's composite
    ``x * (bernoulli(1 - p) / (1 - p))``.
    """
    if x.device.type in _FUSED_DROPOUT and x.numel() > 0:
        return torch.native_dropout(x, p, True)
    noise = torch.empty_like(x).bernoulli_(1 - p)
    mask = noise != 0
    return x * noise.div_(1 - p), mask


def dropout_backward_from_mask(grad: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """The gradient through :func:`dropout_with_mask`, computed as autograd computes it for ``F.dropout``."""
    if grad.device.type in _FUSED_DROPOUT:
        return torch.ops.aten.native_dropout_backward(grad, mask, 1.0 / (1.0 - p))
    return grad * mask.to(grad.dtype).div_(1 - p)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """The keep-mask as bits (:func:`actzip.codecs.bitpack.pack_bool`'s layout; :func:`~actzip.codecs.bitpack.unpack_bool` reads it back)."""
    flat = mask.reshape(-1)
    return pack_bool(F.pad(flat, (0, -flat.numel() % 8)) if flat.numel() % 8 else flat)


def dropout_backward_regenerated(grad: torch.Tensor, p: float, state: torch.Tensor, like: tuple) -> torch.Tensor:
    """The gradient through ``F.dropout(·, p)`` as it ran in forward, from the RNG state saved before it.

    Re-running the same dropout call on a zero tensor of the input's shape, dtype and strides draws the same mask
    (the draw does not depend on the values), and autograd's own dropout backward applies it: bit-identical.
    The generator is put back as it was afterwards.
    """
    shape, stride, dtype, device = like
    current = rng_state(device)
    _set_rng_state(device, state)
    try:
        with torch.enable_grad():
            t = torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_().requires_grad_()
            (g,) = torch.autograd.grad(F.dropout(t, p, True), t, grad)
    finally:
        _set_rng_state(device, current)
    return g
