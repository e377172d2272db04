"""Rules: which codec each tensor autograd saves is stored with.

Rules are tried in order and the first whose ``when`` accepts the tensor decides; its name is what the
account reports. :func:`default_rules` gives the safe set: leaves (parameters, inputs the caller holds) are
never compressed, small or dense tensors are kept as they are, mostly-zero tensors go to the lossless sparse
codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from actzip.codecs.base import Codec
from actzip.core import registry
from actzip.codecs.sparse import memory_order
from actzip.core.dtypes import FLOAT_DTYPES, bit_view_dtype
from actzip.core.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """One rule: tensors that ``when`` accepts are stored with ``codec`` (``None`` keeps them as they are)."""

    name: str  # reported in the account
    when: Callable[[torch.Tensor], bool]  # decides from the saved tensor alone
    codec: Codec | None = None  # None: keep the tensor itself, no copy


@dataclass
class CacheConfig:
    """Options of the default rules of the compressed activation cache."""

    codec: str = "sparse"  # codec for tensors that are mostly zeros (must be lossless by default)
    codec_options: dict = field(default_factory=dict)  # passed to actzip.codecs.get(codec, **codec_options)
    min_zero_fraction: float = 0.3  # compress when at least this fraction is exactly +0.0 (bf16 then shrinks >= 24%)
    min_bytes: int = 64 * 1024  # smaller tensors are kept: the work would outweigh the bytes saved
    dedup: bool = True  # a tensor saved twice (same storage, view and version) is stored once
    allow_lossy: bool = False  # refuse a lossy codec unless set, so "lossless" is never broken by accident

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_zero_fraction <= 1.0:
            raise ConfigError(f"CacheConfig.min_zero_fraction must be in [0, 1], got {self.min_zero_fraction!r}")
        if self.min_bytes < 0:
            raise ConfigError(f"CacheConfig.min_bytes must be >= 0, got {self.min_bytes!r}")
        codec = registry.get(self.codec, **self.codec_options)  # unknown names/options fail here, at config time
        if not codec.lossless and not self.allow_lossy:
            raise ConfigError(
                f"CacheConfig.codec {self.codec!r} is lossy; set allow_lossy=True to use it in the activation cache"
            )

    def build_codec(self) -> Codec:
        return registry.get(self.codec, **self.codec_options)


def is_leaf_storage(t: torch.Tensor) -> bool:
    """A leaf tensor or a view of one: parameters, buffers and inputs that live on without autograd."""
    if t.is_leaf:
        return True
    base = t._base
    return base is not None and base.is_leaf


# Elements looked at to estimate a tensor's zero fraction: a standard error under 0.2%, and a few hundred
# kilobytes of temporaries even for a tensor of billions of elements (an exact count can need 8 bytes each).
ZERO_FRACTION_SAMPLE = 1 << 16
# Multiplier of the sampling walk: prime, so (i * stride) % n spreads over a tensor of any size.
_SAMPLE_STRIDE = 2_654_435_761


def zero_fraction(t: torch.Tensor, sample: int = ZERO_FRACTION_SAMPLE) -> float:
    """Fraction of elements whose bits are all zero (+0.0), estimated from ``sample`` elements.

    Exact for tensors of at most ``sample`` elements. Larger ones are sampled along a fixed pseudo-random
    walk (no RNG state is touched, so training randomness is unchanged). Only a decision rests on it: the
    codec itself always stores every element exactly. Synchronizes with the host on a GPU.
    """
    n = t.numel()
    if n == 0:
        return 0.0
    flat, _ = memory_order(t.detach())
    bits = flat.view(bit_view_dtype(t.dtype)) if t.dtype in FLOAT_DTYPES else flat
    if n > sample:
        stride = _SAMPLE_STRIDE if n % _SAMPLE_STRIDE else 1_000_000_007  # another prime: coprime with n
        idx = (torch.arange(sample, device=bits.device, dtype=torch.int64) * stride) % n
        bits = bits[idx]
    return 1.0 - int(torch.count_nonzero(bits)) / bits.numel()


def default_rules(config: CacheConfig | None = None) -> list[Rule]:
    """The safe rule set: leaf -> kept, unsupported -> kept, small -> kept, sparse -> codec, dense -> kept."""
    cfg = config or CacheConfig()
    codec = cfg.build_codec()

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    return [
        Rule("leaf", is_leaf_storage),
        Rule("unsupported", lambda t: codec.supports(t) is not None),
        Rule("small", lambda t: nbytes(t) < cfg.min_bytes),
        Rule(cfg.codec, lambda t: zero_fraction(t) >= cfg.min_zero_fraction, codec),
        Rule("dense", lambda t: True),
    ]


def count_only_rules() -> list[Rule]:
    """Rules that compress nothing: for measuring what autograd saves, counted the same way."""
    return [Rule("leaf", is_leaf_storage), Rule("kept", lambda t: True)]
