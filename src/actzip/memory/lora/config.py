"""``LoRAConfig``: how a LoRA linear keeps what its backward needs, and the ``compress_`` config for peft models."""

from __future__ import annotations

import math
from dataclasses import dataclass

from actzip.api import Config
from actzip.errors import ConfigError

LORA_METHODS = ("lora", "fa", "care")  # what a LoRA layer keeps for grad_A; see actzip.memory.lora.function
DROPOUT_MASKS = ("bitmask", "bool", "regenerate")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class LoRAConfig(Config):
    """How LoRA layers keep their activations: ``actzip.compress_(peft_model, LoRAConfig(method="care"))``.

    The same config drives the standalone :class:`~actzip.memory.lora.LoRALinear` and the functional
    :func:`~actzip.memory.lora.lora_linear`. Every field is checked at construction.
    """

    method: str = "care"  # "care": Z and M; "fa": Z only, A frozen (LoRA-FA); "lora": the branch input (exact)
    lam: float = 1e-6  # ridge of the M fit, relative to the mean eigenvalue trace(ZᵀZ)/r (> 0: robust when singular)
    fit_chunk_rows: int = 4096  # rows of X cast to float32 at a time while fitting M (bounds the temporary)
    extra_rank: int = 0  # "care": also keep S = X·Ω (k Gaussian columns, X's dtype) and fit M on [Z, S]
    # "care" with extra_rank: passes of X·(Xᵀ·) that turn the sketch's Gaussian directions toward X's top right
    # singular vectors before S is kept (each pass two N x d x k products; 0: the plain Gaussian sketch)
    power_iters: int = 0
    # "care": 0 fits one M to all rows of a call; g > 0 fits one M to every g consecutive rows (tokens), which
    # reconstructs X from r dimensions per g rows instead of r in all, for r·d float32 numbers per g rows
    fit_group_rows: int = 0
    # dropout mask kept as "bitmask" (1 bit per element), "bool" (1 byte, no packing passes) or not at all:
    # "regenerate" keeps the RNG state and draws the mask again in backward
    dropout_mask: str = "bitmask"
    # leave padding rows out of the fit: the rows of the enclosing row_mask block, which compress_ opens from
    # the model's attention_mask argument
    use_attention_mask: bool = True

    def validate(self) -> None:
        if self.method not in LORA_METHODS:
            raise ConfigError(f"LoRA method {self.method!r} is unknown; choose one of {list(LORA_METHODS)}")
        if isinstance(self.lam, bool) or not isinstance(self.lam, (int, float)) or not (0 < self.lam < math.inf):
            raise ConfigError(f"LoRA option lam must be a positive finite number (the ridge keeps the fit solvable "
                              f"when ZᵀZ is singular), got {self.lam!r}")
        if not _is_int(self.fit_chunk_rows) or self.fit_chunk_rows < 1:
            raise ConfigError(f"LoRA option fit_chunk_rows must be a positive int, got {self.fit_chunk_rows!r}")
        if not _is_int(self.extra_rank) or self.extra_rank < 0:
            raise ConfigError(f"LoRA option extra_rank must be an int >= 0, got {self.extra_rank!r}")
        if self.extra_rank and self.method != "care":
            raise ConfigError(f"LoRA option extra_rank applies to method 'care' only, not {self.method!r}")
        if not _is_int(self.power_iters) or self.power_iters < 0:
            raise ConfigError(f"LoRA option power_iters must be an int >= 0, got {self.power_iters!r}")
        if self.power_iters and not self.extra_rank:
            raise ConfigError("LoRA option power_iters refines the extra_rank sketch: set extra_rank > 0 with it")
        g = self.fit_group_rows
        if not _is_int(g) or g < 0:
            raise ConfigError(f"LoRA option fit_group_rows must be an int >= 0 (0: one fit per call), got {g!r}")
        if g and self.method != "care":
            raise ConfigError(f"LoRA option fit_group_rows applies to method 'care' only, not {self.method!r}")
        if self.dropout_mask not in DROPOUT_MASKS:
            raise ConfigError(f"LoRA option dropout_mask must be one of {list(DROPOUT_MASKS)}, got "
                              f"{self.dropout_mask!r}")
        if not isinstance(self.use_attention_mask, bool):
            raise ConfigError(f"LoRA option use_attention_mask must be a bool, got {self.use_attention_mask!r}")
