"""The cache context: compress what autograd saves for backward inside a ``with`` block.

``actzip.cache(preset_or_config)`` builds a :class:`CacheContext`, a context manager over
:func:`torch.autograd.graph.saved_tensors_hooks`. Every tensor autograd saves inside the block goes through the
rules (:mod:`actzip.memory.cache.rules`, built from a preset of :mod:`actzip.memory.cache.presets`); the first rule
that accepts it picks a codec, and autograd keeps the payload instead of the tensor. In backward the payload is
decoded when autograd asks for the tensor. A tensor saved twice (the same storage, view and version, like a
ReLU output that both ReLU and the next op save) is encoded and counted once, unless the first save was
stored lossily: then each save goes through the rules on its own. When the rules ask for the role of a saved
tensor (every preset but ``lossless``) the block also runs under a
:class:`~actzip.memory.cache.roles.RoleTracker`.

With a lossless codec (the default) backward sees bit-identical tensors, so gradients are bit-identical.

Composition:
- ``torch.utils.checkpoint`` (non-reentrant): checkpointed regions install their own hooks, which take
  precedence inside them; the cache compresses the tensors saved outside those regions.
- ``torch.compile`` (inductor, aot_eager; ``fullgraph`` or with graph breaks): the cache's hooks are graph
  modules, which PyTorch inlines into the compiled graphs (:mod:`actzip.memory.cache.graph_hooks`). Each tensor a
  graph saves is decided once, when the graph is compiled: its role is read from the backward graph, the rules
  pick the codec, and the graph runs the codec as a custom op (:mod:`actzip.memory.cache.compiled_ops`) and
  keeps the payload. The account reports those saves as eager ones (and counts them, ``compiled_saves``).
  Codecs whose payload size depends on the values (the lossless sparse codec) and offloading cannot run in a
  graph: announced once, kept. Code between graph breaks goes through the hooks as eager code does. Where
  hooks cannot be inlined, a compiled graph's saves are kept and counted apart
  (:mod:`actzip.memory.cache.compiled`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from typing import Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from actzip import compat
from actzip.codecs.base import Codec
from actzip.codecs.step_noise import StepNoise
from actzip.core.payload import Payload
from actzip.errors import ConfigError
from actzip.memory.cache.account import StepAccount
from actzip.memory.cache.active import close_cache, current_cache, open_cache, record_external
from actzip.memory.cache.compiled import compiled_graph_inputs, made_by_graph, warn_uncompressed
from actzip.memory.cache.compiled_placement import install as install_placement
from actzip.memory.cache.config import CacheConfig
from actzip.memory.cache.graph_hooks import announce, hook_pair, not_traced
from actzip.memory.cache.role_plan import UNPLANNED, RolePlan
from actzip.memory.cache.roles import RoleTracker, assumed_role, current_role, role_query, settle_role
from actzip.memory.cache.rules import Rule, count_only_rules, is_leaf_storage, same_treatment
from actzip.memory.cache.stored import StoredActivation

__all__ = ["ActivationCache", "CacheContext", "CachedActivation", "cache"]

# Options that still mean something when the rules are given: the rest only shape a preset's rules.
_UNDECIDED = object()  # not yet in a cache's decisions
_OPTIONS_WITH_RULES = ("dedup", "track_roles", "fuse_compiled", "replay", "recheck_every", "graph_safe")


class CachedActivation(StoredActivation):
    """What autograd holds in place of a saved tensor: a payload, or the tensor (detached: a node that saves its
    own output would otherwise hold itself through it, a cycle that keeps the whole graph alive)."""

    __slots__ = ("payload", "tensor", "codec", "__weakref__")

    def __init__(self, tensor: torch.Tensor | None, payload: Payload | None, codec) -> None:
        super().__init__()
        self.tensor = tensor
        self.payload = payload
        self.codec = codec

    def get(self) -> torch.Tensor:
        if self.payload is None:
            return self.tensor
        return self.hand_out(lambda: self.codec.decode(self.payload))


class _Name:
    """A saved tensor's name in a codec's error message, formatted only when one is raised (a save's host time
    is the step time of a small model)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = t.shape, t.dtype

    def __str__(self) -> str:
        return f"saved tensor {tuple(self.shape)} {self.dtype}"


class CacheContext:
    """Compress the tensors autograd saves inside a ``with`` block (build it with ``actzip.cache``).

    >>> cache = actzip.cache()            # lossless: the sparse codec for mostly-zero tensors
    >>> with cache:
    ...     loss = model(x).sum()
    >>> loss.backward()
    >>> print(cache.last)                 # bytes before and after, by rule

    Args:
      config: the preset and its options (:class:`~actzip.memory.cache.config.CacheConfig`).
      rules: an explicit rule list instead of the preset's (see :mod:`actzip.memory.cache.rules`); then only
        ``config.dedup`` and ``config.track_roles`` apply.

    Build it once and enter it every step: each ``with`` block is one step of accounting, ``cache.last`` is the
    latest :class:`~actzip.memory.cache.account.StepAccount`, ``cache.history`` keeps them all (call
    ``cache.history.clear()`` to drop them), and stochastic rounding draws new noise each step.
    """

    def __init__(self, config: CacheConfig | None = None, *, rules: Sequence[Rule] | None = None) -> None:
        if config is not None and not isinstance(config, CacheConfig):
            raise ConfigError(f"cache: config must be a CacheConfig, got {type(config).__name__}")
        self.config = config or CacheConfig()
        self.rules: list[Rule] = list(rules) if rules is not None else self.config.build_rules()
        bad = [r for r in self.rules if not isinstance(r, Rule)]
        if bad:
            raise ConfigError(f"cache: rules must be actzip.memory.cache.rules.Rule objects, got {bad[0]!r}")
        track = self.config.track_roles
        # whether the block runs under a RoleTracker: when a rule asks for roles, unless the config says
        self.track_roles: bool = any(r.needs_role for r in self.rules) if track is None else track
        # the roles of a tracked step, replayed by position in the next steps (no tracker over every torch call)
        self.role_plan = RolePlan(self.config.recheck_every if self.config.replay else 0)
        self.idle_steps = 0  # blocks that saved activations and compressed none (announced once)
        self._compressed = False
        # a rule set without a codec (count_only) compresses nothing by design: no announcement
        self.rules_compress_nothing = all(r.codec is None for r in self.rules)
        self.history: list[StepAccount] = []
        self._hooks = None
        self._tracker: RoleTracker | None = None
        self._account: StepAccount | None = None
        self._seen: dict[tuple, tuple[StorageWeakRef, weakref.ref]] = {}
        self._rule_of: dict[int, Rule | None] = {}  # id of a live lossy save -> the rule that made it
        # (role, dtype, layout, nested, bytes, leaf) -> the rule that decides: when every rule is static
        self._decisions: dict[tuple, Rule | None] | None = {} if all(r.static for r in self.rules) else None
        self._rules_read_roles = any(r.needs_role for r in self.rules)
        # saves stored so far in the open `with` block, minus one: names a save site (None while rules are only
        # asked about a tensor, not storing it)
        self.save_index: int | None = -1
        # what a compiled graph's decisions depend on: caches that agree here share hooks, and so graphs
        self.decisions: str = repr(self.config) if rules is None else f"rules at {id(self.rules):#x}"
        # graph_safe: the offset each block moves, so a captured graph's replays draw new rounding noise
        self.step_noise: StepNoise | None = None
        if self.config.graph_safe:
            self._check_graph_safe()
            self.step_noise = StepNoise()

    def _check_graph_safe(self) -> None:
        """Refuse rules a captured CUDA graph cannot replay as they ran: a payload whose size depends on the
        values (it synchronizes), an offload, a stochastic codec whose noise the step offset does not move."""
        for r in self.rules:
            codec = r.codec
            why = None
            if r.offload is not None:
                why = "it offloads to CPU memory"
            elif codec is not None and not codec.fixed_size:
                why = f"codec {codec.name!r} makes payloads whose size depends on the values (a synchronization)"
            elif codec is not None and getattr(codec, "rounding", None) == "stochastic" \
                    and not codec.follows_step_noise:
                why = f"codec {codec.name!r} rounds stochastically with keys a graph would replay unchanged"
            if why:
                raise ConfigError(f"cache: graph_safe=True, but rule {r.name!r} cannot be replayed as a CUDA "
                                  f"graph: {why}")

    def _capturing(self) -> bool:
        """Whether this block is being captured into a CUDA graph (asked of graph-safe caches only)."""
        return self.step_noise is not None and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()

    @classmethod
    def count_only(cls) -> "CacheContext":
        """A cache that stores everything as it is and only counts it (same dedup, same accounting)."""
        return cls(rules=count_only_rules())

    def __repr__(self) -> str:
        rules = ", ".join(r.name for r in self.rules)
        return f"CacheContext(preset={self.config.preset!r}, track_roles={self.track_roles}, rules=[{rules}])"

    @property
    def last(self) -> StepAccount:
        """The account of the latest ``with`` block (``print(cache.last)`` shows it as a table)."""
        if not self.history:
            raise RuntimeError("the cache has no account yet: use it in a `with` block first")
        return self.history[-1]

    def __enter__(self) -> "CacheContext":
        if self._hooks is not None:
            raise RuntimeError("the cache is already active; it cannot be entered twice at once")
        self._account = StepAccount()
        self._compressed = False  # whether any save of the block was stored in less than its size
        self.save_index = -1
        self._seen.clear()
        self._rule_of.clear()
        # a fresh tracker each tracked block (modes are entered once each); none where the plan gives the roles.
        # A block being captured into a CUDA graph is tracked: its host work is paid once, and a model may take
        # another path under capture than in the eager steps the plan was recorded from
        replayed = not self._capturing() and self.role_plan.lifetime and self.role_plan.start()
        if self.track_roles and not replayed:
            self._tracker = RoleTracker()
            self._tracker.__enter__()
        if self.step_noise is not None:  # a device op: a captured step replays it, and so draws new noise
            self.step_noise.advance()
            self.step_noise.__enter__()
        install_placement()  # compiled graphs encode and decode next to the uses (once per process)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(*hook_pair(self.decisions))
        self._hooks.__enter__()
        open_cache(self)
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None
        if self.step_noise is not None:
            self.step_noise.__exit__(*exc)
        close_cache(self)
        if self._tracker is not None:
            self._tracker.__exit__(*exc)
            self._tracker = None
        if self.track_roles and self.role_plan.lifetime:
            self.role_plan.finish(completed=exc[0] is None)
        self._check_compressed(self._account)
        self.history.append(self._account)
        self._account = None
        self._seen.clear()
        self._rule_of.clear()

    def record(self, rule: str, dense_bytes: int, stored_bytes, *, compiled: bool = False) -> None:
        """Account one tensor kept outside the hooks in the open block's step (see
        :func:`~actzip.memory.cache.active.record_external`)."""
        if self._account is not None:
            self._compressed = True  # a module's own payload (a fused MLP's, say)
            self._account.add(rule, dense_bytes, stored_bytes)
            if compiled:
                self._account.compiled_saves += 1

    def _check_compressed(self, account: StepAccount) -> None:
        """Announce (once per cache, counted in ``idle_steps``) a block that saved activations and compressed
        none of them: a cache that does nothing must not look like one that works."""
        leaves = account.by_rule.get("leaf")
        saves = self.save_index + 1 - (leaves.tensors if leaves is not None else 0)
        if saves <= 0 or self._compressed or account.compiled_saves or self.rules_compress_nothing:
            return
        self.idle_steps += 1
        if self.idle_steps == 1:
            kept = ", ".join(f"{name} {s.tensors}" for name, s in account.by_rule.items() if name != "leaf")
            small = (f"; tensors under min_bytes={self.config.min_bytes} are kept, lower it for a small model"
                     if "small" in account.by_rule else "")
            warnings.warn(f"actzip.cache: a `with` block saved {saves} activation tensors and compressed none "
                          f"(by rule: {kept}){small} (warned once per cache; cache.idle_steps counts such blocks)",
                          RuntimeWarning, stacklevel=3)

    # -- hooks -------------------------------------------------------------------------------------------

    def _key(self, t: torch.Tensor):
        if t.layout != torch.strided or t.is_nested:
            return None
        return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t._version)

    def _pack(self, t: torch.Tensor) -> CachedActivation:
        with role_query():  # the rules ask for t's role, each of them: work it out once
            if self.track_roles and self.role_plan.lifetime:
                role = self.role_plan.role(t)  # the tracker's (and recorded), or the plan's
                if role is None:  # a replayed step that left its plan: kept, no role guessed
                    self.save_index += 1
                    self._account.add(UNPLANNED, t.numel() * t.element_size(), t.numel() * t.element_size())
                    return CachedActivation(t.detach(), None, None)
                settle_role(t, role)
            return self._pack_in_query(t)

    def _pack_in_query(self, t: torch.Tensor) -> CachedActivation:
        key = self._key(t) if self.config.dedup else None
        if key is not None:
            hit = self._seen.get(key)
            if hit is not None:
                storage_ref, saved_ref = hit
                saved = saved_ref()
                # The storage is still alive, so the same address means the same data (no reuse). A lossy copy
                # is shared only with a save the rules treat the same way (same role, same codec): another
                # save may need more precision than the first got.
                shareable = saved is not None and (
                    saved.codec is None or saved.codec.lossless
                    or same_treatment(self._rule_for(t), self._rule_of.get(id(saved)))
                )
                if shareable and not storage_ref.expired():
                    saved.shares += 1  # rebuilt once for all of them (actzip.memory.cache.stored)
                    self._account.duplicates += 1
                    self._account.duplicate_bytes += t.numel() * t.element_size()
                    return saved
        saved, rule = self._store(t)
        if key is not None:
            self._seen[key] = (StorageWeakRef(t.untyped_storage()), weakref.ref(saved))
            if saved.codec is not None and not saved.codec.lossless:
                self._rule_of[id(saved)] = rule  # read only while `saved` is alive (checked above)
        return saved

    def _rule_for(self, t: torch.Tensor) -> Rule | None:
        index, self.save_index = self.save_index, None  # a question about t, not a save: no save site
        try:
            return self._decide(t)
        finally:
            self.save_index = index

    def _decide(self, t: torch.Tensor) -> Rule | None:
        """The first rule that matches ``t``; remembered by what static rules read (role, dtype, layout, size,
        leafness) when every rule is static."""
        memo = self._decisions
        if memo is None:
            return next((rule for rule in self.rules if rule.matches(t)), None)
        key = (current_role(t) if self._rules_read_roles else None, t.dtype, t.layout, t.is_nested,
               t.numel() * t.element_size(), is_leaf_storage(t))
        rule = memo.get(key, _UNDECIDED)
        if rule is _UNDECIDED:
            rule = memo[key] = next((rule for rule in self.rules if rule.matches(t)), None)
        return rule

    def _store(self, t: torch.Tensor) -> tuple[CachedActivation, Rule | None]:
        self.save_index += 1
        dense = t.numel() * t.element_size()
        if t.is_leaf and not t.requires_grad:  # how a compiled graph's intermediates look (inputs do too)
            inputs = compiled_graph_inputs()
            if inputs is not None and made_by_graph(t, inputs):
                self._account.add_compiled(dense)
                warn_uncompressed(t.shape, t.dtype)
                return CachedActivation(t.detach(), None, None), None
        rule = self._decide(t)
        if rule is None:
            self._account.add("unmatched", dense, dense)
            return CachedActivation(t.detach(), None, None), None
        name, saved, stored = rule.name, None, dense
        if rule.codec is not None:
            payload = rule.codec.encode(t, name=_Name(t))
            nbytes = payload.nbytes
            if nbytes >= dense:  # no gain: keep the tensor, drop the payload
                name = "incompressible"
            else:
                saved, stored = CachedActivation(None, payload, rule.codec), nbytes
        if saved is None:
            saved = CachedActivation(t.detach(), None, None)
        else:
            self._compressed = True
        if rule.offload is not None:  # to pinned CPU memory; `stored` becomes the device bytes kept
            saved, stored = rule.offload.stash(saved, stored)
            self._compressed = True
        self._account.add(name, dense, stored)
        return saved, rule

    def compiled_rule(self, t: torch.Tensor, role: str) -> tuple[str, Codec | None]:
        """How a compiled graph stores ``t`` (a fake tensor: the graph is being traced), a save of role ``role``:
        the account's rule name and the codec, or ``None`` to keep it. The rules decide as in eager code, with
        what a graph cannot do announced once and kept instead (see :mod:`actzip.memory.cache.graph_hooks`)."""
        probe = _stand_in(t)
        with assumed_role(role), _outside_tracing(probe is not t):
            for rule in self.rules:
                codec = rule.codec
                if codec is not None and not getattr(codec, "fixed_size", False):
                    # Its test is not even asked (it may read the values, e.g. the zero fraction): skipped.
                    announce(f"rule {rule.name!r} (codec {codec.name!r}) skipped", "the codec's payload size "
                             "depends on the tensor's values, which a compiled graph cannot allocate for; the next "
                             "rules decide")
                    continue
                try:
                    decided = rule.matches(probe)
                except Exception as e:  # a test that reads the values: the stand-in has none
                    announce(f"rule {rule.name!r} cannot decide", f"its test needs the tensor's values ({e})")
                    return f"{rule.name}:kept-compiled", None
                if not decided:
                    continue
                if rule.offload is not None:
                    announce(f"rule {rule.name!r} not offloaded", "moving to pinned CPU memory does not run "
                             "inside a compiled graph; what the rule stores stays on the device")
                return rule.name, codec
        return "unmatched", None

    # Hooks run from autograd's C++ code, also inside a compiled region's graph breaks: not for dynamo to trace.
    @not_traced
    def pack(self, t: torch.Tensor) -> CachedActivation:
        """Store ``t`` as the hooks would (for code that installs hooks of its own inside the block)."""
        return self._pack(t)

    def pack_eager(self, t: torch.Tensor) -> CachedActivation:
        """:meth:`pack`, for the cache's own hooks (which keep dynamo out themselves)."""
        return self._pack(t)

    @staticmethod
    @not_traced
    def unpack(saved: CachedActivation) -> torch.Tensor:
        """The tensor ``saved`` (from :meth:`pack`) stands for."""
        return saved.get()

    _unpack = unpack


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """What the rules see of ``t``, a fake tensor of a graph being traced: an empty meta tensor of its shape,
    strides and dtype, made and tested outside the tracing (a test that reads values then fails cleanly instead
    of breaking the graph), or ``t`` itself when its shape is symbolic."""
    if not all(isinstance(n, int) for n in (*t.shape, *t.stride())):
        return t
    with _outside_tracing(True):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


@contextlib.contextmanager
def _outside_tracing(on: bool):
    """Fake tensors and graph tracing switched off for plain tensors' work inside a trace (when ``on``)."""
    if not on:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        yield


def cache(preset_or_config: str | CacheConfig | None = None, *, rules: Sequence[Rule] | None = None,
          **options) -> CacheContext:
    """The activation cache: a context manager compressing what autograd saves inside its ``with`` block.

    >>> with actzip.cache("4bit", min_bytes=0) as c:
    ...     loss = model(x).sum()
    >>> loss.backward()
    >>> print(c.last)

    ``preset_or_config``: a preset name (``"lossless"``, the default, ``"conservative"``, ``"balanced"``,
    ``"aggressive"``, ``"4bit"``, ``"2bit"``: :mod:`actzip.memory.cache.presets`) or a
    :class:`~actzip.memory.cache.config.CacheConfig`; ``options`` are :class:`CacheConfig` fields (``min_bytes``,
    ``min_zero_fraction``, ``group_size``, ``seed``, ``treatments``, ``offload``, ``codec``, ``allow_lossy``,
    ``dedup``, ``track_roles``, ``graph_safe`` for steps captured as CUDA graphs, ...) set on top of it.
    ``rules=[...]``: your own rules instead of a preset's (only ``dedup``, ``track_roles``, ``replay``,
    ``recheck_every``, ``fuse_compiled`` and ``graph_safe`` apply then). Roles are tracked in the block when the
    rules ask for them. A bad preset, option or rule fails here, before any block is entered.
    """
    if isinstance(preset_or_config, CacheConfig):
        config = _with_options(preset_or_config, options)
    elif preset_or_config is None or isinstance(preset_or_config, str):
        if preset_or_config is not None:
            if "preset" in options:
                raise ConfigError(f"cache: preset given twice ({preset_or_config!r} and preset={options['preset']!r})")
            options = {"preset": preset_or_config, **options}
        config = _with_options(CacheConfig(), options) if options else CacheConfig()
    else:
        raise ConfigError(f"cache: expected a preset name or a CacheConfig, got {type(preset_or_config).__name__}")
    if rules is not None:
        shaping = sorted(set(options) - set(_OPTIONS_WITH_RULES))
        if isinstance(preset_or_config, CacheConfig) and config.preset != CacheConfig().preset:
            shaping = ["preset", *shaping]
        if shaping:
            raise ConfigError(f"cache: with rules=[...] the option(s) {', '.join(shaping)} would be ignored (they "
                              f"shape a preset's rules); only {', '.join(_OPTIONS_WITH_RULES)} apply")
        if isinstance(rules, Rule) or not isinstance(rules, (list, tuple)):
            raise ConfigError(f"cache: rules must be a list of Rule objects, got {type(rules).__name__}")
    return CacheContext(config, rules=rules)


def _with_options(config: CacheConfig, options: dict) -> CacheConfig:
    fields = [f.name for f in dataclasses.fields(CacheConfig)]
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"cache: unknown option(s) {', '.join(unknown)}; options: {', '.join(fields)}")
    return dataclasses.replace(config, **options) if options else config


ActivationCache = compat.deprecated(CacheContext, "actzip.memory.ActivationCache", "actzip.cache(...)")

_OLD_NAMES = {"current_cache": current_cache, "record_external": record_external}  # of actzip.memory.saved


def __getattr__(name: str):  # names the old module path (actzip.memory.saved) had, now in ...cache.active
    if name in _OLD_NAMES:
        compat.warn_once(f"actzip.memory.saved.{name}", f"actzip.memory.cache.active.{name}")
        return _OLD_NAMES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
