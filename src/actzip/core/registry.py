"""Codec registry: codecs register under a name; users get them by name with options."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Callable, TypeVar

from actzip.core.spec import parse_spec
from actzip.errors import ConfigError, UnknownCodecError

if TYPE_CHECKING:
    from actzip.codecs.base import Codec

C = TypeVar("C", bound=type)
_CODECS: dict[str, type] = {}


def register_codec(name: str) -> Callable[[C], C]:
    """Class decorator: make a codec class available as ``actzip.codecs.get(name)``."""

    def deco(cls: C) -> C:
        if name in _CODECS and _CODECS[name] is not cls:
            raise ConfigError(f"codec name {name!r} is already registered by {_CODECS[name].__qualname__}")
        cls.name = name
        _CODECS[name] = cls
        return cls

    return deco


def available() -> list[str]:
    """Names of the registered codecs, sorted."""
    return sorted(_CODECS)


def codec_class(name: str) -> type:
    try:
        return _CODECS[name]
    except KeyError:
        raise UnknownCodecError(f"unknown codec {name!r}; available: {', '.join(available())}") from None


def get(spec: str, **options) -> "Codec":
    """A codec instance by registry name or spec string, built with ``options``.

    ``get("quant:bits=4,group_size=128")`` is ``get("quant", bits=4, group_size=128)``; an option given both in
    the spec and as a keyword is an error. An unknown name or option raises :class:`~actzip.errors.ConfigError`
    listing what would fit.
    """
    name, spec_options = parse_spec(spec)
    both = sorted(set(spec_options) & set(options))
    if both:
        raise ConfigError(f"codec spec {spec!r}: option(s) {', '.join(both)} given both in the spec and as keywords")
    options = {**spec_options, **options}
    cls = codec_class(name)
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self" and params[p].kind is inspect.Parameter.KEYWORD_ONLY]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"codec {name!r} has no option(s) {', '.join(unknown)}; its options: {', '.join(accepted) or '(none)'}"
        )
    missing = [p for p in accepted if params[p].default is inspect.Parameter.empty and p not in options]
    if missing:
        raise ConfigError(f"codec {name!r} needs option(s) {', '.join(missing)}, e.g. {name}:{missing[0]}=...")
    return cls(**options)
