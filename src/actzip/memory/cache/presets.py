"""Cache presets: named rule sets for the activation cache, chosen by the role of each saved tensor.

>>> cache = actzip.cache("balanced", min_bytes=64 * 1024)   # built once, entered every step
>>> with cache:
...     loss = model(x).sum()
>>> loss.backward()
>>> cache.last.by_rule["linear_input:quant4"]

The cache tracks roles (:class:`~actzip.memory.cache.roles.RoleTracker`) in its ``with`` block because these
rules ask for them (``Rule.needs_role``). Rules of a preset used without a tracker see every tensor as ``other``
and keep it as it is (safe, but nothing is compressed). Each preset registers itself with
:func:`~actzip.memory.cache.config.register_preset`, so ``CacheConfig(preset=name)`` knows it.

Every preset but ``lossless`` starts with the checks of the default rules: leaves (``leaf``), tensors the
quant codec cannot take (``unsupported``: not a float dtype, not strided) and tensors under ``min_bytes``
(``small``) are kept. Then each role (:mod:`actzip.memory.cache.roles`) gets a treatment; the account reports each
tensor under ``"<role>:<treatment>"`` (e.g. ``linear_input:quant4``, ``attention:kept``).

========================  ==========  ==============  ==============  ==============
role                      lossless    conservative    balanced        aggressive
========================  ==========  ==============  ==============  ==============
linear_input              default     quant8 (sr)     quant4 (sr)     quant2 (sr)
nonlinear_input           default     kept            quant8 (rn)     quant8 (rn)
relu_output               default     sparse          sparse          sparse
attention, norm           default     kept            kept            kept
loss, parameter, other    default     kept            kept            kept
lossy                     no          yes             yes             yes
========================  ==========  ==============  ==============  ==============

``default``: :func:`~actzip.memory.cache.rules.mostly_zero_rules` (lossless sparse for mostly-zero tensors, whatever their
role). ``quantN``: the lossy ``quant`` codec at N bits, groups of ``group_size`` (128) elements, minmax scale;
``(sr)`` stochastic rounding (unbiased: the weight gradient ``G^T x`` stays unbiased), ``(rn)`` round to nearest
(half the error; the derivative of a nonlinear function is not unbiased under rounding anyway). ``sparse``:
the lossless sparse codec when at least ``min_zero_fraction`` of the tensor is zero, else kept.

Safety rule, kept by every preset above: a ``nonlinear_input`` is stored losslessly or with at least 8 bits.

``4bit`` (not in the table) stores every activation in 4 bits, as ActNN and GACT do, except the loss head's:
linear inputs and ``other`` (e.g. what a checkpointed region keeps) with stochastic rounding (unbiased);
nonlinear inputs, relu outputs, attention and norm tensors to nearest; ``loss`` kept (at 4 bits the error of the
log-probabilities scales the output probabilities: a tiny GPT's final loss gap went from +2.7% to +0.6% by keeping
them; they are a float32 tensor of tokens x vocabulary unless the loss is chunked). It is the one preset that opts out of the
safety rule (its floor for nonlinear inputs is 4 bits): the backward of a nonlinear function then sees an input
off by up to half a quantization step of its group. With groups of 128 and float32 group parameters, 4.5 bits per
element: 3.56x smaller than bf16.
``2bit`` (not in the table either) is ``4bit`` with linear inputs and ``other`` at 2 bits, stochastic: the
unbiased compression of linear operators' inputs is where the theory says few bits are safe, and linear inputs
are about 40% of a transformer block's saved bytes. 4.7x smaller than bf16 on the reference GPT (ActNN reports
12x over float32 for CNNs, all of whose activations go to 2 bits).
Quantized tensors use ``check=False``: a non-finite value makes its group decode to NaN (so a gradient scaler
still sees the overflow) instead of raising inside the forward pass.

A tensor saved twice is stored once when its first copy is lossless, or when the rules store the second save
exactly as the first (same codec and options, whatever the roles: the q, k and v projections of one input share
one 4-bit copy; under ``4bit`` a relu output saved by the relu and by the square of relu² too); otherwise the second
save gets its own copy, so a tensor saved first as a linear input and later by a nonlinear function
(``lin(h) * h``) gets an 8-bit copy for the second save.

``treatments={role: how}`` overrides a preset's treatment of a role; ``how`` is ``kept``, ``sparse`` or
``quant<bits>-<sr|rn>`` (bits 1, 2, 4 or 8), each optionally followed by ``+offload``. ``offload=True`` adds
``+offload`` to every treatment (and to what the fall-through rules keep): what the rule stores, the tensor
or its payload, moves to pinned CPU memory (:mod:`actzip.memory.cache.offload`); the account reports it under
``"<role>:<treatment>+offload"`` with 0 device bytes. A treatment, role or bit width that does not exist fails
when the rules are built, with a message listing what would fit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from actzip import compat
from actzip.codecs.base import Codec
from actzip.codecs.quant import QUANT_BITS
from actzip.core import registry
from actzip.errors import ConfigError
from actzip.memory.cache.config import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_MIN_BYTES,
    DEFAULT_MIN_ZERO_FRACTION,
    DEFAULT_RECHECK_EVERY,
    CacheConfig,
    register_preset,
)
from actzip.memory.cache.context import CacheContext
from actzip.memory.cache.offload import OffloadConfig, Offloader
from actzip.memory.cache.roles import (
    ATTENTION,
    LINEAR_INPUT,
    LOSS,
    NONLINEAR_INPUT,
    NORM,
    OTHER,
    PARAMETER,
    RELU_OUTPUT,
    ROLES,
    current_role,
)
from actzip.memory.cache.rules import MostlyZero, Rule, is_leaf_storage, mostly_zero_rules

__all__ = ["DEFAULT_MIN_BYTES", "MIN_NONLINEAR_BITS", "PRESETS", "Preset", "TREATMENT_FORMS", "compressed",
           "describe", "preset_rules"]

KEPT = "kept"


@dataclass(frozen=True)
class Preset:
    """A cache preset, a named rule set: ``treatments`` maps each role to ``"kept"``, ``"sparse"`` or ``"quantN-sr/rn"``."""

    name: str
    description: str
    lossy: bool
    treatments: dict[str, str]
    # Fewest bits a nonlinear input may get. 8 for every preset that claims the safety rule; the all-4-bit preset
    # opts out (biased backward through nonlinear functions, traded for the ratio) and says so.
    min_nonlinear_bits: int = 8


def _uniform(**roles: str) -> dict[str, str]:
    base = {r: KEPT for r in (LINEAR_INPUT, NONLINEAR_INPUT, RELU_OUTPUT, ATTENTION, NORM, LOSS, PARAMETER, OTHER)}
    base.update(roles)
    return base


PRESETS: dict[str, Preset] = {
    "lossless": Preset(
        "lossless", "the default rules: lossless sparse for mostly-zero tensors, bit-identical gradients", False, {}
    ),
    "conservative": Preset(
        "conservative",
        "lossy: linear inputs 8-bit stochastic; relu outputs lossless sparse; everything else kept",
        True,
        _uniform(linear_input="quant8-sr", relu_output="sparse"),
    ),
    "balanced": Preset(
        "balanced",
        "lossy: linear inputs 4-bit stochastic; nonlinear inputs 8-bit nearest; relu outputs lossless sparse; "
        "attention, norm and the rest kept",
        True,
        _uniform(linear_input="quant4-sr", nonlinear_input="quant8-rn", relu_output="sparse"),
    ),
    "aggressive": Preset(
        "aggressive",
        "lossy: linear inputs 2-bit stochastic; nonlinear inputs 8-bit nearest; relu outputs lossless sparse; "
        "attention, norm and the rest kept",
        True,
        _uniform(linear_input="quant2-sr", nonlinear_input="quant8-rn", relu_output="sparse"),
    ),
    "4bit": Preset(
        "4bit",
        "lossy, every activation in 4 bits as ActNN and GACT do, but the loss head's: linear inputs and the "
        "rest stochastic (unbiased); nonlinear inputs, relu outputs, attention and norm tensors nearest. Opts "
        "out of the safety rule: the backward of nonlinear functions sees inputs off by up to half a "
        "quantization step",
        True,
        _uniform(linear_input="quant4-sr", nonlinear_input="quant4-rn", relu_output="quant4-rn",
                 attention="quant4-rn", norm="quant4-rn", other="quant4-sr"),
        min_nonlinear_bits=4,
    ),
    "2bit": Preset(
        "2bit",
        "lossy, the 4bit preset with linear inputs and the rest at 2 bits, stochastic (unbiased: where the fewest "
        "bits are safe); nonlinear inputs, relu outputs, attention and norm tensors 4-bit nearest. Opts out of the "
        "safety rule as 4bit does",
        True,
        _uniform(linear_input="quant2-sr", nonlinear_input="quant4-rn", relu_output="quant4-rn",
                 attention="quant4-rn", norm="quant4-rn", other="quant2-sr"),
        min_nonlinear_bits=4,
    ),
}

MIN_NONLINEAR_BITS = 8  # the safety rule: nonlinear inputs are lossless or quantized with at least this many bits


def _get(name: str) -> Preset:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown activation cache preset {name!r}; presets: {', '.join(PRESETS)}") from None


def describe(name: str) -> str:
    """One line per role: what preset ``name`` does with it."""
    p = _get(name)
    if not p.treatments:
        return f"{p.name}: {p.description}"
    rows = "\n".join(f"  {role}: {how}" for role, how in p.treatments.items())
    return f"{p.name}: {p.description}\n{rows}"


_ROUNDINGS = {"sr": "stochastic", "rn": "nearest"}
OFFLOAD = "+offload"
_WIDTHS = ", ".join(map(str, QUANT_BITS))
TREATMENT_FORMS = f"{KEPT}, sparse, quant<bits>-<sr|rn> (bits {_WIDTHS}), each optionally +offload"


def _role_rule(role: str, how: str, mostly_zero: Callable[[], MostlyZero], group_size: int, seed: int | None,
               offloader, min_nonlinear_bits: int = MIN_NONLINEAR_BITS) -> Rule:
    """The rule for ``role`` treated as ``how``; ``offloader()`` gives the shared Offloader for ``+offload``,
    ``mostly_zero()`` a new mostly-zero test for ``sparse``."""
    where = f"treatment {how!r} for role {role!r}"
    if not isinstance(how, str):
        raise ConfigError(f"{where}: treatments are strings: {TREATMENT_FORMS}")
    base, plus, extra = how.partition("+")
    if plus and extra != OFFLOAD[1:]:
        raise ConfigError(f"{where}: unknown suffix {plus + extra!r}; treatments: {TREATMENT_FORMS}")
    off = offloader() if plus else None
    suffix = OFFLOAD if plus else ""
    is_role: Callable[[torch.Tensor], bool] = lambda t: current_role(t) == role  # noqa: E731
    if base == KEPT:
        return Rule(f"{role}:{KEPT}{suffix}", is_role, offload=off, needs_role=True, static=True)
    if base == "sparse":
        codec = registry.get("sparse")
        zeros = mostly_zero()
        sparse = lambda t: is_role(t) and zeros(t)  # noqa: E731
        return Rule(f"{role}:sparse{suffix}", sparse, codec, offload=off, needs_role=True)
    if base.startswith("quant"):
        bits_s, _, rounding_s = base[len("quant"):].partition("-")
        if not bits_s.isdigit() or rounding_s not in _ROUNDINGS:
            raise ConfigError(f"{where}: write quant<bits>-<sr|rn>; treatments: {TREATMENT_FORMS}")
        bits = int(bits_s)
        if bits not in QUANT_BITS:
            raise ConfigError(f"{where}: bit width {bits} is out of range; widths: {_WIDTHS}")
        if role == NONLINEAR_INPUT and bits < min_nonlinear_bits:
            raise ConfigError(f"nonlinear inputs must keep at least {min_nonlinear_bits} bits, got {how!r} (only "
                              f"the 4bit preset opts out of this safety rule)")
        rounding = _ROUNDINGS[rounding_s]
        codec = registry.get("quant", bits=bits, group_size=group_size, rounding=rounding, seed=seed, check=False)
        return Rule(f"{role}:quant{bits}{suffix}", is_role, codec, offload=off, needs_role=True, static=True)
    raise ConfigError(f"unknown {where}; treatments: {TREATMENT_FORMS}")


def _with_offload(rule: Rule, off: Offloader) -> Rule:
    return dataclasses.replace(rule, name=rule.name + OFFLOAD, offload=off)


def preset_rules(
    name: str = "balanced",
    *,
    min_bytes: int = DEFAULT_MIN_BYTES,
    min_zero_fraction: float = DEFAULT_MIN_ZERO_FRACTION,
    recheck_every: int = DEFAULT_RECHECK_EVERY,
    group_size: int = DEFAULT_GROUP_SIZE,
    seed: int | None = None,
    treatments: dict[str, str] | None = None,
    offload: bool | Offloader = False,
    codec: Codec | None = None,
) -> list[Rule]:
    """The rules of preset ``name`` (see :data:`PRESETS` and the module docstring's table).

    ``actzip.cache(name, **options)`` builds them for its context; call this for a rule list of your own.

    Args:
      min_bytes: tensors smaller than this are kept (``small``).
      min_zero_fraction: a relu output (or, for ``lossless``, any tensor) goes to the sparse codec from this
        fraction of zeros on.
      recheck_every: steps a save site's mostly-zero decision is reused before it is sampled again.
      group_size: elements per quantization group.
      seed: seed of the quant codecs' stochastic rounding (``None`` means 0).
      treatments: ``{role: treatment}`` replacing the preset's for those roles (see the module docstring).
      offload: ``True`` (or an :class:`~actzip.memory.cache.offload.Offloader` to share) moves everything the rules
        store to pinned CPU memory.
      codec: the ``lossless`` preset's codec for mostly-zero tensors (default: the sparse codec).

    Unknown names, roles and treatments raise :class:`~actzip.errors.ConfigError` listing what exists.
    """
    preset = _get(name)
    if offload is not False and not isinstance(offload, (bool, Offloader)):
        raise ConfigError(f"offload must be True, False or an Offloader, got {offload!r}")
    shared: list[Offloader] = [offload] if isinstance(offload, Offloader) else []

    def offloader() -> Offloader:
        if not shared:
            shared.append(Offloader())
        return shared[0]

    table = dict(preset.treatments)
    for role, how in (treatments or {}).items():
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r} in treatments; roles: {', '.join(ROLES)}")
        if not table:  # lossless, as rules by role: every role lossless sparse (when sparse enough)
            table = {r: "sparse" for r in ROLES}
        table[role] = how
    if offload is not False:
        table = {role: how if not isinstance(how, str) or how.endswith(OFFLOAD) else how + OFFLOAD
                 for role, how in table.items()}  # fmt: skip
    if not table:
        codec = codec if codec is not None else registry.get("sparse")
        rules = mostly_zero_rules(codec, min_bytes=min_bytes, min_zero_fraction=min_zero_fraction,
                                  recheck_every=recheck_every)
        if offload is not False:  # what the default rules store: sparse payloads and dense tensors
            rules = [_with_offload(r, offloader()) if r.name in (codec.name, "dense") else r for r in rules]
        return rules
    probe = registry.get("quant")  # float dtypes, strided, dense: what every lossy rule needs

    def nbytes(t: torch.Tensor) -> int:
        return t.numel() * t.element_size()

    rules = [
        Rule("leaf", is_leaf_storage, static=True),
        Rule("unsupported", lambda t: probe.supports(t) is not None, static=True),
        Rule("small", lambda t: nbytes(t) < min_bytes, static=True),
    ]
    mostly_zero = lambda: MostlyZero(min_zero_fraction, recheck_every)  # noqa: E731
    rules += [_role_rule(role, how, mostly_zero, group_size, seed, offloader, preset.min_nonlinear_bits)
              for role, how in table.items()]
    # A relu output that is not sparse enough (or a role not in the table) is kept under an honest name.
    tail = [Rule(f"{RELU_OUTPUT}:{KEPT}", lambda t: current_role(t) == RELU_OUTPUT, needs_role=True, static=True),
            Rule(KEPT, lambda t: True, static=True)]
    return rules + [_with_offload(r, offloader()) if offload is not False else r for r in tail]


def _offloader_of(offload: bool | OffloadConfig) -> bool | Offloader:
    return Offloader(offload) if isinstance(offload, OffloadConfig) else offload


def _builder(name: str):
    """How ``CacheConfig(preset=name)`` builds its rules."""

    def build(config: CacheConfig) -> list[Rule]:
        return preset_rules(
            name, min_bytes=config.min_bytes, min_zero_fraction=config.min_zero_fraction,
            recheck_every=config.recheck_every, group_size=config.group_size, seed=config.seed,
            treatments=config.treatments, offload=_offloader_of(config.offload), codec=config.build_codec(),
        )

    return build


for _name in PRESETS:
    register_preset(_name, _builder(_name))


def compressed(preset: str = "balanced", *, min_bytes: int = DEFAULT_MIN_BYTES, dedup: bool = True,
               **options) -> CacheContext:
    """A cache context of preset ``preset`` that always tracks roles (``options`` go to :func:`preset_rules`)."""
    rules = preset_rules(preset, min_bytes=min_bytes, **options)
    return CacheContext(CacheConfig(min_bytes=min_bytes, dedup=dedup, track_roles=True), rules=rules)


compressed = compat.deprecated(compressed, "actzip.memory.compressed", "actzip.cache(preset, **options)")
