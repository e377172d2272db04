"""Reference models used to study and benchmark activation compression."""

from actzip_bench.models.gpt import ACTIVATIONS, GPT, MLP, Block, CausalSelfAttention, GPTConfig

__all__ = ["ACTIVATIONS", "GPT", "GPTConfig", "CausalSelfAttention", "MLP", "Block"]
