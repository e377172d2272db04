"""Old entry points kept for one release: each warns once (``FutureWarning``) and forwards to its new home.

:func:`deprecated` wraps a function or class under its old name; :data:`MOVED_MODULES` maps an old module path
to the new one, and :func:`install` makes ``import old.path`` load the new module under the old name (with
one warning per old path). Nothing here changes behaviour: the old name is the new object.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED_MODULES", "deprecated", "install", "warn_once", "warned"]

# old module path -> new module path
MOVED_MODULES: dict[str, str] = {}

warned: set[str] = set()  # the old names that have warned in this process


def warn_once(old: str, new: str) -> None:
    """Warn, once per process, that ``old`` is now ``new``."""
    if old in warned:
        return
    warned.add(old)
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}", FutureWarning,
                  stacklevel=3)


def deprecated(obj, old: str, new: str):
    """``obj`` under its old name ``old``: calling it (or instantiating it) warns once, naming ``new``."""
    if isinstance(obj, type):
        class Alias(obj):  # a subclass, so isinstance checks against the new class still hold
            def __init__(self, *args, **kwargs):
                warn_once(old, new)
                super().__init__(*args, **kwargs)

        Alias.__name__ = Alias.__qualname__ = old.rpartition(".")[2]
        Alias.__doc__ = f"Deprecated alias of {new}."
        return Alias

    @functools.wraps(obj)
    def alias(*args, **kwargs):
        warn_once(old, new)
        return obj(*args, **kwargs)

    alias.__doc__ = f"Deprecated alias of {new}."
    return alias


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path of :data:`MOVED_MODULES` and hands out the new module under it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        warn_once(spec.name, MOVED_MODULES[spec.name])
        module = importlib.import_module(MOVED_MODULES[spec.name])
        spec.loader_state = (module.__spec__, module.__loader__)  # the import system overwrites both
        return module

    def exec_module(self, module):  # the new module is already executed: only give it back its own spec
        module.__spec__, module.__loader__ = module.__spec__.loader_state


_FINDER = _MovedModuleFinder()


def install() -> None:
    """Put the moved-module finder on ``sys.meta_path`` (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
