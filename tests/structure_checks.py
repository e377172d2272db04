"""Structure checks over source files, read with ``ast`` only (nothing is imported or executed).

:class:`ModuleSet` parses a tree of packages into modules and their imports; each check takes one and
returns a list of problems, one readable line each (empty: the check passes). ``tests/test_layers.py`` runs
them on ``src/`` and on small broken trees, so that each is seen to fail when it should.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

# Third-party packages the library may use only inside functions or try blocks (optional dependencies).
OPTIONAL_DEPENDENCIES = frozenset({"triton", "transformers", "peft", "scipy", "rich", "matplotlib",
                                   "safetensors"})
# What the library may import at module top level, besides the standard library and itself.
REQUIRED_DEPENDENCIES = frozenset({"torch", "numpy"})
LINE_LIMIT = 500

# Layer of each library module, by its name's prefix (longest prefix wins); "api" sits beside core.
LAYER_PREFIXES = {"actzip.core": "core", "actzip.errors": "core", "actzip.api": "api", "actzip.kernels": "kernels",
                  "actzip.codecs": "codecs", "actzip.memory": "memory", "actzip.wire": "wire", "actzip.rl": "rl",
                  "actzip.split": "split", "actzip.prompt": "prompt"}
# layer -> the layers it must not import
# (rl applies the memory planner around an RL update; memory takes exposures as tensors, never from rl)
FORBIDDEN_LAYERS = {
    "core": {"api", "kernels", "codecs", "memory", "wire", "rl", "split", "prompt"},
    "api": {"kernels", "codecs", "memory", "wire", "rl", "split", "prompt"},
    "kernels": {"codecs", "memory", "wire", "rl", "split", "prompt"},
    "codecs": {"memory", "wire", "rl", "split", "prompt"},
    "memory": {"wire", "rl", "split", "prompt"},
    "wire": {"memory", "rl", "split", "prompt"},
    "rl": {"wire", "split", "prompt"},
    "split": {"memory", "rl", "prompt"},  # split learning sends over the wire; it keeps nothing for backward
    "prompt": {"memory", "wire", "rl", "split"},  # prompt hooks a model's forward; it keeps and sends nothing
}
# Exception types of the standard library an actzip error may derive from.
BUILTIN_ERRORS = frozenset(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, Exception)
                           and not issubclass(v, Warning))


@dataclass
class Import:
    """One import statement's target, where it is, and under what it runs."""

    importer: str  # dotted name of the importing module
    target: str  # dotted name of the imported module (a package when a name is taken from its __init__)
    names: tuple[str, ...]  # names taken by ``from target import ...`` (empty for ``import target``)
    path: str  # file of the importer
    line: int
    top_level: bool  # runs when the module is imported (not inside a function)
    in_try: bool  # inside a try statement (an optional dependency handled there)
    type_checking: bool  # inside ``if TYPE_CHECKING:`` (never runs)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def root(self) -> str:
        return self.target.partition(".")[0]


@dataclass
class Module:
    """One parsed source file."""

    name: str  # dotted module name (a package's __init__ is the package)
    path: str  # the file, as messages name it
    tree: ast.Module
    is_package: bool  # an __init__.py (relative imports resolve from the package itself)
    imports: list[Import] = field(default_factory=list)


def module_name(rel: Path) -> tuple[str, bool]:
    """``actzip/memory/__init__.py`` -> ``("actzip.memory", True)``."""
    parts = list(rel.with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


class ModuleSet:
    """The modules under a source root and their imports, with the import graph between them."""

    def __init__(self, sources: dict[str, str], label: str = ""):
        """``sources``: ``{path relative to the source root: text}``; ``label`` prefixes paths in messages."""
        self.modules: dict[str, Module] = {}
        for rel, text in sorted(sources.items()):
            name, is_package = module_name(Path(rel))
            path = f"{label}/{rel}" if label else rel
            self.modules[name] = Module(name, path, ast.parse(text, filename=path), is_package)
        for m in self.modules.values():
            m.imports = list(self._imports(m))

    @classmethod
    def from_root(cls, root: Path, packages: tuple[str, ...], label: str = "") -> "ModuleSet":
        sources = {str(p.relative_to(root)): p.read_text() for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
        return cls(sources, label=label)

    def of(self, prefix: str) -> list[Module]:
        return [m for n, m in self.modules.items() if n == prefix or n.startswith(prefix + ".")]

    def _resolve(self, m: Module, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = m.name.split(".") if m.is_package else m.name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def _imports(self, m: Module):
        def visit(node, top: bool, in_try: bool, tc: bool):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import):
                    for a in child.names:
                        yield Import(m.name, a.name, (), m.path, child.lineno, top, in_try, tc)
                elif isinstance(child, ast.ImportFrom):
                    base = self._resolve(m, child)
                    if base == "__future__":
                        continue
                    plain = [a.name for a in child.names if f"{base}.{a.name}" not in self.modules]
                    for a in child.names:  # a submodule taken by name is an import of that submodule
                        if f"{base}.{a.name}" in self.modules:
                            yield Import(m.name, f"{base}.{a.name}", (), m.path, child.lineno, top, in_try, tc)
                    if plain:
                        yield Import(m.name, base, tuple(plain), m.path, child.lineno, top, in_try, tc)
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    yield from visit(child, False, in_try, tc)
                elif isinstance(child, ast.Try) or type(child).__name__ == "TryStar":
                    yield from visit(child, top, True, tc)
                elif isinstance(child, ast.If) and _is_type_checking(child.test):
                    for stmt in child.body:
                        yield from visit(ast.Module(body=[stmt], type_ignores=[]), top, in_try, True)
                    for stmt in child.orelse:
                        yield from visit(ast.Module(body=[stmt], type_ignores=[]), top, in_try, tc)
                else:
                    yield from visit(child, top, in_try, tc)

        yield from visit(m.tree, True, False, False)

    def graph(self, prefix: str) -> dict[str, dict[str, Import]]:
        """``{module: {imported module: the first import of it}}`` among the modules under ``prefix``, every
        import counted (inside functions too) except those under ``if TYPE_CHECKING:``."""
        out: dict[str, dict[str, Import]] = {}
        for m in self.of(prefix):
            edges = out.setdefault(m.name, {})
            for imp in m.imports:
                inside = imp.target == prefix or imp.target.startswith(prefix + ".")
                if inside and not imp.type_checking and imp.target in self.modules and imp.target != m.name:
                    edges.setdefault(imp.target, imp)
        return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


# -- graph algorithms ------------------------------------------------------------------------------------------


def strongly_connected(graph: dict[str, dict]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, comps, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        comp.append(n)
                        if n == node:
                            break
                    if len(comp) > 1:
                        comps.append(sorted(comp))
    return comps


def shortest_path(graph: dict[str, dict], start: str, goals) -> list[str] | None:
    """The fewest-edges path from ``start`` to any module in ``goals`` (``start`` included), or None."""
    goals = set(goals)
    prev, queue = {start: None}, deque([start])
    while queue:
        node = queue.popleft()
        if node in goals:
            path = []
            while node is not None:
                path.append(node)
                node = prev[node]
            return path[::-1]
        for child in sorted(graph.get(node, ())):
            if child not in prev:
                prev[child] = node
                queue.append(child)
    return None


def find_cycles(graph: dict[str, dict[str, Import]]) -> list[str]:
    """One shortest cycle per tangle of modules, with the import that makes each step."""
    out = []
    for comp in strongly_connected(graph):
        members = set(comp)
        sub = {n: {t: i for t, i in graph[n].items() if t in members} for n in comp}
        start = comp[0]
        best = None
        for nxt in sorted(sub[start]):
            back = shortest_path(sub, nxt, {start})
            if back and (best is None or len(back) < len(best)):
                best = back
        cycle = [start, *best]
        steps = ", ".join(f"{a} -> {b} ({graph[a][b].where})" for a, b in zip(cycle, cycle[1:]))
        out.append(f"import cycle {' -> '.join(cycle)}: {steps}")
    return out


# -- checks ----------------------------------------------------------------------------------------------------


def import_cycles(mods: ModuleSet, prefix: str = "actzip") -> list[str]:
    return find_cycles(mods.graph(prefix))


def bench_imports_in_library(mods: ModuleSet) -> list[str]:
    return [f"{i.where}: {i.importer} imports {i.target}: the library never imports actzip_bench"
            for m in mods.of("actzip") for i in m.imports if i.root == "actzip_bench"]


def third_party_imports(mods: ModuleSet) -> list[str]:
    """Library imports beyond the standard library, torch and numpy: optional ones only in functions or try."""
    out = []
    for m in mods.of("actzip"):
        for i in m.imports:
            if i.type_checking or i.root in sys.stdlib_module_names or i.root in REQUIRED_DEPENDENCIES | {"actzip"}:
                continue
            if i.root not in OPTIONAL_DEPENDENCIES:
                out.append(f"{i.where}: {m.name} imports {i.target}, which is not a dependency of the library "
                           f"(allowed: the standard library, torch, numpy; optional: {sorted(OPTIONAL_DEPENDENCIES)})")
            elif i.top_level and not i.in_try:
                out.append(f"{i.where}: {m.name} imports the optional {i.target} at module level; import it inside "
                           "the function that needs it, or in a try block that raises MissingDependencyError")
    return out


def private_imports(mods: ModuleSet, own: tuple[str, ...] = ("actzip", "actzip_bench")) -> list[str]:
    """``from a.b import _name`` / ``import a._b`` of a module other than the importer's own."""
    out = []
    for m in mods.modules.values():
        for i in m.imports:
            if i.root not in own or i.target == m.name:
                continue
            private = [n for n in i.names if _private(n)] + [p for p in i.target.split(".") if _private(p)]
            if private:
                fix = ("test through public names" if m.name.startswith("tests") else
                       "make it public (in actzip.core if several layers share it)")
                out.append(f"{i.where}: {m.name} imports private {', '.join(private)} from {i.target}; {fix}")
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def long_files(files: dict[str, int], limit: int = LINE_LIMIT) -> list[str]:
    """``files``: ``{path: number of lines}``."""
    return [f"{p}: {n} lines (at most {limit}: split it by concept)" for p, n in sorted(files.items()) if n > limit]


def layer_of(name: str) -> str | None:
    best = max((p for p in LAYER_PREFIXES if name == p or name.startswith(p + ".")), key=len, default=None)
    return LAYER_PREFIXES.get(best)


def layer_violations(mods: ModuleSet) -> list[str]:
    """Imports pointing up (or across memory/wire), every import counted but TYPE_CHECKING ones; and codecs
    reaching the kernels at module level (they take them only when Triton is wanted)."""
    out = []
    for m in mods.of("actzip"):
        layer = layer_of(m.name)
        for i in m.imports:
            if i.type_checking or i.root != "actzip":
                continue
            to = layer_of(i.target)
            if layer in FORBIDDEN_LAYERS and to in FORBIDDEN_LAYERS[layer]:
                out.append(f"{i.where}: {m.name} ({layer}) imports {i.target} ({to}); imports point down only")
            elif layer == "codecs" and to == "kernels" and i.top_level:
                out.append(f"{i.where}: {m.name} imports {i.target} at module level; codecs take kernels lazily")
    return out


def exception_classes(mods: ModuleSet) -> dict[str, list[tuple[str, int]]]:
    """``{class name: [(path, line), ...]}`` of every class in the library deriving from an exception (by
    base names, to a fixed point), warnings excluded."""
    defs = [(n, m) for m in mods.of("actzip") for n in ast.walk(m.tree) if isinstance(n, ast.ClassDef)]
    known, found = set(BUILTIN_ERRORS) - {"Warning"}, {}
    changed = True
    while changed:
        changed = False
        for node, m in defs:
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None) for b in node.bases}
            if bases & known and node.name not in known:
                known.add(node.name)
                changed = True
    for node, m in defs:
        if node.name in known:
            found.setdefault(node.name, []).append((m.path, node.lineno))
    return found


def module_all(m: Module) -> list[str]:
    """The string literals assigned (or added) to ``__all__`` at module level."""
    out = []
    for node in m.tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                out += [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def error_problems(mods: ModuleSet) -> list[str]:
    errors, root = mods.modules.get("actzip.errors"), mods.modules.get("actzip")
    if errors is None or root is None:
        return ["actzip/errors.py or actzip/__init__.py is missing"]
    listed = set(module_all(errors))
    exported = set()
    for i in root.imports:
        if i.top_level and i.target == "actzip.errors":
            exported |= listed if "*" in i.names else set(i.names)
    out = []
    for name, places in sorted(exception_classes(mods).items()):
        if _private(name):
            continue
        where = ", ".join(f"{p}:{n}" for p, n in places)
        if any(p != errors.path for p, _ in places):
            out.append(f"{name} ({where}): every actzip error is defined in actzip/errors.py")
        elif name not in listed:
            out.append(f"{name} ({where}) is missing from actzip.errors.__all__")
        elif name not in exported:
            out.append(f"{name} ({where}): actzip.{name} does not exist (actzip/__init__.py does not import it)")
    return out


def handler_module(mods: ModuleSet, config: str) -> str | None:
    """The module that registers the ``compress_`` handler of ``config`` (``@register_handler(config)``)."""
    for m in mods.of("actzip"):
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id == config:
                f = node.func
                if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "register_handler":
                    return m.name
    return None


def triton_kernel_modules(mods: ModuleSet) -> set[str]:
    """Modules defining a function decorated with ``@triton.jit`` (or ``@triton.jit(...)``)."""
    out = set()
    for m in mods.of("actzip"):
        for node in ast.walk(m.tree):
            if isinstance(node, ast.FunctionDef):
                for d in node.decorator_list:
                    d = d.func if isinstance(d, ast.Call) else d
                    if isinstance(d, ast.Attribute) and d.attr == "jit" and getattr(d.value, "id", "") == "triton":
                        out.add(m.name)
    return out


def path_to_kernel(mods: ModuleSet, config: str = "SparseMLPConfig", entry: str = "actzip.api"):
    """``(files, problem)``: the files from ``entry`` through ``config``'s handler module to the nearest
    ``@triton.jit`` module (api dispatches to the handler through its registry, not an import)."""
    handler = handler_module(mods, config)
    if handler is None:
        return None, f"no module registers a compress_ handler for {config} (@register_handler({config}))"
    kernels = triton_kernel_modules(mods)
    path = shortest_path(mods.graph("actzip"), handler, kernels)
    if path is None:
        return None, f"{handler} (the {config} handler) reaches no @triton.jit module through its imports"
    return [entry, *path] if entry != handler else path, None
