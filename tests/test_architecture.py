"""The import graph of the package and the toy trainer: layers import only downward, and no module loop.

The graph covers ``vrh_interp/`` and the toy trainer ``toy_training/`` (outside the wheel, above the package: it
may import ``vrh_interp``, never the other way round). Every ``import`` statement counts, including those inside
functions (lazy imports keep start-up fast, they do not change what depends on what) and under ``TYPE_CHECKING``
(an upward type is an upward dependency). The public facade ``vrh_interp/__init__.py`` sits above every layer of
the package and nothing inside the package imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES: tuple[str, ...] = ("vrh_interp", "toy_training")  # the import roots the graph covers
PACKAGE = ROOT / "vrh_interp"

# lowest first; a module may import its own layer and the layers before it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("vrh_interp.core",)),
    ("data", ("vrh_interp.data",)),
    ("models", ("vrh_interp.toy", "vrh_interp.specs")),
    ("methods", ("vrh_interp.scoring", "vrh_interp.evaluation", "vrh_interp.patching", "vrh_interp.viz")),
    ("experiments", ("vrh_interp.experiments",)),
    ("apps", ("vrh_interp.apps",)),
    ("facade", ("vrh_interp",)),
    ("trainer", ("toy_training",)),  # not in the wheel (tests/test_wheel.py); the shipped toys load without it
)


def _modules() -> dict[str, tuple[Path, bool]]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> dict[str, int]:
    """{imported module of ``PACKAGES``: first line}, relative imports resolved, ``from pkg import mod`` as the mod."""
    path, is_package = MODULES[module]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            names = [f"{origin}.{alias.name}" for alias in node.names] or [origin]
        for name in names:
            target = _resolve(name) if name.split(".")[0] in PACKAGES else None
            if target and target != module:
                found.setdefault(target, node.lineno)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def layer_of(module: str) -> int:
    best = (-1, -1)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), index))
    return best[1]


def test_every_module_has_a_layer():
    facade = [name for name, _ in LAYERS].index("facade")
    loose = sorted(m for m in MODULES if m != "vrh_interp" and layer_of(m) in (facade, -1))
    assert not loose, f"modules outside every layer (move them into one of {[n for n, _ in LAYERS[:facade]]}): {loose}"


def test_no_upward_imports():
    upward = []
    for module, imports in GRAPH.items():
        for target, line in imports.items():
            if layer_of(target) > layer_of(module):
                upward.append(f"{MODULES[module][0].relative_to(ROOT)}:{line} ({LAYERS[layer_of(module)][0]})"
                              f" imports {target} ({LAYERS[layer_of(target)][0]})")
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, dict[str, int]] = GRAPH) -> list[list[str]]:
    """Strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return components


def test_no_import_loops():
    loops = _cycles()
    assert not loops, "import loops (modules that import each other, directly or through others):\n" + "\n".join(
        " <-> ".join(component) for component in loops)


def test_viz_is_a_leaf_of_the_methods_layer():
    # results draw themselves through viz (``HeadScores.heatmap``, ``HeadPatchingResult.heatmap`` -> ``viz.plots``);
    # viz reads layouts from core, never scoring or patching, so those packages and viz form no loop
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() if module.startswith("vrh_interp.viz")
                    for target in targets if target.startswith(("vrh_interp.scoring", "vrh_interp.patching")))
    assert not upward, "viz imports a package that draws through it: " + ", ".join(upward)


def test_core_description_and_execution_import_no_run_records():
    # core's three parts (vrh_interp/core/__init__.py): what the model is (description) and running things on it
    # (execution) never import the run records (bookkeeping), which may read the model's description (provenance)
    parts = ("vrh_interp.core.description", "vrh_interp.core.execution")
    found = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() if module.startswith(parts)
                   for target in targets if target.startswith("vrh_interp.core.bookkeeping"))
    assert not found, "core.description / core.execution import core.bookkeeping: " + ", ".join(found)


@pytest.mark.parametrize("module", ["vrh_interp.core.description.model", "vrh_interp.apps.cli", "toy_training.train"])
def test_the_checker_sees_imports(module):
    # guards the test itself: a parser that found no edges would pass everything above
    assert GRAPH[module], f"{module} imports nothing from {' or '.join(PACKAGES)}? the import parser is broken"


def test_the_checker_sees_imports_inside_functions_and_their_loops():
    # guards the loop test: toy_training.train imports regime inside ship(); an edge back from the module the
    # trainer's shared pieces live in (toy_training.grounding) would close a loop, and the checker must find it
    assert "toy_training.regime" in GRAPH["toy_training.train"], "imports inside functions are not parsed"
    looped = {**GRAPH, "toy_training.grounding": {**GRAPH["toy_training.grounding"], "toy_training.train": 1}}
    assert any({"toy_training.grounding", "toy_training.train"} <= set(c) for c in _cycles(looped))


# issue 32: an app is a composition of named steps; a function over this many lines hides steps that want names
APPS = PACKAGE / "apps"
MAX_APP_FUNCTION_LINES = 80


def long_functions(source: str, limit: int = MAX_APP_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function (methods and nested ones too) longer than ``limit`` lines,
    decorators and docstring included."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{getattr(child, 'name', '')}"
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                if child.end_lineno - first + 1 > limit:
                    found.append((name, child.end_lineno - first + 1))
            visit(child, f"{name}." if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  else prefix)

    visit(ast.parse(source), "")
    return found


def test_no_function_in_vrh_interp_apps_over_80_lines():
    too_long = {f"{path.relative_to(ROOT)}::{name}": lines for path in sorted(APPS.rglob("*.py"))
                for name, lines in long_functions(path.read_text())}
    assert not too_long, (f"functions over {MAX_APP_FUNCTION_LINES} lines in vrh_interp/apps (split them into named "
                          f"steps or helpers): {too_long}")


def test_the_function_length_guard_fires():
    # guards the guard: a synthetic 81-line function (and a long method nested in a class) must be reported
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    source = f"def short():\n    return 1\n\n\ndef long():\n{body}\n\nclass C:\n    def m(self):\n" + \
        "".join(f"        y{i} = {i}\n" for i in range(80))
    assert long_functions(source) == [("long", 81), ("C.m", 81)]
    assert long_functions("def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(79))) == []
