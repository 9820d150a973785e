"""SARIF locations that hold (issue 36, defect 7): a model in a git submodule is located in its
superproject's tree, whichever model comes first, and a file name that is not UTF-8 is
percent-encoded byte by byte instead of ending in exit 3 (UnicodeEncodeError)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote_to_bytes, urlparse

import jsonschema
import onnx
import pytest
from helpers import F16, model, tensor
from onnx import helper

# whole-process tests: each runs the command line in a process of its own
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "reference" / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))


def fp16_softmax(path: Path) -> Path:
    """An fp16 Softmax: lint finds AC101 on it."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1)]
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model(nodes, [tensor("x", F16, [2, 12])], [tensor("y", F16, [2, 12])]), path)
    return path


def sarif_of(*args, cwd: Path) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "lint", *map(str, args), "--format", "sarif"],
        cwd=cwd,
        capture_output=True,
    )
    assert result.returncode == 1, result.stderr
    sarif = json.loads(result.stdout)
    jsonschema.Draft7Validator(SCHEMA).validate(sarif)
    return sarif


def located(sarif: dict) -> list[tuple[str | None, bytes]]:
    """Each artifact's (uriBaseId, the path bytes its URI names: relative under the base, or the
    whole absolute path of a file URI)."""
    out = []
    for artifact in sarif["runs"][0]["artifacts"]:
        location = artifact["location"]
        uri = location["uri"]
        out.append((location.get("uriBaseId"), unquote_to_bytes(urlparse(uri).path if ":" in uri else uri)))
    return out


def superproject_with_submodule(tmp_path: Path) -> tuple[Path, Path, Path]:
    """SUPER (a .git folder) with a submodule checked out at SUPER/vendor/sub (a .git file naming
    SUPER/.git/modules/sub, as git writes it); a model in each."""
    top = tmp_path / "super"
    (top / ".git" / "modules" / "sub").mkdir(parents=True)
    sub = top / "vendor" / "sub"
    sub.mkdir(parents=True)
    (sub / ".git").write_text("gitdir: ../../.git/modules/sub\n")
    return top, fp16_softmax(sub / "m" / "in_sub.onnx"), fp16_softmax(top / "models" / "own.onnx")


@pytest.mark.parametrize("order", ["submodule first", "superproject first"])
def test_a_model_in_a_submodule_is_located_in_the_superproject(tmp_path, order):
    """Minimal reproduction: with the submodule's model named first, the submodule's folder
    became %SRCROOT% and every other model of the repository got an absolute file URI."""
    top, in_sub, own = superproject_with_submodule(tmp_path)
    models = [in_sub, own] if order == "submodule first" else [own, in_sub]
    sarif = sarif_of(*models, cwd=tmp_path)
    run = sarif["runs"][0]
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": top.as_uri() + "/"}}
    expected = {in_sub: b"vendor/sub/m/in_sub.onnx", own: b"models/own.onnx"}
    assert located(sarif) == [("%SRCROOT%", expected[m]) for m in models]


def test_a_worktree_is_its_own_top_level(tmp_path):
    """A `.git` file that names a worktree's git folder (not a submodule's) is the top level."""
    tree = tmp_path / "wt"
    tree.mkdir()
    (tree / ".git").write_text(f"gitdir: {tmp_path / 'main' / '.git' / 'worktrees' / 'wt'}\n")
    (tmp_path / ".git").mkdir()  # a repository further up is not this checkout's
    m = fp16_softmax(tree / "models" / "a.onnx")
    sarif = sarif_of(m, cwd=tmp_path)
    assert sarif["runs"][0]["originalUriBaseIds"] == {"%SRCROOT%": {"uri": tree.as_uri() + "/"}}
    assert located(sarif) == [("%SRCROOT%", b"models/a.onnx")]


def test_a_submodule_without_its_superproject_checked_out_is_its_own_top_level(tmp_path):
    """A .git file naming a modules folder that does not hold the checkout: no superproject."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / ".git").write_text(f"gitdir: {tmp_path / 'elsewhere' / '.git' / 'modules' / 'sub'}\n")
    m = fp16_softmax(sub / "a.onnx")
    assert located(sarif_of(m, cwd=tmp_path)) == [("%SRCROOT%", b"a.onnx")]


@pytest.mark.parametrize("inside", [True, False])
def test_a_file_name_that_is_not_utf8(tmp_path, inside):
    """Minimal reproduction: `lint m\\xff.onnx --format sarif` ended in exit 3 (UnicodeEncodeError
    in the URI and the fingerprint); text and JSON worked. Inside the repository the relative URI,
    outside it (another repository's model named first) the file URI, each percent-encodes the
    byte."""
    (tmp_path / "repo" / ".git").mkdir(parents=True)
    m = fp16_softmax(tmp_path / ("repo" if inside else "outside") / os.fsdecode(b"m\xff \xfe.onnx"))
    first = [] if inside else [fp16_softmax(tmp_path / "repo" / "first.onnx")]
    sarif = sarif_of(*first, m, cwd=tmp_path)
    base, path = located(sarif)[-1]
    if inside:
        assert (base, path) == ("%SRCROOT%", b"m\xff \xfe.onnx")
    else:
        assert base is None and path == os.fsencode(str(m))
    assert all(a["location"]["uri"].isascii() for a in sarif["runs"][0]["artifacts"])
    assert all(len(r["partialFingerprints"]["autocastFinding/v1"]) == 64 for r in sarif["runs"][0]["results"])


def test_check_writes_sarif_for_a_file_name_that_is_not_utf8(tmp_path):
    m = fp16_softmax(tmp_path / os.fsdecode(b"c\xff.onnx"))
    result = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "check", str(m), "--no-validate", "--sarif", str(tmp_path / "o.sarif")],
        cwd=tmp_path,
        capture_output=True,
    )
    assert result.returncode in (0, 1), result.stderr
    sarif = json.loads((tmp_path / "o.sarif").read_text(encoding="utf-8"))
    jsonschema.Draft7Validator(SCHEMA).validate(sarif)
