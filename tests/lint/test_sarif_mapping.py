"""SARIF that code scanning maps (issue 31, item 4), and report schemas that resolve by $id.

Locations are relative to the repository the model lives in (`uriBaseId` "%SRCROOT%", resolved
by `originalUriBaseIds`), so GitHub places a finding on the committed file; each result carries a
`partialFingerprints` entry that depends only on the check, the model's path in its repository and
the node, so the same finding in a later run (another checkout folder, another machine) is the
same alert, not a new one; each rule links to its section of docs/rules.md. The JSON report
schemas carry `$id`s and the check report's schema refers to the lint and validation schemas by
those ids, so plain `jsonschema.validate` with a registry of the schemas resolves it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import F16, init, model, tensor
from onnx import helper, save_model
from referencing import Registry, Resource

from autocast_onnx.cli.main import cli
from autocast_onnx.lint.report import DOCS_URL_ENV, sarif_dict

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SARIF_SCHEMA = ROOT / "reference" / "sarif-schema-2.1.0.json"
RESNET = ROOT / "examples" / "models" / "resnet_tiny.onnx"
FINGERPRINT = "autocastFinding/v1"


def softmax16():
    """An fp16 MatMul -> Softmax block: AC101 on the Softmax, AC302 on the fp16 output and AC402
    on the MatMul (N = 12); three findings on three nodes."""
    weight = (np.arange(144, dtype=np.float32).reshape(12, 12) / 144.0 - 0.5).astype(np.float16)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node("Softmax", ["h"], ["probs"], name="softmax", axis=-1),
    ]
    return model(nodes, [tensor("x", F16, [2, 12])], [tensor("probs", F16, [2, 12])], [init("w", weight)])


def repo_with_model(base: Path, rel: str = "models/attn.onnx", git: str = "dir") -> Path:
    """A checkout folder `base` (a `.git` folder, or a `.git` file as in a worktree) with the model
    at `rel`; returns the model's path."""
    base.mkdir(parents=True)
    if git == "dir":
        (base / ".git").mkdir()
    elif git == "file":
        (base / ".git").write_text("gitdir: /elsewhere/.git/worktrees/x\n")
    path = base / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(softmax16(), path)
    return path


def lint_sarif(*args, cwd: Path, monkeypatch) -> dict:
    monkeypatch.chdir(cwd)
    result = CliRunner().invoke(cli, ["lint", "--format", "sarif", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == 1, result.output  # AC101 is an error
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def sarif_validator():
    return jsonschema.Draft7Validator(json.loads(SARIF_SCHEMA.read_text(encoding="utf-8")))


def locations(sarif: dict) -> list[dict]:
    return [r["locations"][0]["physicalLocation"]["artifactLocation"] for r in sarif["runs"][0]["results"]]


def fingerprints(sarif: dict) -> list[str]:
    return [r["partialFingerprints"][FINGERPRINT] for r in sarif["runs"][0]["results"]]


# ---- locations ----------------------------------------------------------------------------------


def test_location_is_relative_to_the_repository_of_the_model(tmp_path, monkeypatch, sarif_validator):
    path = repo_with_model(tmp_path / "checkout")
    # run from a folder inside the repository: the root is the repository's, not the cwd
    sarif = lint_sarif(path, cwd=path.parent, monkeypatch=monkeypatch)
    sarif_validator.validate(sarif)
    [run] = sarif["runs"]
    assert run["originalUriBaseIds"] == {"%SRCROOT%": {"uri": (tmp_path / "checkout").as_uri() + "/"}}
    assert len(locations(sarif)) == 3
    for artifact in locations(sarif):
        assert artifact["uri"] == "models/attn.onnx" and artifact["uriBaseId"] == "%SRCROOT%"
    assert run["artifacts"] == [{"location": {"uri": "models/attn.onnx", "uriBaseId": "%SRCROOT%"}}]


def test_a_git_file_marks_the_root_too(tmp_path, monkeypatch):
    path = repo_with_model(tmp_path / "worktree", git="file")
    sarif = lint_sarif(path, cwd=tmp_path, monkeypatch=monkeypatch)
    assert {a["uri"] for a in locations(sarif)} == {"models/attn.onnx"}


def test_without_a_repository_the_root_is_the_current_folder(tmp_path, monkeypatch):
    path = repo_with_model(tmp_path / "plain", git="none")
    sarif = lint_sarif("models/attn.onnx", cwd=path.parents[1], monkeypatch=monkeypatch)
    assert sarif["runs"][0]["originalUriBaseIds"]["%SRCROOT%"]["uri"] == path.parents[1].as_uri() + "/"
    assert {(a["uri"], a["uriBaseId"]) for a in locations(sarif)} == {("models/attn.onnx", "%SRCROOT%")}


def test_a_model_outside_the_root_keeps_an_absolute_uri(tmp_path, monkeypatch, sarif_validator):
    path = repo_with_model(tmp_path / "plain", git="none")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sarif = lint_sarif(path, cwd=elsewhere, monkeypatch=monkeypatch)
    sarif_validator.validate(sarif)
    assert {a["uri"] for a in locations(sarif)} == {path.as_uri()}
    assert all("uriBaseId" not in a for a in locations(sarif))
    assert "originalUriBaseIds" not in sarif["runs"][0]  # no result refers to it


def test_a_path_with_spaces_is_percent_encoded(tmp_path, monkeypatch):
    path = repo_with_model(tmp_path / "checkout", rel="my models/attn 1.onnx")
    sarif = lint_sarif(path, cwd=tmp_path, monkeypatch=monkeypatch)
    assert {a["uri"] for a in locations(sarif)} == {"my%20models/attn%201.onnx"}


# ---- fingerprints -------------------------------------------------------------------------------


def test_fingerprints_are_the_same_in_two_checkouts(tmp_path, monkeypatch):
    first = repo_with_model(tmp_path / "run1" / "repo")
    second = repo_with_model(tmp_path / "elsewhere" / "run2")
    a = lint_sarif(first, cwd=tmp_path, monkeypatch=monkeypatch)
    b = lint_sarif("models/attn.onnx", cwd=second.parents[1], monkeypatch=monkeypatch)
    assert fingerprints(a) == fingerprints(b)
    assert len(set(fingerprints(a))) == 3, "three findings, three fingerprints"
    for fp in fingerprints(a):
        assert re.fullmatch(r"[0-9a-f]{64}", fp)


def test_fingerprint_value_is_pinned(tmp_path, monkeypatch):
    """Code scanning matches alerts by this value: a change re-opens every alert of every user.
    If the hash's inputs must change, change FINGERPRINT_KEY's version with it."""
    sarif = lint_sarif(repo_with_model(tmp_path / "r"), cwd=tmp_path, monkeypatch=monkeypatch)
    by_rule = {r["ruleId"]: r["partialFingerprints"] for r in sarif["runs"][0]["results"]}
    assert by_rule["AC101"] == {FINGERPRINT: "e411accdac6e2fd843461b34508ed1d017aaaa09407f6d4ec48ee30312eb088f"}


def test_fingerprints_follow_the_path_in_the_repository(tmp_path, monkeypatch):
    a = lint_sarif(repo_with_model(tmp_path / "a"), cwd=tmp_path, monkeypatch=monkeypatch)
    b = lint_sarif(repo_with_model(tmp_path / "b", rel="other/attn.onnx"), cwd=tmp_path, monkeypatch=monkeypatch)
    assert not set(fingerprints(a)) & set(fingerprints(b))


def test_fingerprint_ignores_the_message_and_keeps_rule_node_and_op(tmp_path, monkeypatch):
    """Built from the check, the node and its op type: a finding whose measured value (and so its
    message) changes stays the same alert; another node or check is another alert."""
    from autocast_onnx.diagnostics import Diagnostic

    monkeypatch.chdir(tmp_path)

    def fp(**kw):
        fields = {"code": "AC101", "name": "n", "severity": "error", "message": "m", "fix": "f"}
        fields |= {"node": "softmax", "op_type": "Softmax"}
        d = Diagnostic(**{**fields, **kw, "model": "attn.onnx"})
        return sarif_dict([d])["runs"][0]["results"][0]["partialFingerprints"][FINGERPRINT]

    assert fp() == fp(message="another message")
    assert len({fp(), fp(node="softmax_1"), fp(op_type="LogSoftmax"), fp(code="AC302")}) == 4


# ---- rules --------------------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, spaces to '-', punctuation dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def rules_md_anchors() -> set[str]:
    text = (DOCS / "rules.md").read_text(encoding="utf-8")
    return {github_anchor(line[3:]) for line in text.splitlines() if line.startswith("## ")}


def test_every_rule_links_to_its_section_of_the_rules_page(tmp_path, monkeypatch):
    monkeypatch.setenv(DOCS_URL_ENV, "https://github.com/owner/autocast-onnx/blob/v1.2/docs")
    sarif = lint_sarif(repo_with_model(tmp_path / "r"), cwd=tmp_path, monkeypatch=monkeypatch)
    anchors = rules_md_anchors()
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert len(rules) > 10
    for rule in rules:
        page, _, anchor = rule["helpUri"].partition("#")
        assert page == "https://github.com/owner/autocast-onnx/blob/v1.2/docs/rules.md", rule["helpUri"]
        assert anchor in anchors and anchor.startswith(rule["id"].lower() + "-"), rule["helpUri"]
        assert rule["fullDescription"]["text"]


def test_without_a_docs_url_the_help_text_names_the_section(tmp_path, monkeypatch):
    """SARIF's helpUri must be absolute (code scanning rejects the upload of a relative one): with
    no known URL the rule has none, and its help text names the section of docs/rules.md."""
    monkeypatch.delenv(DOCS_URL_ENV, raising=False)
    sarif = lint_sarif(repo_with_model(tmp_path / "r"), cwd=tmp_path, monkeypatch=monkeypatch)
    anchors = rules_md_anchors()
    for rule in sarif["runs"][0]["tool"]["driver"]["rules"]:
        assert "helpUri" not in rule
        named = re.search(r"\(autocast-onnx docs/rules\.md#([a-z0-9-]+)\)$", rule["help"]["text"])
        assert named and named.group(1) in anchors, rule["help"]["text"]


@pytest.mark.parametrize("url", ["docs/", "ftp://host/docs/", "https://"])
def test_a_docs_url_that_is_not_absolute_is_refused(tmp_path, monkeypatch, url):
    monkeypatch.setenv(DOCS_URL_ENV, url)
    path = repo_with_model(tmp_path / "r")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["lint", "--format", "sarif", str(path)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"autocast-onnx: error: {DOCS_URL_ENV}: ") and "absolute" in line, line


# ---- report schemas by $id ----------------------------------------------------------------------


def schemas() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DOCS.glob("*.schema.json"))}


def test_every_report_schema_has_a_distinct_id():
    ids = [s.get("$id") for s in schemas().values()]
    assert all(isinstance(i, str) and i.startswith("urn:autocast-onnx:schema:") for i in ids), ids
    assert len(set(ids)) == len(ids)


def test_check_schema_refers_to_the_others_by_id_only():
    """No reference by file name: it would resolve against the check schema's $id, not the file."""
    text = (DOCS / "check-report.schema.json").read_text(encoding="utf-8")
    refs = set(re.findall(r'"\$ref":\s*"([^"#]*)', text)) - {""}
    by_name = schemas()
    assert refs == {by_name["lint-report.schema.json"]["$id"], by_name["validate-report.schema.json"]["$id"]}


def test_a_real_check_report_validates_with_plain_jsonschema_and_a_registry(tmp_path):
    report_path = tmp_path / "check.json"
    result = CliRunner().invoke(
        cli, ["check", str(RESNET), "--no-speed", "--batches", "1", "--report-json", str(report_path)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(report_path.read_text())
    assert report["validation"] is not None and report["lint_converted"]["diagnostics"]
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas().values())
    check_schema = schemas()["check-report.schema.json"]
    jsonschema.validate(report, check_schema, registry=registry)
    # the references are followed: a lint finding that breaks the lint schema fails the check schema
    report["lint_converted"]["diagnostics"][0]["severity"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, check_schema, registry=registry)


def test_copy_of_the_repository_gives_the_same_sarif_text_but_the_root(tmp_path, monkeypatch):
    """Two checkouts of one repository give byte-identical SARIF once the root URI is replaced."""
    first = repo_with_model(tmp_path / "one")
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    a = json.dumps(lint_sarif(first, cwd=tmp_path, monkeypatch=monkeypatch))
    b = json.dumps(lint_sarif(tmp_path / "two" / "models" / "attn.onnx", cwd=tmp_path, monkeypatch=monkeypatch))
    assert a.replace((tmp_path / "one").as_uri(), "ROOT") == b.replace((tmp_path / "two").as_uri(), "ROOT")
