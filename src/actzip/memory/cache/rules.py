"""Rules: which codec each tensor autograd saves is stored with.

Rules are tried in order and the first whose ``when`` accepts the tensor decides; its name is what the
account reports. :func:`mostly_zero_rules` gives the safe set (the ``lossless`` preset): leaves (parameters,
inputs the caller holds) are never compressed, small or dense tensors are kept as they are, mostly-zero tensors
go to the lossless sparse codec. :func:`same_treatment` says whether two rules store a tensor alike (then two
saves of it may share one lossy copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from actzip.codecs.base import Codec
from actzip.core import registry
from actzip.core.dtypes import FLOAT_DTYPES, bit_view_dtype, dtype_names
from actzip.core.layout import memory_order
from actzip.errors import ConfigError
from actzip.memory.cache.active import current_cache
from actzip.memory.cache.config import (
    DEFAULT_MIN_BYTES,
    DEFAULT_MIN_ZERO_FRACTION,
    DEFAULT_RECHECK_EVERY,
    CacheConfig,
)
from actzip.memory.cache.offload import Offloader
from actzip.memory.cache.roles import role_is_assumed

__all__ = [
    "MostlyZero",
    "Rule",
    "count_only_rules",
    "default_rules",
    "is_leaf_storage",
    "mostly_zero_rules",
    "same_treatment",
    "zero_fraction",
]



@dataclass(frozen=True)
class Rule:
    """One rule: tensors that ``when`` accepts are stored with ``codec`` (``None`` keeps them as they are).

    Checked when the rule is built, with errors that list what would fit: a codec named by a string is built
    from the registry with ``codec_options`` (an unknown name, option or out-of-range value such as a bit width
    or a rank fails here); ``dtypes``, the dtypes the rule is meant for, must all be ones the codec takes. A
    rule only ever matches tensors its codec can take (and, if given, of ``dtypes``); others go on to the next
    rule. With ``offload``, what the rule stores (the tensor, or the codec's payload) moves to pinned CPU memory
    (see :mod:`actzip.memory.cache.offload`). A rule whose ``when`` asks :func:`~actzip.memory.cache.roles.current_role`
    says so with ``needs_role``: the cache then tracks roles while its ``with`` block is open.
    """

    name: str  # reported in the account
    when: Callable[[torch.Tensor], bool]  # decides from the saved tensor alone
    codec: Codec | str | None = None  # a codec, a registered codec's name, or None: keep the tensor, no copy
    codec_options: dict | None = field(default=None, compare=False)  # options of a codec given by name
    dtypes: tuple[torch.dtype, ...] | None = None  # dtypes this rule is for (None: every dtype its codec takes)
    offload: Offloader | None = None  # move what is stored to pinned CPU memory, and back for backward
    needs_role: bool = False  # when asks for the saved tensor's role: the cache enters a RoleTracker
    # when reads nothing but the role, dtype, layout, size and leafness (never the values): a cache whose rules
    # are all static remembers each decision by those and skips the rules next time
    static: bool = False

    def __post_init__(self) -> None:
        where = f"rule {self.name!r}"
        if not callable(self.when):
            raise ConfigError(f"{where}: when must be a function of the saved tensor, got {type(self.when).__name__}")
        codec = self.codec
        if isinstance(codec, str):
            try:
                codec = registry.get(codec, **(self.codec_options or {}))
            except ConfigError as e:  # unknown codec or option, or a value out of range: the message lists the fits
                raise type(e)(f"{where}: {e}") from None
            object.__setattr__(self, "codec", codec)
        elif self.codec_options is not None:
            raise ConfigError(f"{where}: codec_options need a codec given by name, e.g. codec='quant'")
        if codec is not None and not isinstance(codec, Codec):
            raise ConfigError(
                f"{where}: codec must be a codec name ({', '.join(registry.available())}), a Codec or None; "
                f"got {type(codec).__name__}"
            )
        if self.dtypes is not None:
            dtypes = tuple(self.dtypes) if isinstance(self.dtypes, (list, tuple)) else ()
            if not dtypes or not all(isinstance(d, torch.dtype) for d in dtypes):
                raise ConfigError(f"{where}: dtypes must be a non-empty sequence of torch dtypes, got {self.dtypes!r}")
            object.__setattr__(self, "dtypes", dtypes)
            bad = [d for d in dtypes if codec is not None and d not in codec.dtypes]
            if bad:
                fits = [n for n in registry.available() if all(d in getattr(registry.codec_class(n), "dtypes", ())
                                                               for d in bad)]  # fmt: skip
                raise ConfigError(
                    f"{where}: codec {codec.name!r} cannot take {dtype_names(bad)}; it takes "
                    f"{dtype_names(codec.dtypes)}; codecs that take {dtype_names(bad)}: {', '.join(fits) or 'none'}"
                )
        if self.offload is not None and not isinstance(self.offload, Offloader):
            raise ConfigError(f"{where}: offload must be an actzip.memory.cache.offload.Offloader or None, "
                              f"got {type(self.offload).__name__}")
        for flag in ("needs_role", "static"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{where}: {flag} must be True or False, got {getattr(self, flag)!r}")

    def matches(self, t: torch.Tensor) -> bool:
        """Whether this rule decides for ``t``: a dtype it is for, one its codec takes, and ``when(t)``."""
        if self.dtypes is not None and t.dtype not in self.dtypes:
            return False
        if self.codec is not None and self.codec.supports(t) is not None:
            return False
        return bool(self.when(t))


def is_leaf_storage(t: torch.Tensor) -> bool:
    """A leaf tensor or a view of one: parameters, buffers and inputs that live on without autograd. Never
    while a compiled graph's save is decided (its graph hands the cache only its own intermediates, which look
    like leaves there)."""
    if role_is_assumed():
        return False
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


class MostlyZero:
    """``when`` of a rule: is at least ``threshold`` of the tensor +0.0 (:func:`zero_fraction`)?

    The answer is remembered per save site of the open cache (the n-th save of its ``with`` block, with the same
    shape, dtype and device) and reused for ``recheck_every`` steps before the tensor is sampled again: a training loop saves the same tensors in the same order each step, and each
    sample waits for the GPU. Outside a cache every tensor is sampled.
    """

    def __init__(self, threshold: float, recheck_every: int = DEFAULT_RECHECK_EVERY) -> None:
        self.threshold, self.recheck_every = threshold, recheck_every
        self._seen: dict[tuple, list] = {}  # site -> [decision, uses left]
        self.samples = 0  # tensors sampled (each one a host synchronization on a GPU)

    def __call__(self, t: torch.Tensor) -> bool:
        cache = current_cache()
        index = None if cache is None or not self.recheck_every else cache.save_index
        site = None if index is None else (index, tuple(t.shape), t.dtype, t.device)
        hit = self._seen.get(site) if site is not None else None
        if hit is not None and hit[1] > 0:
            hit[1] -= 1
            return hit[0]
        self.samples += 1
        decision = zero_fraction(t) >= self.threshold
        if site is not None:
            self._seen[site] = [decision, self.recheck_every - 1]
        return decision


def mostly_zero_rules(
    codec: Codec,
    *,
    min_bytes: int = DEFAULT_MIN_BYTES,
    min_zero_fraction: float = DEFAULT_MIN_ZERO_FRACTION,
    recheck_every: int = DEFAULT_RECHECK_EVERY,
) -> list[Rule]:
    """The default rule set: leaf -> kept, unsupported -> kept, small -> kept, mostly zero -> ``codec``, dense ->
    kept. The mostly-zero rule is named after the codec (``"sparse"``)."""

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    return [
        Rule("leaf", is_leaf_storage, static=True),
        Rule("unsupported", lambda t: codec.supports(t) is not None, static=True),
        Rule("small", lambda t: nbytes(t) < min_bytes, static=True),
        Rule(codec.name, MostlyZero(min_zero_fraction, recheck_every), codec),
        Rule("dense", lambda t: True, static=True),
    ]


def default_rules(config: CacheConfig | None = None) -> list[Rule]:
    """The lossless preset's rules for the options of ``config`` (:func:`mostly_zero_rules` with its codec)."""
    cfg = config or CacheConfig()
    return mostly_zero_rules(cfg.build_codec(), min_bytes=cfg.min_bytes, min_zero_fraction=cfg.min_zero_fraction,
                             recheck_every=cfg.recheck_every)


def count_only_rules() -> list[Rule]:
    """Rules that compress nothing: for measuring what autograd saves, counted the same way."""
    return [Rule("leaf", is_leaf_storage, static=True), Rule("kept", lambda t: True, static=True)]


def same_treatment(a: Rule | None, b: Rule | None) -> bool:
    """Would rule ``a`` store a tensor exactly as rule ``b`` did (same codec and options, same offload)? Then a
    second save may share the first one's lossy copy, whichever roles the two rules are for."""
    if a is b:
        return True
    if a is None or b is None or a.codec is None or b.codec is None or a.offload is not b.offload:
        return False
    opts = getattr(type(a.codec), "options", None)
    return type(a.codec) is type(b.codec) and callable(opts) and a.codec.options() == b.codec.options()
