"""Reinforcement-learning losses seen from memory: which tokens a policy update's gradient weighs, and how much."""

from actzip.rl.token_weights import LOSS_TYPES, nonzero_rows, token_weights

__all__ = ["LOSS_TYPES", "nonzero_rows", "token_weights"]
