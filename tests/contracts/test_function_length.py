"""No function in autocast_onnx/ is over MAX_LINES lines (a long function does several jobs: split
it into named parts). The functions still over are listed with their current length, which may
only shrink: the test fails if a listed one grew, or if one not listed is over the limit. Shrink
a listed function and lower (or drop) its entry."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autocast_onnx"
MAX_LINES = 100

# "module path:qualified name" -> its length in lines today (from `def` to its last line,
# decorators excluded); to be split, never to grow
STILL_OVER: dict[str, int] = {}


@functools.cache
def function_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """'module:qualname' -> lines, for every function and method (nested ones included) in the package."""
    found: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        _measure(tree, path.relative_to(package).as_posix() + ":", found)
    return found


def _measure(node: ast.AST, prefix: str, found: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            end = child.end_lineno if child.end_lineno is not None else child.lineno
            found[name] = max(found.get(name, 0), end - child.lineno + 1)  # a redefinition: the longer
            _measure(child, f"{name}.", found)
        elif isinstance(child, ast.ClassDef):
            _measure(child, f"{prefix}{child.name}.", found)
        else:
            _measure(child, prefix, found)


def test_no_function_over_the_limit_unless_listed():
    lengths = function_lengths()
    over = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in STILL_OVER}
    assert not over, f"functions over {MAX_LINES} lines: split them into named parts: {over}"


def test_listed_functions_only_shrink():
    lengths = function_lengths()
    grown = {name: (limit, lengths[name]) for name, limit in STILL_OVER.items() if lengths.get(name, 0) > limit}
    assert not grown, f"listed functions grew (listed, now): {grown}"


def test_the_list_names_functions_that_exist():
    lengths = function_lengths()
    missing = sorted(name for name in STILL_OVER if name not in lengths)
    assert not missing, f"listed functions no longer exist (drop their entries): {missing}"


def test_the_walk_measures_functions():
    lengths = function_lengths()
    assert lengths["pipeline.py:convert"] > 10  # the walk sees module functions
    assert "pipeline.py:ConversionResult.summary" in lengths  # and methods, by qualified name
