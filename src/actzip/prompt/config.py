"""``PromptVectorConfig``: where a prompt vector is read from and written to, and how it is fitted.

One config serves both uses: :class:`~actzip.prompt.vector.PromptVector` fits with it, and
``compress_(model, PromptVectorConfig(..., vector_path=...))`` installs a saved vector with it. The layer
indices are checked against a model only when one is given (``PromptVector`` or ``compress_``): the config
alone does not know how many blocks it will meet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from actzip.api import Config
from actzip.errors import ConfigError

__all__ = ["MODES", "PromptVectorConfig"]

MODES = ("replace", "add")  # what the vector does to the residual stream at the slot


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class PromptVectorConfig(Config):
    """An instruction prompt folded into one residual-stream vector, injected at one slot position."""

    # the residual stream entering block L is read from the prompt (L = number of blocks: the last block's
    # output, before the final norm)
    extract_layer: int
    # the residual stream entering block L receives the vector at the slot (0: right after the embeddings);
    # below the number of blocks
    inject_layer: int
    mode: str = "replace"  # "replace": the slot's state becomes the vector; "add": the vector is added to it
    # 0: the states of extract_layer alone; k > 0: also a softmax over layers extract_layer-k .. extract_layer+k
    # (clipped to the model), shared position weights
    over_layers: int = 0
    learn_scale: bool = True  # a learned gain on the weighted sum (a convex sum is shorter than single states)
    steps: int = 200  # Adam steps of the fit, all examples in each (0: the initial weights)
    lr: float = 0.05  # Adam's learning rate on the weight logits and the gain
    seed: int = 0  # torch's RNG seed inside the fit (the caller's RNG state is left as it was)
    # token placed at the slot before injection; None: the model config's bos id, else its pad id, else 0
    slot_token_id: int | None = None
    # only for compress_: the file PromptVector.save wrote, installed on the model
    vector_path: str | None = None

    def validate(self) -> None:
        for name in ("extract_layer", "inject_layer", "over_layers", "steps", "seed"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ConfigError(f"PromptVectorConfig.{name} must be an int >= 0, got {value!r}")
        if self.mode not in MODES:
            raise ConfigError(f"PromptVectorConfig.mode must be one of {list(MODES)}, got {self.mode!r}")
        if not isinstance(self.learn_scale, bool):
            raise ConfigError(f"PromptVectorConfig.learn_scale must be a bool, got {self.learn_scale!r}")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) \
                or self.lr <= 0:
            raise ConfigError(f"PromptVectorConfig.lr must be a finite number > 0, got {self.lr!r}")
        if self.slot_token_id is not None and (not _is_int(self.slot_token_id) or self.slot_token_id < 0):
            raise ConfigError(f"PromptVectorConfig.slot_token_id must be None or a token id >= 0, got "
                              f"{self.slot_token_id!r}")
        if self.vector_path is not None and (not isinstance(self.vector_path, str) or not self.vector_path):
            raise ConfigError(f"PromptVectorConfig.vector_path must be None or a non-empty str path, got "
                              f"{self.vector_path!r}")
