"""tools/add_check.py, the lint-check scaffold, run on a copy of the repository (never on this one).

The copy holds what the scaffold edits and what its results need to run: the package, rules/,
docs/rules.md and the lint test files. Everything in the copy runs in a subprocess with
PYTHONPATH (and the working directory) set to the copy, so the copy's package is imported, not
the editable install of this checkout; a test checks that it is."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

# whole-process tests: the scaffold and what it wrote run in processes of their own
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "add_check.py"
COPIED = [
    "autocast_onnx",
    "rules",
    "pyproject.toml",
    "docs/rules.md",
    "tests/conftest.py",
    "tests/helpers.py",
    "tests/stand_in_helpers.py",  # conftest.py's check of every conversion's stand-in
    "tests/lint_helpers.py",
    "tests/lint/test_lint_checks.py",
    "tests/contracts/test_rules_doc.py",
]
NEW = ["--code", "AC405", "--name", "some-kebab-name", "--severity", "warning", "--summary", "One line."]


def make_copy(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for rel in COPIED:
        src, dst = ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    assert dest.resolve() != ROOT
    return dest


def env_for(copy: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(copy)
    env.pop("AUTOCAST_ONNX_UPDATE_GOLDEN", None)
    return env


def scaffold(copy: Path, *args: str) -> subprocess.CompletedProcess:
    assert copy.resolve() != ROOT, "the scaffold never runs on the real repository in tests"
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--root", str(copy)],
        check=False,
        cwd=copy,
        env=env_for(copy),
        capture_output=True,
        text=True,
        timeout=120,
    )


def in_copy(copy: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        cwd=copy,
        env=env_for(copy),
        capture_output=True,
        text=True,
        timeout=120,
    )


def snapshot(copy: Path) -> dict:
    return {
        str(p.relative_to(copy)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(copy.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory):
    copy = make_copy(tmp_path_factory.mktemp("scaffolded"))
    before = snapshot(copy)
    proc = scaffold(copy, *NEW)
    assert proc.returncode == 0, proc.stderr
    return copy, proc, before


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return make_copy(tmp_path_factory.mktemp("pristine"))


# ---- a new check with a new kind ------------------------------------------------------------------
def test_scaffold_edits_the_four_files_and_says_so(scaffolded):
    copy, proc, before = scaffolded
    assert proc.stderr == ""
    out = proc.stdout
    for rel in ("rules/lint.toml", "autocast_onnx/lint/checks.py", "tests/lint/test_lint_checks.py", "docs/rules.md"):
        assert rel in out
    assert "AC405" in out and "test_ac405_bad" in out
    after = snapshot(copy)
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {
        "rules/lint.toml",
        "autocast_onnx/lint/checks.py",
        "tests/lint/test_lint_checks.py",
        "docs/rules.md",
    }


LOAD = """
import json, sys
import autocast_onnx
import autocast_onnx.lint.checks as checks
from autocast_onnx.lint.catalog import load_checks
found = load_checks(sys.argv[1])
c = next(c for c in found if c.code == "AC405")
stub = getattr(checks, "some_kebab_name", None)
print(json.dumps({
    "package": autocast_onnx.__file__,
    "order": [x.code for x in found],
    "default": [x.code for x in load_checks()],
    "entry": {"name": c.name, "severity": c.severity, "kind": c.kind, "summary": c.summary, "why": c.why,
              "fix": c.fix, "example": c.example, "params": c.params},
    "registered": stub is not None and checks.KINDS.get("some-kebab-name") is stub,
    "findings": list(stub(None, None)) if stub else None,
    "doc": stub.__doc__ if stub else None,
}))
"""


def test_catalog_of_the_copy_loads_the_entry_and_the_registered_stub(scaffolded):
    copy = scaffolded[0]
    proc = in_copy(copy, LOAD, str(copy / "rules" / "lint.toml"))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert Path(got["package"]).resolve().is_relative_to(copy.resolve()), got["package"]
    assert got["entry"]["name"] == "some-kebab-name"
    assert got["entry"]["severity"] == "warning"
    assert got["entry"]["kind"] == "some-kebab-name"
    assert got["entry"]["summary"] == "One line"  # docs/rules.md adds the period
    for key in ("why", "fix", "example"):
        assert got["entry"][key].startswith("TODO"), key
    assert got["entry"]["params"] == {}
    # in code order: right after AC404, before the AC5xx checks and AC901; the package's own
    # catalog path is the copy's
    order = got["order"]
    assert order[order.index("AC404") + 1] == "AC405" and order[order.index("AC405") + 1] == "AC501"
    assert order[-1] == "AC901"
    assert got["default"] == got["order"]
    assert got["registered"] is True
    assert got["findings"] == []
    assert "TODO(AC405" in got["doc"]


def test_docs_of_the_copy_mention_the_new_check(scaffolded):
    text = (scaffolded[0] / "docs" / "rules.md").read_text(encoding="utf-8")
    assert "| [AC405](#ac405-some-kebab-name) | some-kebab-name | warning | One line |" in text
    assert "## AC405 some-kebab-name" in text
    assert "**One line.** Severity: warning." in text


def test_generated_bad_case_fails_and_the_rest_passes(scaffolded, tmp_path):
    copy = scaffolded[0]
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "tests/contracts/test_rules_doc.py",
            "tests/lint/test_lint_checks.py",
            "-k",
            "ac405 or rules",
        ],
        check=False,
        cwd=copy,
        env=env_for(copy),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        results[case.get("name")] = None if failure is None else failure.get("message", "")
    assert "TODO(AC405)" in results.pop("test_ac405_bad"), "the scaffold's bad case must fail until implemented"
    # The good case passes: the copy's catalog (with AC405) was loaded, not this checkout's.
    assert results.pop("test_ac405_good") is None
    # docs/rules.md in the copy is in sync with the copy's catalog.
    assert results and all(message is None for message in results.values()), results


# ---- a new check reusing an existing kind -------------------------------------------------------
def test_existing_kind_adds_no_stub(tmp_path):
    copy = make_copy(tmp_path / "repo")
    checks_before = (copy / "autocast_onnx" / "lint" / "checks.py").read_bytes()
    proc = scaffold(
        copy,
        "--code",
        "AC107",
        "--name",
        "exp-in-half",
        "--severity",
        "error",
        "--summary",
        "Exp in fp16",
        "--kind",
        "op-family",
    )
    assert proc.returncode == 0, proc.stderr
    assert (copy / "autocast_onnx" / "lint" / "checks.py").read_bytes() == checks_before
    assert "unchanged" in proc.stdout
    lint = (copy / "rules" / "lint.toml").read_text(encoding="utf-8")
    entry = lint[lint.index('code = "AC107"') : lint.index('code = "AC201"')]
    assert 'kind = "op-family"' in entry and "# TODO: the parameters of kind 'op-family'" in entry
    assert lint.index('code = "AC106"') < lint.index('code = "AC107"') < lint.index('code = "AC201"')
    tests = (copy / "tests" / "lint" / "test_lint_checks.py").read_text(encoding="utf-8")
    assert "def test_ac107_bad():" in tests and "def test_ac107_good():" in tests
    assert "## AC107 exp-in-half" in (copy / "docs" / "rules.md").read_text(encoding="utf-8")


def test_a_failing_docs_run_restores_every_file(tmp_path):
    copy = make_copy(tmp_path / "repo")
    (copy / "autocast_onnx" / "__main__.py").write_text('raise SystemExit("rules command broken")\n')
    before = snapshot(copy)
    proc = scaffold(copy, *NEW)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and "rules command broken" in proc.stderr
    assert "nothing was changed" in proc.stderr
    assert snapshot(copy) == before


# ---- refusals ---------------------------------------------------------------------------------------
BAD = {
    "duplicate-code": (["--code", "AC101"], "already used"),
    "code-format": (["--code", "AC1011"], "AC123"),
    "name-not-kebab": (["--name", "Some_Name"], "kebab-case"),
    "duplicate-name": (["--name", "softmax-in-low-precision"], "AC101"),
    "severity": (["--severity", "fatal"], "info, warning, error"),
    "kind-not-kebab": (["--kind", "New_Kind"], "kebab-case"),
    "name-is-an-existing-kind": (["--name", "alignment"], "--kind alignment"),
    "kind-shadows-a-function": (["--kind", "constant-array"], "constant_array"),
    "empty-summary": (["--summary", " "], "--summary"),
    "unknown-option": (["--bogus"], "--bogus"),
}


def with_overrides(overrides):
    args = list(NEW)
    extra = []
    for i in range(0, len(overrides), 2):
        if overrides[i] in args:
            args[args.index(overrides[i]) + 1] = overrides[i + 1]
        else:
            extra += overrides[i : i + 2]
    return args + extra


@pytest.mark.parametrize("case", list(BAD))
def test_bad_arguments_exit_2_with_one_line_and_change_nothing(pristine, case):
    overrides, words = BAD[case]
    before = snapshot(pristine)
    proc = scaffold(pristine, *with_overrides(overrides))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("add_check.py: error: "), proc.stderr
    assert words in lines[0]
    assert snapshot(pristine) == before


def test_missing_argument_exits_2(pristine):
    before = snapshot(pristine)
    proc = scaffold(pristine, "--code", "AC405")
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and "required" in proc.stderr
    assert snapshot(pristine) == before


@pytest.fixture()
def module():
    spec = importlib.util.spec_from_file_location("add_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_retired_codes_from_the_git_history_are_refused(module, pristine, monkeypatch, capsys):
    history = '@@ -1 +1 @@\n-code = "AC499"\n+code = "AC101"\n'
    assert module.retired_codes(history, {"AC101"}) == {"AC499"}
    assert module.git_history(pristine) == ""  # not a git work tree: no history, no crash
    monkeypatch.setattr(module, "git_history", lambda root: history)
    before = snapshot(pristine)
    assert module.main(with_overrides(["--code", "AC499", "--root", str(pristine)])) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "retired" in err
    assert snapshot(pristine) == before


def test_default_root_is_the_repository_holding_the_script(module):
    assert module.parse_args(NEW).root == ROOT
