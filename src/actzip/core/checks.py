"""Option checks shared by codecs and the modules built on them: each raises a :class:`ConfigError` that names
the owner, the option and the reason."""

from __future__ import annotations

from actzip.errors import ConfigError

__all__ = ["check_choice", "check_group_size", "check_seed"]


def check_choice(owner: str, option: str, value, valid) -> None:
    """Raise unless ``value`` is one of ``valid`` and of the same type as its entries."""
    # Type first: 4.0 == 4 and True == 1 would pass a bare membership test.
    if type(value) is not type(valid[0]) or value not in valid:
        raise ConfigError(f"{owner}: option {option} must be one of {', '.join(map(repr, valid))}, got {value!r}")


def check_group_size(owner: str, group_size) -> None:
    """Raise unless ``group_size`` is a positive multiple of 8 (whole bytes of codes for any bit width)."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0 or group_size % 8:
        raise ConfigError(f"{owner}: option group_size must be a positive multiple of 8, got {group_size!r}")


def check_seed(owner: str, seed) -> None:
    """Raise unless ``seed`` is ``None`` or a non-negative int."""
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ConfigError(f"{owner}: option seed must be None or a non-negative int, got {seed!r}")
