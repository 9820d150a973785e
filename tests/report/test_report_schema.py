"""The validation report matches docs/validate-report.schema.json: real reports (speed on and
off, files and in-memory models, the JSON file the CLI writes) validate; broken ones do not."""

import json
from pathlib import Path

import jsonschema
import onnx
import pytest
from schema_helpers import assert_schema_documented_and_closed

import autocast_onnx
from autocast_onnx.cli.main import cli
from autocast_onnx.report.validation import validation_json
from autocast_onnx.validate.core import ValidateOptions, validate

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "docs" / "validate-report.schema.json"
RESNET = ROOT / "examples" / "models" / "resnet_tiny.onnx"


@pytest.fixture(scope="module")
def schema():
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def validator(schema):
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def converted():
    return autocast_onnx.convert(RESNET, precision="fp16").model


@pytest.fixture(scope="module")
def report_speed(converted):
    return validate(RESNET, converted, ValidateOptions(speed=True, iterations=2, warmup=0))


@pytest.fixture(scope="module")
def report_no_speed(converted):
    return validate(RESNET, converted, ValidateOptions(speed=False))


def as_json(report):
    """The report as the --report-json file holds it."""
    return json.loads(validation_json(report))


def test_schema_is_a_valid_draft_2020_12_schema(schema):
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_schema_documents_every_property(schema):
    assert_schema_documented_and_closed(schema)


def test_report_with_speed_validates(validator, report_speed):
    validator.validate(report_speed)
    validator.validate(as_json(report_speed))
    speed = report_speed["speed"]
    assert speed is not None and speed["reference"]["iterations"] == 2 and speed["converted"]["warmup"] == 0
    # the resnet head is called logits: scored as class scores, so the top-1 keys are filled
    assert report_speed["outputs"][0]["top1"] is not None and report_speed["outputs"][0]["k"] == 5


def test_report_without_speed_validates(validator, report_no_speed):
    assert report_no_speed["speed"] is None
    assert report_no_speed["speed_skipped"] is None
    validator.validate(report_no_speed)
    validator.validate(as_json(report_no_speed))


def test_report_with_ranges_dims_batches_and_no_class_scores_validates(validator, converted):
    options = ValidateOptions(speed=False, dims={"batch": 3}, ranges={"pixel_values": (0.0, 1.0)}, batches=2)
    report = validate(RESNET, converted, options)
    assert report["inputs"]["ranges"] == {"pixel_values": [0.0, 1.0]} and report["inputs"]["batches"] == 2
    validator.validate(as_json(report))
    # and a model whose output is not class scores: top1/topk/k are null
    plain = onnx.load(RESNET)
    plain.graph.output[0].name = "features"
    for node in plain.graph.node:
        for i, name in enumerate(node.output):
            if name == "logits":
                node.output[i] = "features"
    report = validate(plain, autocast_onnx.convert(plain).model, ValidateOptions(speed=False))
    assert report["reference"]["path"] is None and report["outputs"][0]["top1"] is None
    validator.validate(as_json(report))


def test_report_with_speed_skipped_validates(validator):
    # bf16 on the CPU provider: the emulated comparison runs, the real bf16 model cannot be timed
    bf16 = autocast_onnx.convert(RESNET, precision="bf16").model
    report = validate(RESNET, bf16, ValidateOptions(speed=True, iterations=2, warmup=0, device="cpu"))
    assert report["speed"] is None and report["speed_skipped"].startswith("speed not measured")
    validator.validate(as_json(report))
    assert any("bf16" in kinds for kinds in report["precision_by_op"].values())


def test_cli_report_json_file_validates(validator, converted, tmp_path):
    from click.testing import CliRunner

    conv_path = tmp_path / "resnet_tiny.fp16.onnx"
    onnx.save(converted, conv_path)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(
        cli,
        ["validate", str(RESNET), str(conv_path), "--iterations", "2", "--warmup", "0", "--report-json", str(out)],
        catch_exceptions=False,
    )
    assert result.exit_code in (0, 1), result.output
    report = json.loads(out.read_text())
    validator.validate(report)
    assert report["converted"]["path"] == str(conv_path)
    assert report["converted"]["bytes"] == conv_path.stat().st_size


def test_schema_lists_exactly_the_keys_the_code_writes(schema, report_speed):
    assert set(schema["required"]) == set(schema["properties"]) == set(report_speed)
    defs = schema["$defs"]
    assert set(defs["outputStats"]["required"]) == set(report_speed["outputs"][0])
    assert set(defs["speed"]["required"]) == set(report_speed["speed"])
    assert set(defs["latency"]["required"]) == set(report_speed["speed"]["reference"])
    assert set(schema["properties"]["inputs"]["required"]) == set(report_speed["inputs"])
    assert set(defs["inputSpec"]["required"]) == set(report_speed["inputs"]["specs"][0])
    assert set(schema["properties"]["thresholds"]["required"]) == set(report_speed["thresholds"])


def _delete(path):
    def mutate(report):
        *parents, last = path
        node = report
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def _set(path, value):
    def mutate(report):
        *parents, last = path
        node = report
        for key in parents:
            node = node[key]
        node[last] = value

    return mutate


BROKEN = {
    "missing passed": _delete(["passed"]),
    "missing speed": _delete(["speed"]),
    "missing speed_skipped": _delete(["speed_skipped"]),
    "speed_skipped as a bool": _set(["speed_skipped"], False),
    "missing output cosine": _delete(["outputs", 0, "cosine"]),
    "missing p50": _delete(["speed", "converted", "p50_ms"]),
    "cosine as a string": _set(["outputs", 0, "cosine"], "0.999"),
    "new_nan as a float": _set(["outputs", 0, "new_nan"], 0.5),
    "passed as a string": _set(["passed"], "true"),
    "batches as a string": _set(["inputs", "batches"], "1"),
    "dim value as a string": _set(["inputs", "dims", "batch"], "2"),
    "unknown numerics": _set(["numerics"], "fast"),
    "unknown device": _set(["device"], "tpu"),
    "other schema version": _set(["schema_version"], 2),
    "unknown top-level key": _set(["extra"], 1),
    "unknown output key": _set(["outputs", 0, "median_error"], 0.0),
    "unknown compute type": _set(["precision_by_op", "Conv"], {"fp64": 9}),
    "range with one bound": _set(["inputs", "ranges"], {"pixel_values": [0.0]}),
    "null thresholds": _set(["thresholds"], None),
    "speed-up as null": _set(["speed", "speedup_p50"], None),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_report_fails_validation(validator, report_speed, name):
    report = as_json(report_speed)
    validator.validate(report)  # the unbroken report passes
    BROKEN[name](report)
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(report)
