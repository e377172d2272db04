"""Reinforcement-learning losses seen from memory: which tokens a policy update's gradient weighs, and how much;
TRL's GRPOTrainer with its actor update planned (:mod:`actzip.rl.grpo`)."""

from actzip.rl.grpo import PlannedGRPOMixin
from actzip.rl.token_weights import LOSS_TYPES, nonzero_rows, token_weights

__all__ = ["LOSS_TYPES", "PlannedGRPOMixin", "nonzero_rows", "token_weights"]
