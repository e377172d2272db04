"""The gradient weight of each completion token's log-probability in TRL's GRPO losses, known before backward.

TRL's ``GRPOTrainer`` forms ``per_token_loss = −min(ρ·A, clip(ρ, 1−ε_low, 1+ε_high)·A)`` with
``ρ = exp(logp − old_logp)`` and normalizes it per ``loss_type``. With one optimization pass per generated batch
(``num_iterations=1``), ``old_logp`` is ``logp.detach()``: ``ρ ≡ 1``, nothing is clipped, and
``∂loss/∂logp[b, t]`` is exactly ``−A[b] · mask[b, t] / normalizer``:

- ``grpo``: each sequence's mean over its tokens, then the batch mean: ``normalizer = B · max(n_b, 1)``;
- ``bnpo``: over the batch's completion tokens: ``normalizer = max(Σ mask, 1)``;
- ``dr_grpo``: ``normalizer = B · max_completion_length``;
- ``dapo``: over the tokens of the whole generation batch across processes:
  ``normalizer = max(num_items_in_batch, 1) / num_processes · gradient_accumulation_steps / steps_per_generation``.

Every loss is further divided by the gradient accumulation steps (``grpo``, ``bnpo``, ``dr_grpo``), as TRL does
in training. The weights cover the policy-gradient term only: a KL penalty (``beta > 0``) or an entropy bonus adds
terms that depend on the forward's values, and several passes per batch (``num_iterations > 1``) make ``ρ ≠ 1``.
"""

from __future__ import annotations

import torch

from actzip.errors import ConfigError, InvalidValueError

__all__ = ["LOSS_TYPES", "nonzero_rows", "token_weights"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


def token_weights(
    advantages: torch.Tensor,
    completion_mask: torch.Tensor,
    loss_type: str,
    max_completion_length: int | None = None,
    num_items_in_batch: int | float | torch.Tensor | None = None,
    *,
    num_processes: int = 1,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int | None = None,
) -> torch.Tensor:
    """``∂loss/∂logp`` per completion token, shape ``completion_mask.shape``, float32 (see the module docstring).

    Args:
      advantages: ``(B,)`` or ``(B, T)`` advantages (TRL's ``inputs["advantages"]``).
      completion_mask: ``(B, T)`` 1 for a completion token that counts, 0 for padding.
      loss_type: one of :data:`LOSS_TYPES`.
      max_completion_length: ``dr_grpo``'s fixed length.
      num_items_in_batch: ``dapo``'s token count of the generation batch (all processes).
      num_processes, gradient_accumulation_steps, steps_per_generation: the trainer's (``steps_per_generation``
        defaults to ``gradient_accumulation_steps``, TRL's default).
    """
    if loss_type not in LOSS_TYPES:
        raise ConfigError(f"token_weights: loss_type {loss_type!r} is not one whose weights are known before "
                          f"backward; choose from {list(LOSS_TYPES)}")
    if completion_mask.dim() != 2:
        raise InvalidValueError(f"token_weights: completion_mask must be (B, T), got shape "
                                f"{tuple(completion_mask.shape)}")
    mask = completion_mask.to(torch.float32)
    adv = advantages.to(device=mask.device, dtype=torch.float32)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    if adv.dim() != 2 or adv.size(0) != mask.size(0) or adv.size(1) not in (1, mask.size(1)):
        raise InvalidValueError(f"token_weights: advantages of shape {tuple(advantages.shape)} do not match "
                                f"completion_mask {tuple(completion_mask.shape)} (want (B,) or (B, T))")
    for name, v in (("num_processes", num_processes), ("gradient_accumulation_steps", gradient_accumulation_steps)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"token_weights: {name} must be an int >= 1, got {v!r}")
    accumulation = float(gradient_accumulation_steps)
    batch = mask.size(0)
    if loss_type == "grpo":
        normalizer = mask.sum(-1, keepdim=True).clamp(min=1.0) * batch * accumulation
    elif loss_type == "bnpo":
        normalizer = mask.sum().clamp(min=1.0) * accumulation
    elif loss_type == "dr_grpo":
        if not isinstance(max_completion_length, int) or max_completion_length < 1:
            raise ConfigError(f"token_weights: loss_type 'dr_grpo' needs max_completion_length (an int >= 1), got "
                              f"{max_completion_length!r}")
        normalizer = torch.tensor(float(batch * max_completion_length) * accumulation, device=mask.device)
    else:  # dapo
        if num_items_in_batch is None:
            raise ConfigError("token_weights: loss_type 'dapo' needs num_items_in_batch (the generation batch's "
                              "completion tokens over all processes)")
        items = torch.as_tensor(num_items_in_batch, dtype=torch.float32, device=mask.device).clamp(min=1.0)
        steps = gradient_accumulation_steps if steps_per_generation is None else steps_per_generation
        normalizer = items / num_processes * accumulation / steps
    return -adv * mask / normalizer


def nonzero_rows(weights: torch.Tensor) -> torch.Tensor:
    """A ``(B,)`` bool tensor: the sequences whose tokens carry any gradient (a group whose rewards are all equal
    has zero advantages: its sequences can be dropped from the actor update without changing the gradient)."""
    if weights.dim() != 2:
        raise InvalidValueError(f"nonzero_rows: weights must be (B, T), got shape {tuple(weights.shape)}")
    return (weights != 0).any(dim=1)
