"""The previous release's module paths of actzip.memory.modules: each gives the new module, warning once."""

import importlib
import sys
import warnings

import pytest

import actzip
from actzip import compat

OLD_PATHS = {
    "actzip.memory.apply": "actzip.memory.modules",
    "actzip.memory.arena": "actzip.memory.modules.arena",
    "actzip.memory.fp8_linear": "actzip.memory.modules.fp8_linear",
    "actzip.memory.linear": "actzip.memory.modules.sketched_linear",
    "actzip.memory.relu_mlp": "actzip.memory.modules.relu_mlp",
}


def _import_afresh(old: str):
    compat.warned.discard(old)
    sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    if child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)
    return importlib.import_module(old)


@pytest.mark.parametrize("old,new", OLD_PATHS.items())
def test_old_module_path_is_the_new_module_and_warns_once(old, new):
    with pytest.warns(FutureWarning, match=rf"{old} is deprecated.*use {new}"):
        module = _import_afresh(old)
    assert module is importlib.import_module(new)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sys.modules.pop(old)
        assert importlib.import_module(old) is module  # a second import does not warn again


def test_old_names_in_the_old_modules_still_work():
    with pytest.warns(FutureWarning):
        apply = _import_afresh("actzip.memory.apply")
    assert apply.compress_ is actzip.compress_ and apply.SparseMLPConfig is actzip.SparseMLPConfig
    assert apply.CompressReport is actzip.CompressReport
    with pytest.warns(FutureWarning):
        linear = _import_afresh("actzip.memory.linear")
    with pytest.warns(FutureWarning):
        fp8 = _import_afresh("actzip.memory.fp8_linear")
    assert linear.sketch_linears_ is actzip.memory.sketch_linears_ and fp8.fp8_linears_ is actzip.memory.fp8_linears_
    with pytest.warns(FutureWarning):
        arena = _import_afresh("actzip.memory.arena")
    assert arena.Arena is actzip.memory.Arena and arena.GraphedStep is actzip.memory.GraphedStep
