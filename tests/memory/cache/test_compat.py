"""The cache's old names and module paths: each still works for one release and warns once."""

import importlib
import sys
import warnings

import pytest
import torch

import actzip
from actzip import compat
from actzip.memory.cache import CacheContext, RoleTracker, StepAccount
from actzip.memory.cache import context, presets, roles, stored


def fresh(name: str) -> None:
    """Forget that ``name`` warned (and, for a module path, that it was imported)."""
    compat.warned.discard(name)
    sys.modules.pop(name, None)


def warns_once(name: str, get):
    """``get()`` warns naming ``name``; a second ``get()`` does not warn again; returns the first result."""
    with pytest.warns(FutureWarning, match=name.replace(".", r"\.")):
        first = get()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get()
    return first


def test_activation_cache_is_a_cache_context():
    fresh("actzip.memory.ActivationCache")
    cache = warns_once("actzip.memory.ActivationCache", lambda: actzip.memory.ActivationCache())
    assert isinstance(cache, CacheContext) and cache.config.preset == "lossless"
    assert actzip.memory.ActivationCache.count_only().rules[-1].name == "kept"
    x = torch.randn(8, 8, requires_grad=True)
    with cache:
        (x * 2).relu().sum().backward()
    assert isinstance(cache.last, StepAccount)


def test_role_tracker_of_actzip_memory():
    fresh("actzip.memory.RoleTracker")
    tracker = warns_once("actzip.memory.RoleTracker", lambda: actzip.memory.RoleTracker())
    assert isinstance(tracker, RoleTracker)
    with tracker:
        assert roles.tracking()


@pytest.mark.parametrize("get", [lambda: actzip.memory.compressed, lambda: presets.compressed])
def test_compressed_is_a_tracking_cache_of_the_preset(get):
    fresh("actzip.memory.compressed")
    cache = warns_once("actzip.memory.compressed", lambda: get()("balanced", min_bytes=0))
    assert isinstance(cache, CacheContext) and cache.track_roles
    assert "linear_input:quant4" in [r.name for r in cache.rules]
    assert "linear_input:quant4" in [r.name for r in get()(min_bytes=0).rules]  # the default preset: balanced
    x = torch.randn(256, 64, requires_grad=True)
    lin = torch.nn.Linear(64, 64)
    with cache:
        lin(x * 2.0).sum().backward()
    assert cache.last.by_rule["linear_input:quant4"].tensors == 1


OLD_MODULES = {
    "actzip.memory.saved": context,
    "actzip.memory.rules": "actzip.memory.cache.rules",
    "actzip.memory.roles": roles,
    "actzip.memory.presets": presets,
    "actzip.memory.account": "actzip.memory.cache.account",
    "actzip.memory.offload": "actzip.memory.cache.offload",
    "actzip.memory.rebuild": "actzip.memory.cache.rebuild",
    "actzip.memory.handout": stored,
}


@pytest.mark.parametrize("old", list(OLD_MODULES))
def test_old_module_paths_give_the_new_modules(old):
    new = OLD_MODULES[old]
    new = importlib.import_module(new) if isinstance(new, str) else new
    fresh(old)
    assert warns_once(old, lambda: importlib.import_module(old)) is new


def test_names_the_old_modules_had():
    fresh("actzip.memory.presets")
    fresh("actzip.memory.compressed")
    with pytest.warns(FutureWarning):
        from actzip.memory.presets import PRESETS, compressed, preset_rules  # noqa: F401
        from actzip.memory.rules import CacheConfig, default_rules  # noqa: F401
        from actzip.memory.saved import ActivationCache, current_cache, record_external  # noqa: F401
        from actzip.memory.handout import Handout
        from actzip.memory.offload import Offloader  # noqa: F401
    assert CacheConfig is actzip.CacheConfig and issubclass(ActivationCache, CacheContext)
    assert record_external is actzip.memory.record_external and current_cache() is None
    fresh("actzip.memory.handout.Handout")
    assert isinstance(warns_once("actzip.memory.handout.Handout", Handout), stored.StoredActivation)
