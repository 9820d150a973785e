"""Hostile provenance metadata (issue 36, defect 4): the `autocast_onnx.*` entries of a model's
metadata_props are the model's, so anything at all: JSON nested 100,000 deep, a value of
hundreds of thousands of characters, bytes that are not UTF-8, JSON of the wrong shape, control
characters. lint, explain, check and convert used to end in exit 3 on the first (RecursionError
while reading the rules list) and on bytes (lint --format json), and printed the model's text
raw. Now a record that cannot be read is a warning where the record is shown (lint's text report,
explain) or where the conversion's warnings are (convert, check), every command carries on, a
conversion replaces the record with a valid one of its own, and what describe() prints of the
model's text is escaped.

The CLI runs in process (bad_input_helpers.invoke)."""

from __future__ import annotations

import json

import onnx
import pytest
from bad_input_helpers import assert_ok, invoke, isolated_cwd, small_model, write_model

import autocast_onnx
from autocast_onnx._version import __version__
from autocast_onnx.rewrite import provenance

isolated = pytest.fixture(autouse=True)(isolated_cwd)

RULES = "autocast_onnx.rules"
# every value below is one that a record cannot hold: (id, key, value); bytes are written raw, so
# that protobuf reads them back as the bytes that are not UTF-8
HOSTILE = [
    ("open-brackets-100000", RULES, "[" * 100000),
    ("nested-lists-5000", RULES, "[" * 5000 + "]" * 5000),
    ("nested-objects-5000", RULES, '{"a":' * 5000 + "1" + "}" * 5000),
    ("open-brackets-5000", RULES, "[" * 5000),
    ("digits-50000", RULES, "1" * 50000),
    ("object-not-list", RULES, '{"file": "rules/default.toml", "sha256": null}'),
    ("file-of-wrong-type", RULES, '[{"file": 5, "sha256": null}]'),
    ("list-of-numbers", RULES, "[1, 2, 3]"),
    ("not-json", RULES, "not json"),
    ("rules-not-utf8", RULES, b"\xff\xfe[\x80"),
    ("version-not-utf8", "autocast_onnx.version", b"\xed\xa0\x80\xc3"),
    ("version-of-200000", "autocast_onnx.version", "9" * 200000),
    ("plan-of-100000-newlines", "autocast_onnx.plan", "\n" * 100000),
]
IDS = [case[0] for case in HOSTILE]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _entry(key: bytes, value: bytes) -> bytes:
    """One ModelProto.metadata_props entry (field 14: key 1, value 2) as protobuf encodes it."""
    inner = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value
    return b"\x72" + _varint(len(inner)) + inner


def with_metadata(entries) -> onnx.ModelProto:
    """small_model with `entries` ((key, value) pairs, str or raw bytes) appended to its
    metadata_props, read from the encoding as a model file is read: a key or value that is not
    UTF-8 comes back as bytes."""
    data = small_model(8).SerializeToString()
    for key, value in entries:
        data += _entry(*(x.encode() if isinstance(x, str) else x for x in (key, value)))
    return onnx.ModelProto.FromString(data)


def hostile_file(tmp_path, key, value):
    return write_model(with_metadata([(key, value)]), tmp_path / "m.onnx")


def assert_valid_record(model: onnx.ModelProto) -> None:
    found, unreadable = provenance.examine(model)
    assert unreadable == [] and found is not None
    assert found["version"] == __version__ and found["precision"] == "fp16" and len(found["plan"]) == 32
    assert isinstance(found["rules"], list) and found["rules"][0]["file"] == "rules/default.toml"
    assert sum(p.key.startswith(provenance.PREFIX) for p in model.metadata_props) == len(provenance.FIELDS)


# ---- reading: never fails, says what it cannot read --------------------------------------------


@pytest.mark.parametrize("case", HOSTILE, ids=IDS)
def test_examine_reads_any_value_and_names_what_it_cannot_read(case):
    _, key, value = case
    found, unreadable = provenance.examine(with_metadata([(key, value)]))
    assert found is not None and len(unreadable) == 1 and key in unreadable[0]
    name = key[len(provenance.PREFIX) :]
    assert isinstance(found[name], str) and len(found[name]) <= provenance.MAX_CHARS
    json.dumps(found)  # the lint JSON report's "provenance": strings, null, no bytes


def test_a_key_that_is_not_utf8_is_no_field_of_the_record():
    """protobuf gives such a key as bytes: `startswith` with a str would raise TypeError."""
    m = with_metadata([("autocast_onnx.version", "0.1.0"), (b"autocast_onnx.rules\xff", "[]")])
    assert any(isinstance(p.key, bytes) for p in m.metadata_props)
    assert provenance.examine(m) == (
        {"version": "0.1.0", "precision": None, "rules": None, "plan": None, "runtime": None},
        [],
    )


def test_a_readable_record_has_no_warning():
    m = autocast_onnx.convert(small_model(8)).model
    found, unreadable = provenance.examine(m)
    assert unreadable == [] and isinstance(found["rules"], list)
    assert "warning" not in provenance.describe("m.onnx", found, unreadable)


def test_describe_escapes_the_model_text_and_keeps_to_one_short_line():
    """Control characters from the model (ESC sequences, newlines, carriage returns, bells) used
    to reach the terminal raw: one could clear the line or forge a second one."""
    hostile = "\x1b[2K\r\x07forged\nline\u202e"
    entries = [
        ("autocast_onnx.version", hostile),
        ("autocast_onnx.precision", hostile),
        (RULES, json.dumps([{"file": hostile, "sha256": hostile}])),
        ("autocast_onnx.plan", hostile),
    ]
    found, unreadable = provenance.examine(with_metadata(entries))
    line = provenance.describe(f"dir\n{hostile}.onnx", found, unreadable)
    assert line.isprintable() and "\\x1b" in line and "\\n" in line and "\\r" in line and "\\x07" in line
    assert "\\u202e" in line
    long = provenance.examine(with_metadata([("autocast_onnx.version", "v" * 60000)]))
    assert len(provenance.describe("m.onnx", *long)) < 400


# ---- the commands ------------------------------------------------------------------------------


@pytest.mark.parametrize("case", HOSTILE, ids=IDS)
def test_lint_and_explain_warn_of_an_unreadable_record_and_carry_on(tmp_path, case):
    path = hostile_file(tmp_path, case[1], case[2])
    lint = invoke(["lint", path])
    assert_ok(lint)
    (line,) = [x for x in lint.stdout.splitlines() if "converted by autocast-onnx" in x]
    assert "warning: the record cannot be read" in line and case[1] in line and line.isprintable()
    report = invoke(["lint", path, "--format", "json"])
    assert_ok(report)
    assert json.loads(report.stdout)["models"][0]["provenance"] is not None
    explain = invoke(["explain", path, "fc"])
    assert_ok(explain)
    first = explain.stdout.splitlines()[0]
    assert "warning: the record cannot be read" in first and first.isprintable()


@pytest.mark.parametrize("case", HOSTILE, ids=IDS)
def test_convert_replaces_an_unreadable_record_with_a_warning(tmp_path, case):
    path = hostile_file(tmp_path, case[1], case[2])
    out = invoke(["convert", path, "-o", tmp_path / "o.onnx"])
    assert_ok(out)
    assert "[provenance] the model's provenance record cannot be read" in out.stdout + out.stderr
    assert_valid_record(onnx.load(tmp_path / "o.onnx"))


def test_check_converts_with_the_warning_and_lints_the_fresh_record(tmp_path):
    path = hostile_file(tmp_path, RULES, "[" * 100000)
    result = invoke(["check", path, "--no-speed", "-o", tmp_path / "o.onnx", "--report-json", tmp_path / "r.json"])
    assert_ok(result)
    assert "1 warning(s)" in result.stdout + result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert any("provenance record cannot be read" in w for w in report["conversion"]["warnings"])
    assert report["lint_converted"]["models"][0]["provenance"]["version"] == __version__
    assert_valid_record(onnx.load(tmp_path / "o.onnx"))


def test_a_converted_model_whose_record_was_spoilt_gets_a_fresh_one_though_nothing_else_changes():
    """Converting a converted model again changes nothing, so the record used to be kept as it
    was (read to decide that: the RecursionError); an unreadable one is replaced."""
    once = autocast_onnx.convert(small_model(8)).model
    for prop in once.metadata_props:
        if prop.key == RULES:
            prop.value = "[" * 5000
    again = autocast_onnx.convert(once)
    assert again.stats.casts_added == 0
    assert_valid_record(again.model)
    assert [w.code for w in again.plan.warnings] == ["provenance"]
    # the fresh record reads: a third conversion keeps it, bytes and all, with no warning
    third = autocast_onnx.convert(again.model)
    assert third.model.SerializeToString() == again.model.SerializeToString() and not third.plan.warnings


@pytest.mark.slow
def test_python_m_autocast_onnx_on_the_deepest_record_exits_0(tmp_path):
    """The same in a real process, where the RecursionError was exit 3."""
    from bad_input_helpers import run_process

    path = hostile_file(tmp_path, RULES, "[" * 100000)
    lint = run_process(["lint", path])
    assert lint.code == 0 and "warning: the record cannot be read" in lint.stdout
    out = run_process(["convert", path, "-o", tmp_path / "o.onnx", "-q"])
    assert out.code == 0, out.stderr
    assert_valid_record(onnx.load(tmp_path / "o.onnx"))
