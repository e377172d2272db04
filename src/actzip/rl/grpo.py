"""TRL's ``GRPOTrainer`` with the actor update planned and the zero-gradient sequences left out.

``class Trainer(PlannedGRPOMixin, trl.GRPOTrainer)`` (the mixin first) takes two more arguments:

- ``actzip_planner``: a :class:`~actzip.memory.planner.PlannerConfig` without a probe; at the first actor
  update the policy is planned (``compress_``) with that update's own loss as the probe, so every block
  keeps, checkpoints or compresses its saved tensors to fit ``budget_bytes`` at the least step time (leave
  ``gradient_checkpointing`` off then: the plan checkpoints where it pays);
- each update's exposure, ``Σ|token weight|`` relative to the probe update's, is handed to the plan
  (:func:`actzip.memory.planner.set_exposure`), so lossy options are taken where the batch's gradient is small;
  a loss type whose weights are not known gets exposure 1, said once;
- ``drop_zero_advantage`` (default True): sequences whose token weights are all zero
  (:func:`actzip.rl.token_weights`: a group whose rewards were all equal) are sliced out of the update's batch
  before the forward, and the loss is rescaled to the full batch's normalizer, so the gradient is the full
  batch's (up to the order of floating-point sums). Kept off where other terms give those sequences a gradient
  (a KL penalty, an entropy bonus, an entropy mask) or for loss types whose weights are not known; the trainer
  says so once.

Picking the rows reads the advantages on the host (TRL's update synchronizes there already).
"""

from __future__ import annotations

import warnings

import torch

from actzip.rl.token_weights import LOSS_TYPES, nonzero_rows, token_weights

__all__ = ["PlannedGRPOMixin"]


class PlannedGRPOMixin:
    """Mix in before ``trl.GRPOTrainer`` (see the module docstring)."""

    def __init__(self, *args, actzip_planner=None, drop_zero_advantage: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if actzip_planner is not None and actzip_planner.probe is not None:
            from actzip.errors import ConfigError

            raise ConfigError("PlannedGRPOMixin: actzip_planner takes no probe (the first actor update is the probe)")
        self.actzip_planner = actzip_planner
        self.actzip_report = None  # compress_'s report once the policy is planned
        self.drop_zero_advantage = drop_zero_advantage
        self.actzip_dropped_rows = 0  # sequences left out of actor updates so far
        self._actzip_told: set[str] = set()
        self._actzip_probe_exposure = None  # Σ|token weight| of the update the plan was probed on

    def _actzip_tell(self, why: str, what: str = "zero-advantage sequences are kept in the update") -> None:
        if why not in self._actzip_told:
            self._actzip_told.add(why)
            warnings.warn(f"actzip: {what}: {why}", stacklevel=3)

    def _actzip_weights(self, inputs: dict):
        """The batch's token weights, or None for a loss type whose weights are not known (said once)."""
        if self.loss_type not in LOSS_TYPES:
            self._actzip_tell(f"loss_type {self.loss_type!r} has no known token weights", "exposure 1 for every update")
            return None
        return token_weights(inputs["advantages"], inputs["completion_mask"], self.loss_type,
                             self.max_completion_length, inputs.get("num_items_in_batch", 1.0))

    def _actzip_droppable(self) -> bool:
        if not self.drop_zero_advantage:
            return False
        for why, blocked in ((f"loss_type {self.loss_type!r} has no known token weights", self.loss_type not in LOSS_TYPES),
                             ("a KL penalty (beta != 0)", self.beta != 0.0),
                             ("an entropy bonus", bool(getattr(self, "_entropy_bonus_enabled", False))),
                             ("an entropy mask (top_entropy_quantile < 1)", self.top_entropy_quantile < 1.0)):
            if blocked:
                self._actzip_tell(why)
                return False
        return True

    def _actzip_kept(self, inputs: dict) -> tuple[dict, float]:
        """The rows of ``inputs`` that carry gradient, and the factor that restores the full batch's loss."""
        mask = inputs["completion_mask"]
        batch = mask.size(0)
        rows = nonzero_rows(self._actzip_weights(inputs))
        kept = int(rows.sum())
        if kept == batch:
            return inputs, 1.0
        if kept == 0:
            rows[0] = True  # one row, weighted 0: the update still runs (and gives zero gradients)
        factor = 0.0 if kept == 0 else 1.0  # dapo's normalizer counts the generation batch: unchanged
        if kept and self.loss_type in ("grpo", "dr_grpo"):  # their normalizers count the sequences
            factor = kept / batch
        elif kept and self.loss_type == "bnpo":  # its normalizer counts the batch's completion tokens
            factor = float(mask[rows].sum().clamp(min=1.0) / mask.sum().clamp(min=1.0))
        self.actzip_dropped_rows += batch - kept
        out = {k: (v[rows] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.size(0) == batch else v)
               for k, v in inputs.items()}
        return out, factor

    def _actzip_plan(self, model, inputs: dict) -> None:
        import dataclasses
        from collections import defaultdict

        from actzip.api import compress_

        metrics = self._metrics  # the probe steps must not reach the logs
        self._metrics = {k: defaultdict(list) for k in metrics}
        try:
            config = dataclasses.replace(self.actzip_planner, probe=lambda m: super(PlannedGRPOMixin, self)
                                         ._compute_loss(m, inputs))
            self.actzip_report = compress_(self.accelerator.unwrap_model(model), config)
        finally:
            self._metrics = metrics

    def _actzip_expose(self, model, inputs: dict) -> None:
        from actzip.memory.planner import set_exposure

        weights = self._actzip_weights(inputs)
        if weights is None:
            return
        total = float(weights.abs().sum())
        if self._actzip_probe_exposure is None:
            self._actzip_probe_exposure = total
        probe = self._actzip_probe_exposure
        set_exposure(self.accelerator.unwrap_model(model), total / probe if probe > 0 else 1.0)

    def _compute_loss(self, model, inputs):
        factor = 1.0
        if self._actzip_droppable():
            inputs, factor = self._actzip_kept(inputs)
        if self.actzip_planner is not None and model.training:
            if self.actzip_report is None:
                self._actzip_plan(model, inputs)
            self._actzip_expose(model, inputs)
        loss = super()._compute_loss(model, inputs)
        return loss if factor == 1.0 else loss * factor
