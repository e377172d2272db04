"""``CacheConfig``: what a cache context is built from, a preset and the options of its rules.

The rules themselves come from the named preset (:mod:`actzip.memory.cache.presets`, which registers each of its
presets here with :func:`register_preset`), built with the config's options. A config is checked when it is made:
an unknown preset, role, treatment, codec or out-of-range value fails then, not at the first forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from actzip.api import Config
from actzip.codecs.base import Codec
from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory.cache.offload import OffloadConfig

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "DEFAULT_MIN_BYTES",
    "DEFAULT_MIN_ZERO_FRACTION",
    "DEFAULT_PRESET",
    "DEFAULT_RECHECK_EVERY",
    "CacheConfig",
    "PresetBuilder",
    "preset_names",
    "register_preset",
]

DEFAULT_PRESET = "lossless"
DEFAULT_MIN_BYTES = 64 * 1024  # smaller tensors are kept: the work would outweigh the bytes saved
DEFAULT_MIN_ZERO_FRACTION = 0.3  # compress from this fraction of exact +0.0 on (bf16 then shrinks >= 24%)
# Steps for which a mostly-zero decision about a save site is reused before that tensor is sampled again.
DEFAULT_RECHECK_EVERY = 50
DEFAULT_GROUP_SIZE = 128  # elements per quantization group: 4-bit values then cost 4.5 bits each

PresetBuilder = Callable[["CacheConfig"], list]  # config -> the preset's list of rules (actzip.memory.cache.rules)
_PRESETS: dict[str, PresetBuilder] = {}


def register_preset(name: str, build: PresetBuilder) -> None:
    """Make ``name`` a preset: ``build(config)`` gives its rules for the options of ``config``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a cache preset needs a non-empty name, got {name!r}")
    if name in _PRESETS and _PRESETS[name] is not build:
        raise ConfigError(f"cache preset {name!r} is already registered")
    _PRESETS[name] = build


def preset_names() -> tuple[str, ...]:
    """The registered cache presets, in registration order."""
    return tuple(_PRESETS)


def _int_at_least(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


@dataclass
class CacheConfig(Config):
    """A cache context's preset and options: ``actzip.cache(CacheConfig(preset="4bit", min_bytes=0))``.

    Options a preset does not use are refused rather than ignored (``codec`` belongs to ``lossless``).
    """

    preset: str = DEFAULT_PRESET  # named rule set (actzip.memory.cache.presets.PRESETS): what each tensor becomes
    min_bytes: int = DEFAULT_MIN_BYTES  # smaller tensors are kept: the work would outweigh the bytes saved
    min_zero_fraction: float = DEFAULT_MIN_ZERO_FRACTION  # "sparse" from this fraction of exact +0.0 on
    # Steps for which the mostly-zero decision about a save site (the n-th save of a `with` block, same shape and
    # dtype) is reused before that tensor is sampled again. Sampling waits for the GPU (one host synchronization
    # per tensor); reusing costs nothing. 0: sample every tensor every time. The codec stays lossless either way.
    recheck_every: int = DEFAULT_RECHECK_EVERY
    codec: str = "sparse"  # lossless preset: the codec of mostly-zero tensors (a spec string works too)
    codec_options: dict = field(default_factory=dict)  # passed to actzip.codecs.get(codec, **codec_options)
    allow_lossy: bool = False  # refuse a lossy `codec` unless set, so "lossless" is never broken by accident
    group_size: int = DEFAULT_GROUP_SIZE  # elements per quantization group of the quant treatments
    seed: int | None = None  # seed of the stochastic rounding of the quant treatments (None: 0)
    treatments: dict = field(default_factory=dict)  # {role: treatment} replacing the preset's (see presets)
    offload: bool | OffloadConfig = False  # True or an OffloadConfig: what the rules store goes to pinned CPU memory
    dedup: bool = True  # a tensor saved twice (same storage, view and version) is stored once
    track_roles: bool | None = None  # enter a RoleTracker in the block; None: when a rule asks for roles
    # With roles tracked: after a tracked step, the next recheck_every steps take each save's role from that
    # step's by position, checked save by save, with no tracker over every torch call (actzip.memory.cache
    # .role_plan); False tracks every step.
    replay: bool = True
    # Under torch.compile, write the quant codec in the graph's own tensor operations, which the compiler fuses
    # with the kernels around them (no host work per saved tensor; longer compiles), instead of the codec's
    # custom op (actzip.memory.cache.compiled_quant).
    fuse_compiled: bool = False
    # Safe to capture into a CUDA graph (torch.cuda.graph around whole training steps): each block moves a
    # device-side offset of the stochastic rounding's keys, so every replay draws new noise
    # (actzip.codecs.step_noise); every rule must store a payload of fixed size (no lossless sparse codec), and
    # none may offload. Off by default: eager steps draw new noise anyway.
    graph_safe: bool = False

    def validate(self) -> None:
        for name in ("fuse_compiled", "graph_safe"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"CacheConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.preset, str) or self.preset not in _PRESETS:
            raise ConfigError(f"unknown activation cache preset {self.preset!r}; presets: {', '.join(_PRESETS)}")
        if not _int_at_least(self.min_bytes, 0):
            raise ConfigError(f"CacheConfig.min_bytes must be an int >= 0, got {self.min_bytes!r}")
        if isinstance(self.min_zero_fraction, bool) or not isinstance(self.min_zero_fraction, (int, float)) \
                or not 0.0 <= self.min_zero_fraction <= 1.0:
            raise ConfigError(f"CacheConfig.min_zero_fraction must be in [0, 1], got {self.min_zero_fraction!r}")
        if not _int_at_least(self.recheck_every, 0):
            raise ConfigError(f"CacheConfig.recheck_every must be an int >= 0, got {self.recheck_every!r}")
        if not isinstance(self.codec_options, dict):
            raise ConfigError(f"CacheConfig.codec_options must be a dict, got {type(self.codec_options).__name__}")
        codec = self.build_codec()  # unknown names/options fail here, at config time
        if not codec.lossless and not self.allow_lossy:
            raise ConfigError(
                f"CacheConfig.codec {self.codec!r} is lossy; set allow_lossy=True to use it in the activation cache"
            )
        if self.preset != DEFAULT_PRESET and (self.codec != "sparse" or self.codec_options):
            raise ConfigError(f"CacheConfig.codec is the {DEFAULT_PRESET} preset's; preset {self.preset!r} picks "
                              "codecs by role (change them with treatments={role: treatment})")
        if not _int_at_least(self.group_size, 1):
            raise ConfigError(f"CacheConfig.group_size must be an int >= 1, got {self.group_size!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"CacheConfig.seed must be None or an int, got {self.seed!r}")
        if not isinstance(self.treatments, dict):
            raise ConfigError(f"CacheConfig.treatments must be a dict {{role: treatment}}, got {self.treatments!r}")
        if not isinstance(self.offload, (bool, OffloadConfig)):
            raise ConfigError(f"CacheConfig.offload must be True, False or an OffloadConfig, got {self.offload!r}")
        for name in ("allow_lossy", "dedup", "replay"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"CacheConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.track_roles not in (None, True, False):
            raise ConfigError(f"CacheConfig.track_roles must be None, True or False, got {self.track_roles!r}")
        self.build_rules()  # roles, treatments and bit widths are checked by building the rules once

    def build_codec(self) -> Codec:
        """The codec of the lossless preset's mostly-zero rule."""
        return registry.get(self.codec, **self.codec_options)

    def build_rules(self) -> list:
        """The preset's rules for these options, with fresh codecs (their stochastic rounding starts from
        ``seed``) and, with ``offload``, one new offloader for all of them."""
        return _PRESETS[self.preset](self)

