"""``LoRALinear``: a frozen ``nn.Linear`` plus a LoRA adapter trained with compressed activations, no peft needed."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from actzip.errors import ConfigError
from actzip.memory.lora.config import LoRAConfig
from actzip.memory.lora.function import lora_linear

__all__ = ["LoRALinear"]


class LoRALinear(nn.Module):
    """A frozen ``nn.Linear`` plus a LoRA adapter, trained with compressed activations; no peft needed.

    Parameters follow peft's names and shapes (``lora_A.weight`` ``[r, in]``, ``lora_B.weight`` ``[out, r]``,
    ``scaling = alpha / r``, ``A`` Kaiming-uniform and ``B`` zero at init), so state dicts load into a peft
    ``lora.Linear`` and back.

    Args:
      base: the layer to adapt (frozen here, and shared, not copied).
      rank, alpha: LoRA rank ``r`` and ``alpha`` (default ``alpha = r``).
      dropout: dropout probability on the branch input.
      method, options: the fields of :class:`LoRAConfig` (``lam``, ``extra_rank``, ``dropout_mask``, ...);
        ``"fa"`` freezes ``lora_A``. ``config``: a :class:`LoRAConfig` instead of ``method`` and ``options``.
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float | None = None, dropout: float = 0.0,
                 method: str = "care", config: LoRAConfig | None = None, **options) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ConfigError(f"LoRALinear adapts an nn.Linear, got {type(base).__name__}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ConfigError(f"LoRALinear: rank must be a positive int, got {rank!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ConfigError(f"LoRALinear: dropout must be in [0, 1), got {dropout!r}")
        if config is not None and options:
            raise ConfigError(f"LoRALinear: pass either config or LoRAConfig options, not both (got {sorted(options)})")
        if config is not None and not isinstance(config, LoRAConfig):
            raise ConfigError(f"LoRALinear: config must be a LoRAConfig, got {type(config).__name__}")
        fields = {f.name for f in dataclasses.fields(LoRAConfig)} - {"method"}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise ConfigError(f"LoRALinear: unknown option(s) {unknown}; LoRAConfig's options: {sorted(fields)}")
        self.config = config if config is not None else LoRAConfig(method=method, **options)
        method = self.config.method
        self.base = base.requires_grad_(False)
        dd = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **dd)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **dd)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        if method == "fa":
            self.lora_A.requires_grad_(False)
        self.rank, self.scaling, self.dropout = rank, (rank if alpha is None else alpha) / rank, float(dropout)
        self.stats: dict[str, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout if self.training else 0.0
        a, b = self.lora_A.weight, self.lora_B.weight
        if not (torch.is_grad_enabled() and (x.requires_grad or a.requires_grad or b.requires_grad)):
            h = F.dropout(x, p, True) if p > 0 else x
            return self.base(x) + F.linear(F.linear(h, a), b) * self.scaling
        return lora_linear(x, self.base.weight, self.base.bias, a, b, scale=self.scaling, p=p,
                           config=self.config, stats=self.stats)

    def delta_weight(self) -> torch.Tensor:
        """``scaling · B·A``, what merging adds to the base weight."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}, dropout={self.dropout}, method={self.config.method!r}"
