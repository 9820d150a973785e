"""Imports between the files of `autocast_onnx/` run one way: no import circles, and no import from a
lower layer up to a higher one (CONTRIBUTING.md "Layout and data flow", docs/architecture.md).

Every `import` and `from ... import` counts, function-local (lazy) ones included: a lazy import
still ties the two files together. The graph is read with `ast`, so nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autocast_onnx"

# The layers, highest first. A unit is a top-level module or subpackage of autocast_onnx
# (`__init__` is the package's own facade). A unit may import units of its own layer and of the
# layers below it, never one above it.
LAYERS: list[tuple[str, ...]] = [
    ("__init__", "__main__"),  # the public facade: `import autocast_onnx`, `python -m autocast_onnx`
    ("cli",),  # option groups and exit codes over the library calls
    ("api", "compat", "config"),  # the Python API, its drop-ins for other converters; the configuration file
    ("gate",),  # `check`: convert, validate and lint in one verdict
    (
        "validate",
        "lint",
    ),  # run and compare models, the checks (each with its options: validate/options.py, lint/engine.py)
    ("training",),  # artifacts folders: converts each model of the folder
    ("pipeline",),  # convert and convert_file: the stages in order
    ("report",),  # formatting results
    ("rewrite",),  # the only code that edits the graph
    ("plan",),  # classify, paint, the plan and its file
    ("roofline",),  # the GPU cost model: a graph, its shapes and the GPU table (below planning)
    ("catalog",),  # rule files, the kernel and compute tables (read with the graph's signatures)
    ("graph", "patterns", "diagnostics"),  # the index, the op signatures, shared judgements
    ("fast",),  # the fast path: the worker, the walk, the weight screen, payloads left in the file, the splice
    ("io",),  # load and save
    (
        "errors",
        "dtypes",
        "_version",
        "hazards",
        "filesys",
        "varint",
        "runtimes",
    ),  # leaves (hazards: what a constant loses)
]

# The fence around the fast path (fast/__init__.py): only the pipeline imports it, directly. The
# units below the pipeline do not reach it through any chain of imports either; lint and validate
# do, through the pipeline they call (a conversion takes the fast path), never by naming it.
FAST_IMPORTERS = {"pipeline", "fast"}
FENCED = ("plan", "graph", "catalog", "rewrite", "lint", "validate", "report")
FENCED_TRANSITIVELY = ("plan", "graph", "catalog", "rewrite", "report")


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, names: dict) -> list[str]:
    """The package modules one import statement names: `from X import y` names X.y where that is a
    module, else X."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.split(".")[0] == PACKAGE.name]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
        if target.split(".")[0] != PACKAGE.name:
            return []
    return [f"{target}.{alias.name}" if f"{target}.{alias.name}" in names else target for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its text."""
    names = module_names()
    graph: dict[str, set[str]] = {name: set() for name in names}
    for module, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(module, path.name == "__init__.py", node, names):
                while target not in names:  # `import autocast_onnx.x.y` of a name, not a module
                    target = target.rsplit(".", 1)[0]
                if target != module:
                    graph[module].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def unit(module: str) -> str:
    """The top-level module or subpackage a module belongs to (`__init__` for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str) -> int:
    """The index of the module's layer in LAYERS (0 is the highest)."""
    for depth, units in enumerate(LAYERS):
        if unit(module) in units:
            return depth
    raise AssertionError(f"{module} is in no layer: add its unit {unit(module)!r} to LAYERS")


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) where the imported module is in a higher layer than the importer."""
    return {(a, b) for a, targets in graph.items() for b in targets if layer_of(b) < layer_of(a)}


def _short(name: str) -> str:
    return name.removeprefix(PACKAGE.name + ".")


def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer_of(module)


def test_every_declared_unit_exists():
    units = {unit(module) for module in module_names()}
    assert not {u for layer in LAYERS for u in layer} - units, "LAYERS names a module that is gone"


def test_no_import_circles():
    found = [sorted(_short(m) for m in c) for c in circles(import_graph())]
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_upward_imports():
    found = sorted((_short(a), _short(b)) for a, b in upward_imports(import_graph()))
    assert not found, "imports up a layer: " + ", ".join(f"{a} -> {b}" for a, b in found)


def unit_ties(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(unit, unit) pairs, in order, of two units that import each other (folders in the same
    layer must keep one direction too)."""
    edges = {(unit(a), unit(b)) for a, targets in graph.items() for b in targets if unit(a) != unit(b)}
    return {(a, b) for a, b in edges if (b, a) in edges and a < b}


def test_no_two_units_import_each_other():
    found = sorted(unit_ties(import_graph()))
    assert not found, "units that import each other: " + ", ".join(f"{a} <-> {b}" for a, b in found)


def test_the_tie_check_finds_a_tie():
    graph = {
        "autocast_onnx.lint.api": {"autocast_onnx.validate.core"},
        "autocast_onnx.validate.core": {"autocast_onnx.lint.engine"},
    }
    assert unit_ties(graph) == {("lint", "validate")}


def test_the_checks_find_a_circle_and_an_upward_import():
    graph = {"autocast_onnx.io": {"autocast_onnx.plan.model"}, "autocast_onnx.plan.model": {"autocast_onnx.io"}}
    assert circles(graph) == [set(graph)]
    assert upward_imports(graph) == {("autocast_onnx.io", "autocast_onnx.plan.model")}


def test_lazy_and_relative_imports_are_read():
    tree = ast.parse("def f():\n    from ..plan import model\n    from .. import __version__\n")
    names = {"autocast_onnx": None, "autocast_onnx.plan": None, "autocast_onnx.plan.model": None}
    statements = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    found = [target for node in statements for target in _targets("autocast_onnx.plan.screen", False, node, names)]
    assert found == ["autocast_onnx.plan.model", "autocast_onnx"]


def fast_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) where a module outside FAST_IMPORTERS imports the fast path directly."""
    return {
        (a, b) for a, targets in graph.items() for b in targets if unit(b) == "fast" and unit(a) not in FAST_IMPORTERS
    }


def reaches_fast(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A chain of imports from `start` to a module of the fast path (None: there is none)."""
    seen = {start}
    paths = [[start]]
    while paths:
        path = paths.pop()
        for nxt in sorted(graph[path[-1]]):
            if unit(nxt) == "fast":
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                paths.append(path + [nxt])
    return None


def test_only_the_pipeline_and_the_command_line_import_the_fast_path():
    found = sorted((_short(a), _short(b)) for a, b in fast_imports(import_graph()))
    assert not found, "imports of the fast path from outside its fence: " + ", ".join(f"{a} -> {b}" for a, b in found)
    assert set(FENCED).isdisjoint(FAST_IMPORTERS)


def test_planning_rewriting_and_reports_do_not_reach_the_fast_path():
    graph = import_graph()
    chains = [reaches_fast(graph, m) for m in graph if unit(m) in FENCED_TRANSITIVELY]
    found = [" -> ".join(_short(m) for m in chain) for chain in chains if chain]
    assert not found, "chains into the fast path: " + "; ".join(found)


def test_the_fence_checks_find_a_forbidden_import():
    graph = {
        "autocast_onnx.plan.classify": {"autocast_onnx.graph.index"},
        "autocast_onnx.graph.index": {"autocast_onnx.fast.screen"},
        "autocast_onnx.fast.screen": set(),
    }
    assert fast_imports(graph) == {("autocast_onnx.graph.index", "autocast_onnx.fast.screen")}
    assert reaches_fast(graph, "autocast_onnx.plan.classify") == [
        "autocast_onnx.plan.classify",
        "autocast_onnx.graph.index",
        "autocast_onnx.fast.screen",
    ]
