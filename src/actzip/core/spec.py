"""The one spec grammar for codecs: ``"name"`` or ``"name:option=value,option=value"``.

``actzip.codecs.get("quant:bits=4,group_size=128")`` is ``actzip.codecs.get("quant", bits=4, group_size=128)``,
and the wire's per-direction codecs take the same strings (chained with ``+`` there). Values are parsed as
int, float, ``true``/``false``, ``none``, else kept as text; :func:`format_spec` writes them back so that
``parse_spec(format_spec(name, options))`` gives the same name and options.
"""

from __future__ import annotations

from actzip.errors import ConfigError

__all__ = ["format_spec", "parse_spec", "parse_value"]


def parse_value(text: str):
    """An option value from its text: bool, None, int, float, else the text itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_spec(text: str) -> tuple[str, dict]:
    """``(name, options)`` from ``"name[:option=value,...]"``; the name is lower-cased, options kept in order."""
    if not isinstance(text, str):
        raise ConfigError(f"codec spec must be a string like 'quant:bits=4', got {type(text).__name__}")
    name, _, opts = text.strip().partition(":")
    name = name.strip().lower()
    if not name:
        raise ConfigError(f"codec spec {text!r} has no codec name before ':'")
    options: dict = {}
    for part in filter(None, (p.strip() for p in opts.split(","))):
        key, eq, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or not key:
            raise ConfigError(f"codec spec {text!r}: option {part!r} must look like name=value")
        if not val:
            raise ConfigError(f"codec spec {text!r}: option {key!r} has no value after '='")
        if key in options:
            raise ConfigError(f"codec spec {text!r}: option {key!r} is given twice")
        options[key] = parse_value(val)
    return name, options


_SEPARATORS = (":", ",", "=")


def _format_value(name: str, key: str, value) -> str:
    text = "none" if value is None else str(value)
    back = parse_value(text)
    # A value must read back as itself: the text "4" would come back as the int 4, "true" as True, and a
    # separator or outer blanks would change how the spec splits.
    same = type(back) is type(value) and (back == value or back != back)  # noqa: PLR0124 (NaN reads back as NaN)
    if not same or any(c in text for c in _SEPARATORS) or text != text.strip() or not text:
        raise ConfigError(f"codec spec of {name!r}: option {key}={value!r} cannot be written in a spec "
                          f"(it would read back as {back!r})")
    return text


def format_spec(name: str, options: dict | None = None) -> str:
    """The spec string of ``name`` with ``options`` (sorted), the inverse of :func:`parse_spec`.

    Raises :class:`ConfigError` for a name or value that would not read back the same (a string that looks
    like a number or a bool, or one holding ``:``, ``,`` or ``=``)."""
    if not isinstance(name, str) or not name.strip() or any(c in name for c in _SEPARATORS):
        raise ConfigError(f"codec spec: {name!r} is not a codec name (a non-empty string without : , =)")
    for key in options or {}:
        if not isinstance(key, str) or not key.strip() or any(c in key for c in _SEPARATORS):
            raise ConfigError(f"codec spec of {name!r}: {key!r} is not an option name")
    opts = ",".join(f"{k}={_format_value(name, k, v)}" for k, v in sorted((options or {}).items()))
    return f"{name}:{opts}" if opts else name
