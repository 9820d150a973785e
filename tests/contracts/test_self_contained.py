"""The repository needs nothing beside it: no tracked file refers to a folder outside the
checkout (such as a sibling folder of shared data), and every file the tests read from reference/ is there.

Regression for: the README's test command failed in a fresh clone because the SARIF schema and
the op table were read from a reference folder beside the checkout rather than inside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# A path that climbs out of the repository to the sibling folder of shared data, written any of the
# usual ways. The folder's name is assembled so that this file does not match itself.
SIBLING = "sha" + "red"
OUTSIDE = re.compile(rf"\.\./{SIBLING}|parents\[2\]\s*/\s*[\"']{SIBLING}|ROOT\.parent\s*/\s*[\"']{SIBLING}")


SKIP_DIRS = {
    ".git",
    ".venv",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "__pycache__",
    "build",
    "dist",
}


def tracked_files() -> list[Path]:
    """The files git tracks; outside a git checkout (an unpacked sdist), every file of the tree
    but caches and environments."""
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def test_no_tracked_file_refers_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".yml", ".cfg", ".txt", "") or not path.is_file():
            continue
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for k, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{k}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("name", ["onnx_op_categories.csv", "sarif-schema-2.1.0.json", "README.md"])
def test_reference_files_are_vendored(name):
    path = ROOT / "reference" / name
    assert (path.is_file() and path.stat().st_size > 1000) or (name == "README.md" and path.is_file())


def test_pattern_catches_a_sibling_reference():
    assert OUTSIDE.search(f'Path(__file__).resolve().parents[2] / "{SIBLING}" / "reference"')
    assert OUTSIDE.search(f"see ../{SIBLING}/reference/table.csv")
    assert not OUTSIDE.search("reference/sarif-schema-2.1.0.json")
