"""The library's shape, checked from the source text with ``ast`` (no module is imported or executed).

Layers, imports pointing down only: ``actzip_bench`` -> ``memory``, ``wire`` -> ``codecs`` -> ``kernels`` ->
``core`` and ``errors``; ``api`` sits beside ``core`` and imports none of the capabilities. Every check here
also runs once on a small broken tree, to show that it fails when it should.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import structure_checks as checks
from structure_checks import ModuleSet

REPO = Path(__file__).resolve().parents[1]
MAX_FILES_TO_KERNEL = 5  # api.py, the SparseMLPConfig handler, ..., the @triton.jit module


@pytest.fixture(scope="module")
def src() -> ModuleSet:
    return ModuleSet.from_root(REPO / "src", ("actzip", "actzip_bench"), label="src")


@pytest.fixture(scope="module")
def tests_and_scripts() -> ModuleSet:
    return ModuleSet.from_root(REPO, ("tests", "scripts"))


def _fail_with(problems: list[str], what: str) -> None:
    if problems:
        pytest.fail(f"{what}:\n" + "\n".join(problems), pytrace=False)


def _tree(**files: str) -> ModuleSet:
    """A synthetic source tree: ``_tree(**{"actzip/a.py": "import x"})``; packages get an empty __init__."""
    sources = dict(files)
    for rel in files:
        parts = Path(rel).parts[:-1]
        for i in range(1, len(parts) + 1):
            sources.setdefault(str(Path(*parts[:i], "__init__.py")), "")
    return ModuleSet(sources)


# -- import cycles ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("package", ["actzip", "actzip_bench"])
def test_no_import_cycles(src, package):
    _fail_with(checks.import_cycles(src, package), f"import cycles among {package} modules (every import counted, "
               "inside functions too, except under `if TYPE_CHECKING:`)")


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    tree = _tree(**{
        "actzip/a.py": "from actzip import b\nfrom actzip import c\n",
        "actzip/b.py": "def f():\n    import actzip.a\n",
        "actzip/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actzip.a import A\n",
        "actzip/d.py": "from .e import E\n",  # relative imports resolve too
        "actzip/e.py": "try:\n    from actzip.d import D\nexcept ImportError:\n    D = None\n",
    })
    problems = checks.import_cycles(tree)
    assert len(problems) == 2, problems
    assert problems[0].startswith("import cycle actzip.a -> actzip.b -> actzip.a") and "actzip/b.py:2" in problems[0]
    assert problems[1].startswith("import cycle actzip.d -> actzip.e -> actzip.d")
    assert not any("actzip.c" in p for p in problems)  # TYPE_CHECKING imports never run


# -- what the library imports ----------------------------------------------------------------------------------


def test_the_library_never_imports_actzip_bench(src):
    _fail_with(checks.bench_imports_in_library(src), "actzip imports actzip_bench (benchmarks import the library, "
               "never the other way)")


def test_the_library_imports_only_stdlib_torch_numpy_at_module_level(src):
    _fail_with(checks.third_party_imports(src), "library imports beyond the standard library, torch and numpy")


def test_import_checks_fail_on_a_broken_tree():
    tree = _tree(**{
        "actzip/a.py": "import os\nimport numpy\nimport torch.nn\nimport triton\nfrom actzip_bench.models import GPT\n",
        "actzip/b.py": "def f():\n    import triton\n    import requests\ntry:\n    import peft\nexcept ImportError:\n"
                       "    peft = None\n",
    })
    bench = checks.bench_imports_in_library(tree)
    assert len(bench) == 1 and bench[0].startswith("actzip/a.py:5: actzip.a imports actzip_bench.models")
    third = checks.third_party_imports(tree)
    assert any(p.startswith("actzip/a.py:4:") and "optional triton at module level" in p for p in third)
    assert any(p.startswith("actzip/b.py:3:") and "requests, which is not a dependency" in p for p in third)
    assert not any("b.py:2:" in p or "b.py:5:" in p for p in third)  # in a function / a try block: fine
    assert len(third) == 3  # triton, actzip_bench, requests; os, numpy and torch are fine


# -- private names ---------------------------------------------------------------------------------------------


def test_no_private_imports_across_modules(src, tests_and_scripts):
    problems = checks.private_imports(src) + checks.private_imports(tests_and_scripts)
    _fail_with(problems, "private names imported from another module in src/, tests/ "
               "or scripts/")


def test_private_import_check_fails_on_a_broken_tree():
    tree = _tree(**{
        "actzip/codecs/quant.py": "def _check_seed(s):\n    return s\ndef check_seed(s):\n    return s\n",
        "actzip/codecs/mask.py": "from actzip.codecs.quant import _check_seed, check_seed\n"
                                 "from actzip import __version__\n",
        "actzip/codecs/sketch.py": "import actzip.codecs._impl as impl\n",
        "tests/test_quant.py": "def test():\n    from actzip.codecs.quant import _check_seed\n",
    })
    problems = checks.private_imports(tree)
    assert len(problems) == 3, problems
    assert problems[0].startswith("actzip/codecs/mask.py:1:") and "private _check_seed from actzip.codecs.quant" in problems[0]
    assert "private _impl" in problems[1] and problems[2].startswith("tests/test_quant.py:2:")


# -- file length -----------------------------------------------------------------------------------------------


def _line_counts() -> dict[str, int]:
    return {str(p.relative_to(REPO)): len(p.read_text().splitlines())
            for top in ("src", "tests", "scripts") for p in sorted((REPO / top).rglob("*.py"))}


def test_no_python_file_over_500_lines():
    _fail_with(checks.long_files(_line_counts()), "files over the line limit")


def test_long_file_check_fails_on_a_long_file():
    assert checks.long_files({"src/actzip/a.py": 500, "src/actzip/b.py": 501}) == [
        "src/actzip/b.py: 501 lines (at most 500: split it by concept)"]


# -- layers ----------------------------------------------------------------------------------------------------


def test_imports_point_down_the_layers(src):
    _fail_with(checks.layer_violations(src), "imports against the layers (core, errors <- kernels <- codecs <- "
               "memory, wire; api beside core; memory and wire apart)")


def test_layer_check_fails_on_a_broken_tree():
    tree = _tree(**{
        "actzip/core/payload.py": "def f():\n    from actzip.memory import saved\n",
        "actzip/errors.py": "import actzip.codecs\n",
        "actzip/api.py": "from actzip.wire import stages\n",
        "actzip/kernels/sparse_triton.py": "from actzip.codecs.sparse import SparseCodec\n",
        "actzip/codecs/sparse.py": "from actzip.kernels import sparse_triton\ndef f():\n    from actzip.kernels import runtime\n",
        "actzip/codecs/quant.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actzip.memory import saved\n",
        "actzip/memory/saved.py": "from actzip.wire.stages import Stage\n",
        "actzip/wire/stages.py": "import actzip.memory.saved\nimport actzip.codecs.sparse\n",
        "actzip/kernels/runtime.py": "",
    })
    problems = checks.layer_violations(tree)
    expected = ["actzip/api.py:1: actzip.api (api) imports actzip.wire.stages (wire)",
                "actzip/codecs/sparse.py:1: actzip.codecs.sparse imports actzip.kernels.sparse_triton at module level",
                "actzip/core/payload.py:2: actzip.core.payload (core) imports actzip.memory.saved (memory)",
                "actzip/errors.py:1: actzip.errors (core) imports actzip.codecs (codecs)",
                "actzip/kernels/sparse_triton.py:1: actzip.kernels.sparse_triton (kernels) imports actzip.codecs.sparse",
                "actzip/memory/saved.py:1: actzip.memory.saved (memory) imports actzip.wire.stages (wire)",
                "actzip/wire/stages.py:1: actzip.wire.stages (wire) imports actzip.memory.saved (memory)"]
    assert len(problems) == len(expected), problems
    for p, e in zip(sorted(problems), expected):
        assert p.startswith(e), (p, e)


# -- errors ----------------------------------------------------------------------------------------------------


def test_every_error_is_defined_in_errors_listed_and_exported(src):
    found = checks.exception_classes(src)
    assert "ActzipError" in found and "ConfigError" in found  # the finder sees the library's errors at all
    _fail_with(checks.error_problems(src), "actzip errors outside actzip/errors.py, missing from its __all__, or "
               "not importable as actzip.<Name>")


def test_error_check_fails_on_a_broken_tree():
    tree = _tree(**{
        "actzip/__init__.py": "from actzip.errors import ActzipError, ConfigError\n",
        "actzip/errors.py": "__all__ = ['ActzipError', 'ConfigError', 'WireError']\n"
                            "class ActzipError(Exception): ...\nclass ConfigError(ActzipError, ValueError): ...\n"
                            "class WireError(ActzipError): ...\nclass StrayError(ActzipError): ...\n"
                            "class ActzipWarning(UserWarning): ...\n",
        "actzip/memory/rules.py": "from actzip.errors import ConfigError\nclass RuleError(ConfigError): ...\n"
                                  "class _Internal(RuntimeError): ...\n",
    })
    assert checks.error_problems(tree) == [
        "RuleError (actzip/memory/rules.py:2): every actzip error is defined in actzip/errors.py",
        "StrayError (actzip/errors.py:5) is missing from actzip.errors.__all__",
        "WireError (actzip/errors.py:4): actzip.WireError does not exist (actzip/__init__.py does not import it)",
    ]


# -- from compress_ to the kernel ------------------------------------------------------------------------------


def test_compress_reaches_the_fused_relu_mlp_kernel_within_five_files(src):
    path, problem = checks.path_to_kernel(src, "SparseMLPConfig")
    assert problem is None, problem
    files = [src.modules[m].path for m in path]
    assert len(files) <= MAX_FILES_TO_KERNEL, (f"compress_(model, SparseMLPConfig()) crosses {len(files)} files to "
                                               f"its @triton.jit kernel (at most {MAX_FILES_TO_KERNEL}): "
                                               + " -> ".join(files))


def test_kernel_path_check_fails_on_a_long_chain():
    chain = {f"actzip/memory/m{i}.py": f"def f():\n    from actzip.memory import m{i + 1}\n" for i in range(1, 5)}
    tree = _tree(**{
        "actzip/api.py": "def register_handler(t): ...\n",
        "actzip/memory/apply.py": "from actzip.api import register_handler\nfrom actzip.memory import m1\n"
                                  "class SparseMLPConfig: ...\n@register_handler(SparseMLPConfig)\ndef h(*a): ...\n",
        **chain,
        "actzip/memory/m5.py": "from actzip.kernels import relu_mlp_triton\n",
        "actzip/kernels/relu_mlp_triton.py": "import triton\n@triton.jit\ndef k(x):\n    pass\n",
    })
    path, problem = checks.path_to_kernel(tree, "SparseMLPConfig")
    assert problem is None and path[:2] == ["actzip.api", "actzip.memory.apply"]
    assert path[-1] == "actzip.kernels.relu_mlp_triton" and len(path) == 8 > MAX_FILES_TO_KERNEL
    _, problem = checks.path_to_kernel(tree, "OtherConfig")
    assert "no module registers a compress_ handler for OtherConfig" in problem
