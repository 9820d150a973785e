"""onnxconverter-common's own float16 and auto-mixed-precision test files, run against the
drop-ins of autocast_onnx.compat.

tests/upstream/onnxconverter-common holds those files and the two models they read, byte for
byte, at the commit whose package is the onnxconverter-common 1.16.0 wheel (SOURCE.json names it
and the SHA-256 of each file; the first test holds the copy to it). The files run twice, each in
a copy of that folder in a temporary directory, in their own pytest process: once as they are
(the peer), once with a conftest.py that puts the drop-ins in place of the peer's functions
before the test modules import them (onnxconverter_common.float16.convert_float_to_float16,
auto_mixed_precision.auto_convert_mixed_precision,
auto_mixed_precision_model_path.auto_convert_mixed_precision_model_path) and counts their calls.
Every test that passes with the peer must pass with the drop-ins, but those in DIFFERENT, each
with the reason the drop-in does otherwise (none today).

Like tests/compat/test_compat_peers.py these need the peer installed: .ci/run runs them in .venv-peers
(`pip install -e ".[peers-test]"`, which adds onnxmltools: the test files load their models
with it), and they skip elsewhere with that reason.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip(
    "onnxconverter_common.float16",
    reason="needs onnxconverter-common, kept out of the project's dependencies: .ci/run runs these in .venv-peers",
)
pytest.importorskip("onnxmltools", reason="the upstream test files import onnxmltools: .venv-peers has it")

# slow: the peer's own test files run in a pytest process of their own
pytestmark = [pytest.mark.slow, pytest.mark.peers]

UPSTREAM = Path(__file__).resolve().parents[1] / "upstream" / "onnxconverter-common"
TEST_FILES = ["test_float16.py", "test_auto_mixed_precision.py", "test_auto_mixed_precision_model_path.py"]
# upstream test id -> why the drop-in does not pass it though the peer does (none today)
DIFFERENT: dict[str, str] = {}
# the peer's functions the drop-ins replace, and the drop-in for each
SUBSTITUTED = {
    "onnxconverter_common.float16.convert_float_to_float16": "convert_float_to_float16",
    "onnxconverter_common.auto_mixed_precision.auto_convert_mixed_precision": "auto_convert_mixed_precision",
    "onnxconverter_common.auto_mixed_precision_model_path.auto_convert_mixed_precision_model_path": (
        "auto_convert_mixed_precision_model_path"
    ),
}

CONFTEST = '''"""Written by autocast-onnx's tests/compat/test_compat_upstream.py: the drop-ins in place of the
peer's functions, imported before the test modules, each call counted."""
import importlib
import json
import os

from autocast_onnx import compat

SUBSTITUTED = {substituted!r}
CALLS = dict.fromkeys(SUBSTITUTED, 0)


def _counted(name, function):
    def call(*args, **kwargs):
        CALLS[name] += 1
        return function(*args, **kwargs)

    return call


for where, ours in SUBSTITUTED.items():
    module, _, attribute = where.rpartition(".")
    setattr(importlib.import_module(module), attribute, _counted(where, getattr(compat, ours)))


def pytest_sessionfinish(session):
    with open(os.environ["AUTOCAST_UPSTREAM_CALLS"], "w") as fh:
        json.dump(CALLS, fh)
'''


def upstream_tests() -> list[str]:
    """The ids (file::Class::method) of the upstream test files' tests, read from their source."""
    ids = []
    for name in TEST_FILES:
        tree = ast.parse((UPSTREAM / "tests" / name).read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            ids += [
                f"{name}::{cls.name}::{f.name}"
                for f in cls.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
            ]
    return ids


def run_upstream(folder: Path, with_drop_ins: bool) -> tuple[dict[str, str], dict | None, str]:
    """Run the upstream test files in a copy of them under `folder`: (test id -> passed, failed or
    skipped; the drop-ins' call counts, None for the peer's run; pytest's output)."""
    work = folder / ("drop-ins" if with_drop_ins else "peer")
    shutil.copytree(UPSTREAM, work)
    (work / "pytest.ini").write_text("[pytest]\n")  # its own root: none of the project's settings
    env = dict(os.environ)
    calls = folder / "calls.json"
    if with_drop_ins:
        (work / "tests" / "conftest.py").write_text(CONFTEST.format(substituted=SUBSTITUTED))
        env["AUTOCAST_UPSTREAM_CALLS"] = str(calls)
    report = work / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "tests"]
    # the timeout only keeps a hang from stalling the suite; what is asserted is each test's outcome
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        file = case.get("classname", "").split(".")[-2] + ".py"
        test_id = f"{file}::{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[test_id] = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    counted = json.loads(calls.read_text()) if with_drop_ins else None
    return outcomes, counted, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upstream")
    return {"peer": run_upstream(folder, False), "drop-ins": run_upstream(folder, True)}


def test_the_upstream_files_are_the_pinned_ones():
    """Each copied file is byte for byte the one SOURCE.json names (its SHA-256), and nothing else
    is in the folder."""
    source = json.loads((UPSTREAM / "SOURCE.json").read_text())
    found = {
        str(p.relative_to(UPSTREAM)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(UPSTREAM.rglob("*"))
        if p.is_file() and p.name != "SOURCE.json"
    }
    assert found == source["files"]
    assert len(source["commit"]) == 40


def test_every_upstream_test_ran_in_both(runs):
    expected = set(upstream_tests())
    assert len(expected) >= 9
    for name, (outcomes, _, output) in runs.items():
        assert set(outcomes) == expected, (name, output)


def test_the_drop_ins_were_the_ones_called(runs):
    """Each substituted function was called through its drop-in (else the run tested the peer)."""
    _, counted, output = runs["drop-ins"]
    assert counted is not None and all(counted[where] > 0 for where in SUBSTITUTED), (counted, output)


@pytest.mark.parametrize("test_id", upstream_tests())
def test_what_passes_with_the_peer_passes_with_the_drop_ins(runs, test_id):
    peer, _, _ = runs["peer"]
    ours, _, our_output = runs["drop-ins"]
    if peer[test_id] != "passed":
        pytest.skip(f"the peer itself does not pass it here ({peer[test_id]}): nothing to hold the drop-in to")
    if test_id in DIFFERENT:
        assert ours[test_id] == "failed", (
            f"listed as different ({DIFFERENT[test_id]}) but passes: drop it from DIFFERENT"
        )
        return
    assert ours[test_id] == "passed", our_output
