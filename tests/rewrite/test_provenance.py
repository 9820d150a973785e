"""The provenance record (issue 31, item 6): every converted model carries, in metadata_props
under the "autocast_onnx." prefix, the tool's version, the precision, the sha256 of each rule
file the plan was made with (the default profile included) and the plan's model fingerprint;
converting a converted model replaces the record, and lint and explain show it."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx._version import __version__
from autocast_onnx.catalog.loader import default_rules_path
from autocast_onnx.cli.main import cli

KEYS = (
    "autocast_onnx.version",
    "autocast_onnx.precision",
    "autocast_onnx.rules",
    "autocast_onnx.plan",
    "autocast_onnx.runtime",
)


def small():
    return parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            [fc] h = MatMul(x, w)
            [act] y = Relu(h)
        }""",
        w=randn([8, 8]),
    )


def props(model: onnx.ModelProto) -> dict:
    return {p.key: p.value for p in model.metadata_props}


def sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_converted_model_records_version_precision_rules_and_plan(tmp_path):
    rules = tmp_path / "mine.toml"
    rules.write_text('[[nodes]]\nmatch = "^act$"\nprecision = "fp32"\nwhy = "kept"\n')
    result = autocast_onnx.convert(small(), precision="bf16", rules=[str(rules)])
    record = props(result.model)
    assert record["autocast_onnx.version"] == __version__
    assert record["autocast_onnx.precision"] == "bf16"
    assert record["autocast_onnx.plan"] == result.plan.fingerprint and len(record["autocast_onnx.plan"]) == 32
    assert json.loads(record["autocast_onnx.rules"]) == [
        {"file": "rules/default.toml", "sha256": sha256(default_rules_path())},
        {"file": str(rules), "sha256": sha256(rules)},
    ]


def test_rule_digest_follows_the_file_bytes(tmp_path):
    rules = tmp_path / "mine.toml"
    rules.write_text('[[nodes]]\nmatch = "^act$"\nprecision = "fp32"\nwhy = "kept"\n')
    first = json.loads(props(autocast_onnx.convert(small(), rules=[str(rules)]).model)["autocast_onnx.rules"])
    rules.write_text('[[nodes]]\nmatch = "^act$"\nprecision = "fp32"\nwhy = "kept fp32"\n')
    second = json.loads(props(autocast_onnx.convert(small(), rules=[str(rules)]).model)["autocast_onnx.rules"])
    assert first[0] == second[0] and first[1]["sha256"] != second[1]["sha256"]


def test_converting_a_converted_model_again_keeps_one_record(tmp_path):
    # a conversion that changes the model replaces the record: the plan is the new input's
    once = autocast_onnx.convert(small(), exclude_ops=["Relu"]).model
    once.metadata_props.add(key="owner", value="kept")
    result = autocast_onnx.convert(once)
    twice = result.model
    keys = [p.key for p in twice.metadata_props]
    assert keys == ["owner", *KEYS]  # one record, after the model's own entries
    assert props(twice)["owner"] == "kept"
    assert props(twice)["autocast_onnx.plan"] == result.plan.fingerprint != props(once)["autocast_onnx.plan"]
    # one that changes nothing keeps the record that says how the model was made: the same bytes
    thrice = autocast_onnx.convert(twice)
    assert thrice.stats.casts_added == 0
    assert thrice.model.SerializeToString() == twice.SerializeToString()


def test_cli_output_file_carries_the_record_and_only_it_differs_from_a_plain_conversion(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small(), path)
    assert invoke("convert", path, "-o", tmp_path / "out.onnx", "-q").exit_code == 0
    written = onnx.load(tmp_path / "out.onnx")
    assert set(KEYS) <= set(props(written))
    del written.metadata_props[:]
    plain = autocast_onnx.convert(small()).model
    del plain.metadata_props[:]
    assert written.SerializeToString() == plain.SerializeToString()


def test_replayed_plan_file_carries_the_digests_into_the_same_record(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small(), path)
    assert invoke("convert", path, "-o", tmp_path / "a.onnx", "--plan-out", tmp_path / "p.json", "-q").exit_code == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["rule_files"] == ["rules/default.toml"] and plan["rule_sha256"] == [sha256(default_rules_path())]
    assert invoke("convert", path, "-o", tmp_path / "b.onnx", "--plan", tmp_path / "p.json", "-q").exit_code == 0
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    # a plan file without them (written before they were recorded) replays with null digests
    del plan["rule_sha256"]
    (tmp_path / "old.json").write_text(json.dumps(plan))
    assert invoke("convert", path, "-o", tmp_path / "c.onnx", "--plan", tmp_path / "old.json", "-q").exit_code == 0
    c = props(onnx.load(tmp_path / "c.onnx"))
    assert json.loads(c["autocast_onnx.rules"]) == [{"file": "rules/default.toml", "sha256": None}]


@pytest.mark.parametrize(
    "digests, message",
    [
        (["ab"] * 2, '"rule_sha256" has 2 entries for 1 "rule_files"'),
        (["xyz"], "\"rule_sha256[0]\": expected 64 hex digits, got 'xyz'"),
        ([5], '"rule_sha256[0]": expected a string, got 5'),
    ],
)
def test_a_plan_file_with_bad_digests_is_refused_in_one_line(tmp_path, digests, message):
    path = tmp_path / "m.onnx"
    onnx.save(small(), path)
    assert invoke("convert", path, "-o", tmp_path / "a.onnx", "--plan-out", tmp_path / "p.json", "-q").exit_code == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["rule_sha256"] = digests
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    result = invoke("convert", path, "-o", tmp_path / "b.onnx", "--plan", tmp_path / "bad.json")
    assert result.exit_code == 2 and not (tmp_path / "b.onnx").exists()
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"autocast-onnx: error: {tmp_path / 'bad.json'}: {message}")


@pytest.fixture
def converted(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small(), path)
    out = tmp_path / "m.fp16.onnx"
    assert invoke("convert", path, "-o", out, "-q").exit_code == 0
    return path, out


def test_lint_text_and_json_show_the_record(converted):
    source, out = converted
    fingerprint = props(onnx.load(out))["autocast_onnx.plan"]
    text = invoke("lint", out).stdout
    line = next(x for x in text.splitlines() if "converted by autocast-onnx" in x)
    assert f"{out}: converted by autocast-onnx {__version__} to fp16" in line
    assert f"plan {fingerprint}" in line and "rules/default.toml" in line
    report = json.loads(invoke("lint", out, "--format", "json").stdout)
    record = report["models"][0]["provenance"]
    assert record["version"] == __version__ and record["precision"] == "fp16" and record["plan"] == fingerprint
    assert record["rules"][0]["file"] == "rules/default.toml"
    # a model that was not converted by the tool has no record: no line, a null
    plain = json.loads(invoke("lint", source, "--format", "json").stdout)
    assert plain["models"][0]["provenance"] is None
    assert "converted by autocast-onnx" not in invoke("lint", source).stdout


def test_lint_json_with_the_record_matches_the_schema(converted):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the report against its schema")
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "lint-report.schema.json").read_text())
    report = json.loads(invoke("lint", converted[1], "--format", "json").stdout)
    jsonschema.validate(report, schema)


def test_explain_shows_the_record(converted):
    source, out = converted
    text = invoke("explain", out, "fc").stdout
    assert text.splitlines()[0].startswith(f"{out}: converted by autocast-onnx {__version__} to fp16")
    assert "converted by autocast-onnx" not in invoke("explain", source, "fc").stdout


def test_a_malformed_record_is_shown_as_it_is_not_a_crash(tmp_path):
    m = small()
    m.metadata_props.add(key="autocast_onnx.rules", value="not json")
    m.metadata_props.add(key="autocast_onnx.version", value="9.9")
    path = tmp_path / "odd.onnx"
    onnx.save(m, path)
    result = invoke("lint", path, "--format", "json")
    assert result.exit_code in (0, 1)
    expected = {"version": "9.9", "precision": None, "rules": "not json", "plan": None, "runtime": None}
    assert json.loads(result.stdout)["models"][0]["provenance"] == expected
