"""The one verb for module transforms: ``compress_(model, config, *, filter_fn=None)`` and ``restore_(model)``.

torchao's ``quantize_`` pattern. Each capability defines a :class:`Config` dataclass (commented fields,
validated at construction, ``to_dict`` / ``from_dict``) and registers a handler for it with
:func:`register_handler`; ``compress_`` dispatches on the config's type. Every handler finds its targets with
:func:`walk` and swaps them with :func:`replace_module`, which remembers each original so that
:func:`restore_` can put it back. ``filter_fn(module, fqn)`` has the same argument order everywhere.

This module imports nothing from the capabilities: they import it to register themselves.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import torch
from torch import nn

from actzip.errors import ConfigError, NothingToCompressError, NothingToRestoreError, UnknownConfigError

__all__ = [
    "Config",
    "CompressReport",
    "FilterFn",
    "add_undo",
    "compress_",
    "config_from_dict",
    "register_handler",
    "replace_module",
    "restore_",
    "walk",
]

FilterFn = Callable[[nn.Module, str], bool]
Handler = Callable[[nn.Module, Any, "FilterFn | None", "CompressReport"], None]

_HANDLERS: dict[type, Handler] = {}
_CONFIG_TYPES: dict[str, type] = {}
APPLIED_ATTR = "actzip_applied"  # where a model keeps what compress_ changed, newest last


class Config:
    """Base of every ``compress_`` config. Subclasses are ``@dataclass``es; ``validate`` checks their fields.

    ``to_dict()`` gives plain Python values (dtypes as their names, nested configs as dicts) with the type
    name and ``VERSION``; :func:`config_from_dict` (or ``cls.from_dict``) builds the config again.
    """

    VERSION: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _CONFIG_TYPES[cls.__name__] = cls

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~actzip.errors.ConfigError` naming the field and the reason when a field is unusable."""

    def to_dict(self) -> dict:
        if not dataclasses.is_dataclass(self):
            raise ConfigError(f"{type(self).__name__} must be a dataclass to be serialized")
        out = {"type": type(self).__name__, "version": self.VERSION}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Config":
        built = config_from_dict(data)
        if not isinstance(built, cls):
            raise ConfigError(f"{cls.__name__}.from_dict: the dict holds a {type(built).__name__}")
        return built


def _plain(value):
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ConfigError(f"config value {value!r} of type {type(value).__name__} cannot be serialized")


def _rebuild(value, annotation: str):
    if isinstance(value, dict) and set(value) == {"dtype"}:
        dtype = getattr(torch, value["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ConfigError(f"config dict: {value['dtype']!r} is not a torch dtype")
        return dtype
    if isinstance(value, dict) and "type" in value and "version" in value:
        return config_from_dict(value)
    if isinstance(value, list) and "tuple" in annotation.lower():
        return tuple(value)
    return value


def config_from_dict(data: dict) -> Config:
    """The config that ``Config.to_dict`` described."""
    if not isinstance(data, dict) or "type" not in data:
        raise ConfigError(f"config dict needs a 'type' key naming the config class, got {data!r}")
    cls = _CONFIG_TYPES.get(data["type"])
    if cls is None:
        raise UnknownConfigError(f"config type {data['type']!r} is unknown; known: {', '.join(sorted(_CONFIG_TYPES))}")
    version = data.get("version", cls.VERSION)
    if version != cls.VERSION:
        raise ConfigError(f"{cls.__name__} dict has version {version}, this actzip reads version {cls.VERSION}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields) - {"type", "version"})
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {', '.join(unknown)}; its fields: {', '.join(fields)}")
    kwargs = {k: _rebuild(v, str(fields[k].type)) for k, v in data.items() if k in fields}
    return cls(**kwargs)


@dataclass
class CompressReport:
    """What one ``compress_`` call changed, and the candidates it left alone with the reason.

    ``str(report)`` is a table, one line per module.
    """

    config: str = ""  # the config's class name
    swapped: list[tuple[str, str]] = field(default_factory=list)  # (module fqn, what it became)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (module fqn, why it was left)
    notes: list[str] = field(default_factory=list)  # model-wide remarks (a fallback taken, a default chosen)

    def __len__(self) -> int:
        return len(self.swapped)

    def __str__(self) -> str:
        lines = [f"compress_({self.config}): {len(self.swapped)} changed, {len(self.skipped)} left as they were"]
        width = max((len(n or "<root>") for n, _ in self.swapped + self.skipped), default=0)
        lines += [f"  changed  {(n or '<root>'):<{width}}  -> {what}" for n, what in self.swapped]
        lines += [f"  left     {(n or '<root>'):<{width}}  ({why})" for n, why in self.skipped]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


@dataclass
class _Applied:
    """One compress_ call on a model: the originals it replaced, and what undoes anything else it did."""

    config: str
    originals: list[tuple[str, nn.Module]] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)


def register_handler(config_type: type) -> Callable[[Handler], Handler]:
    """Decorator: ``fn(model, config, filter_fn, report)`` applies configs of ``config_type``.

    The handler finds its targets with :func:`walk`, swaps them with :func:`replace_module` and fills
    ``report``; it changes nothing and raises :class:`~actzip.errors.ConfigError` when a field cannot work.
    """
    if not isinstance(config_type, type):
        raise ConfigError(f"register_handler takes a config class, got {config_type!r}")

    def deco(fn: Handler) -> Handler:
        if config_type in _HANDLERS and _HANDLERS[config_type] is not fn:
            raise ConfigError(f"a compress_ handler for {config_type.__name__} is already registered")
        _HANDLERS[config_type] = fn
        return fn

    return deco


def walk(
    model: nn.Module,
    candidate: Callable[[nn.Module, str], str | bool | None],
    filter_fn: FilterFn | None,
    report: CompressReport,
) -> Iterator[tuple[str, nn.Module]]:
    """The modules of ``model`` a handler may change, outermost first, as ``(fqn, module)``.

    ``candidate(module, fqn)`` says whether a module is one the handler can take: ``True``, or a false value
    to pass it by, or a string saying why this module looks like a target but cannot be taken (recorded in
    ``report.skipped``). Modules ``filter_fn(module, fqn)`` refuses are recorded as skipped too. The list is
    made before anything is swapped, so a handler may replace modules while iterating. The children of a
    module that is yielded are not visited.
    """
    found: list[tuple[str, nn.Module]] = []
    taken: list[str] = []
    for fqn, module in model.named_modules(remove_duplicate=True):
        if any(fqn.startswith(t + ".") for t in taken):
            continue
        verdict = candidate(module, fqn)
        if isinstance(verdict, str):
            report.skipped.append((fqn, verdict))
            continue
        if not verdict:
            continue
        if filter_fn is not None and not filter_fn(module, fqn):
            report.skipped.append((fqn, "excluded by filter_fn"))
            continue
        found.append((fqn, module))
        if fqn:
            taken.append(fqn)
    return iter(found)


def replace_module(model: nn.Module, fqn: str, new: nn.Module, report: CompressReport, what: str | None = None) -> None:
    """Put ``new`` at ``fqn`` in ``model``, keeping the original for :func:`restore_`, and record it."""
    if not fqn:
        raise ConfigError(
            f"compress_({report.config}): the model itself ({type(model).__name__}) is the target; wrap it in a "
            "parent module to swap it"
        )
    parent_name, _, child = fqn.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    original = getattr(parent, child)
    new.train(original.training)
    setattr(parent, child, new)
    _current(model).originals.append((fqn, original))
    report.swapped.append((fqn, what or type(new).__name__))


def add_undo(model: nn.Module, fn: Callable[[], None]) -> None:
    """Have :func:`restore_` call ``fn`` (newest first) for a change that is not a module swap."""
    _current(model).undo.append(fn)


_PENDING: dict[int, _Applied] = {}  # the record of the compress_ call in progress, by model id


def _current(model: nn.Module) -> _Applied:
    try:
        return _PENDING[id(model)]
    except KeyError:
        raise ConfigError("replace_module / add_undo are for compress_ handlers, called inside compress_") from None


def compress_(model: nn.Module, config: Config, *, filter_fn: FilterFn | None = None) -> CompressReport:
    """Apply ``config`` to ``model`` in place and return what changed.

    ``filter_fn(module, fqn)`` limits which modules change. An unknown config type raises
    :class:`~actzip.errors.UnknownConfigError`; a model in which nothing can change (nothing matches, or the
    filter refuses every candidate) raises :class:`~actzip.errors.NothingToCompressError` listing why each
    candidate was left, and changes nothing.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"compress_: model must be an nn.Module, got {type(model).__name__}")
    # A subclass of a config (an old name kept as an alias) is applied by its base's handler.
    handler = next((_HANDLERS[t] for t in type(config).__mro__ if t in _HANDLERS), None)
    if handler is None:
        known = ", ".join(sorted(t.__name__ for t in _HANDLERS)) or "(none registered)"
        raise UnknownConfigError(f"compress_: no handler for config type {type(config).__name__}; known: {known}")
    if filter_fn is not None and not callable(filter_fn):
        raise ConfigError(f"compress_: filter_fn must be callable as filter_fn(module, fqn), got {filter_fn!r}")
    name = type(config).__name__
    report = CompressReport(config=name)
    record = _Applied(config=name)
    if id(model) in _PENDING:
        raise ConfigError(f"compress_({name}) called on a model that a compress_ handler is still changing")
    _PENDING[id(model)] = record
    try:
        handler(model, config, filter_fn, report)
    except BaseException:
        _undo(model, record)
        raise
    finally:
        del _PENDING[id(model)]
    if not report.swapped:
        why = "; ".join(f"{n or '<root>'}: {r}" for n, r in report.skipped) or "no module of a kind it takes"
        if filter_fn is not None and report.skipped and all(r == "excluded by filter_fn" for _, r in report.skipped):
            why = f"filter_fn excluded every candidate ({why})"
        raise NothingToCompressError(f"compress_({name}): nothing to change in {type(model).__name__}: {why}")
    applied = model.__dict__.setdefault(APPLIED_ATTR, [])
    applied.append(record)
    return report


def _undo(model: nn.Module, record: _Applied) -> int:
    for fn in reversed(record.undo):
        fn()
    for fqn, original in reversed(record.originals):
        parent_name, _, child = fqn.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, original)
    return len(record.originals) + len(record.undo)


def restore_(model: nn.Module) -> list[str]:
    """Undo every ``compress_`` on ``model``, newest first; returns the config names undone.

    The original modules come back (their parameters were shared with the compressed ones, so training in
    between is kept). A model ``compress_`` never changed raises :class:`~actzip.errors.NothingToRestoreError`.
    """
    applied = model.__dict__.get(APPLIED_ATTR) if isinstance(model, nn.Module) else None
    if not applied:
        raise NothingToRestoreError(
            f"restore_: {type(model).__name__} has nothing to restore (compress_ has not changed it)"
        )
    undone = []
    while applied:
        record = applied.pop()
        _undo(model, record)
        undone.append(record.config)
    del model.__dict__[APPLIED_ATTR]
    return undone
