"""Hostile and broken inputs through every command (convert, lint, validate, check, explain).

The contract for every refused input: exit code 2, exactly one stderr line
"autocast-onnx: error: <where>: <what> (<what to do>)", no traceback, nothing written (no output,
no report, no temporary file anywhere under the test's folder) and every input byte-identical
(the whole folder is compared by sha256 before and after).

Already covered elsewhere and only extended here: tests/cli/test_cli.py (output == input by the same
spelling, os.access-simulated unwritable folder, os.replace ENOSPC without external data, missing
external data / '../' location / cycle / dangling input through `convert`) and
tests/pipeline/test_pipeline.py section 3 (text, empty, truncated, directory, missing model and four
bad rule files through `convert`).

Set AUTOCAST_BAD_INPUTS_LOG=FILE to record every call (see docs/robustness.md, "Bad inputs").
"""

from __future__ import annotations

import os
import resource
import sys

import bad_input_helpers as B
import numpy as np
import onnx
import pytest
from bad_input_helpers import (
    argv,
    assert_ok,
    assert_one_error,
    invoke,
    run_process,
    sha,
    small_model,
    snapshot,
    write_model,
)
from helpers import F32, init, model, tensor
from onnx import TensorProto, helper

import autocast_onnx.io as aio

ALL = ["convert", "lint", "validate", "check", "explain"]


isolated = pytest.fixture(autouse=True)(B.isolated_cwd)


@pytest.fixture
def out(tmp_path):
    """The folder every command writes into; it must stay empty when a command fails."""
    folder = tmp_path / "out"
    folder.mkdir()
    return folder


@pytest.fixture(scope="module")
def bert_bytes():
    return B.BERT.read_bytes()


def refused(tmp_path, args, *fragments, never_open=(), monkeypatch=None) -> str:
    """Run `args` in process; assert the one-line contract and that nothing under tmp_path
    changed. `never_open`: files that must not be opened while the command runs."""
    before = snapshot(tmp_path)
    if never_open:
        with monkeypatch.context() as mp:
            spy = B.OpenSpy(mp)
            outcome = invoke(args)
        for path in never_open:
            assert not spy.opened(path), f"{path} was opened"
    else:
        outcome = invoke(args)
    line = assert_one_error(outcome, *fragments)
    assert snapshot(tmp_path) == before
    return line


def good_model(tmp_path, name="good.onnx"):
    return write_model(small_model(), tmp_path / "good" / name)


# =============================================================================================
# 1. Files that are not (usable) ONNX models
# =============================================================================================
FILE_ERRORS = {
    "text": "not an ONNX model",
    "empty": "empty",
    "truncated": "not an ONNX model",  # the first half of bert_tiny.onnx
    "flipped_bytes": "not an ONNX model",  # every 997th byte of bert_tiny.onnx inverted
    "random_header": "not an ONNX model",  # the first 32 bytes of bert_tiny.onnx random
    "random_bytes": "not an ONNX model",  # 4 KiB of noise
    "directory": "directory",
    "missing": "not found",
}


def make_file_case(case, folder, bert):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{case}.onnx"
    rng = np.random.default_rng(7)
    if case == "text":
        path.write_text("this is not an ONNX model\n" * 10)
    elif case == "empty":
        path.write_bytes(b"")
    elif case == "truncated":
        path.write_bytes(bert[: len(bert) // 2])
    elif case == "flipped_bytes":
        data = bytearray(bert)
        for k in range(0, len(data), 997):
            data[k] ^= 0xFF
        path.write_bytes(bytes(data))
    elif case == "random_header":
        data = bytearray(bert)
        data[:32] = rng.integers(0, 256, 32, dtype=np.uint8).tobytes()
        path.write_bytes(bytes(data))
    elif case == "random_bytes":
        path.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
    elif case == "directory":
        path.mkdir()
        write_model(small_model(), path / "model.onnx")
    elif case != "missing":
        raise ValueError(case)
    return path


@pytest.mark.parametrize("command", ALL + ["validate-converted"])
@pytest.mark.parametrize("case", sorted(FILE_ERRORS))
def test_unusable_model_file(tmp_path, out, bert_bytes, case, command):
    path = make_file_case(case, tmp_path / "models", bert_bytes)
    good = good_model(tmp_path)
    if case == "directory" and command == "lint":
        # lint searches a folder for .onnx files: the model inside is linted
        outcome = invoke(argv(command, path, out, good=good))
        assert outcome.code == 0 and outcome.exception is None, outcome
        return
    refused(tmp_path, argv(command, path, out, good=good), FILE_ERRORS[case], path.name)


def test_random_bytes_inside_the_weights_still_parse(tmp_path, out, bert_bytes):
    """Noise in the middle of the file lands in initializer data: the protobuf is intact and the
    tool cannot tell (there is no checksum in ONNX). It converts; the input is untouched."""
    data = bytearray(bert_bytes)
    mid = len(data) // 2
    data[mid : mid + 64] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    path = tmp_path / "models" / "noisy_weights.onnx"
    path.parent.mkdir()
    path.write_bytes(bytes(data))
    before = sha(path)
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    onnx.checker.check_model(onnx.load(str(out / "o.onnx")), full_check=True)
    assert sha(path) == before


def corrupted_op_type(tmp_path, bert_bytes):
    """bert_tiny.onnx with one op_type field flipped from MatMul to MatMuk: the protobuf parses,
    the model names an op that ai.onnx does not have."""
    data = bytearray(bert_bytes)
    k = data.find(b'"\x06MatMul')  # field 4 (op_type), length 6
    assert k > 0
    data[k + 7] = ord("k")
    path = tmp_path / "models" / "bad_op_type.onnx"
    path.parent.mkdir()
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("command", ["convert", "check"])
def test_flipped_byte_in_an_op_type_is_bad_input(tmp_path, out, bert_bytes, command):
    """A default-domain op with no schema is a broken model (bad input, exit 2), not an
    internal error (exit 3) of the converter."""
    path = corrupted_op_type(tmp_path, bert_bytes)
    refused(tmp_path, argv(command, path, out), "MatMuk", path.name)


def test_flipped_byte_in_an_op_type_validate(tmp_path, out, bert_bytes):
    path = corrupted_op_type(tmp_path, bert_bytes)
    refused(tmp_path, argv("validate", path, out), "MatMuk", path.name)


# =============================================================================================
# 2. External data
# =============================================================================================
OUTSIDE = "outside the model's folder"
EXTERNAL_ERRORS = {
    "missing_data": ("ext.onnx.data", "missing"),
    "absolute_etc_passwd": ("/etc/passwd", OUTSIDE),
    "absolute_outside_file": ("secret.bin", OUTSIDE),
    "dotdot": ("../outside/secret.bin", OUTSIDE),
    "dotdot_nested": ("sub/../../outside/secret.bin", OUTSIDE),
    "symlink_file": ("link.data", OUTSIDE),
    "symlink_dir": ("linkdir/secret.bin", OUTSIDE),
    "offset_beyond_end": ("initializer 'w1'", "exceeds"),
    "length_beyond_end": ("initializer 'w1'", "exceeds"),
    "negative_offset": ("initializer 'w1'", "external data"),
    "negative_length": ("initializer 'w1'", "external data"),
    "non_numeric_offset": ("initializer 'w1'", "external data"),
    "non_numeric_length": ("initializer 'w1'", "external data"),
    "no_location": ("initializer 'w1'", "without a location"),
}


def make_external_case(case, tmp_path):
    """(model path, the file outside the model's folder a hostile location points at). The
    outside file holds a copy of the real data, so reading it would 'work'."""
    folder = tmp_path / "model"
    path = B.external_model(folder)
    data = folder / "ext.onnx.data"
    size = data.stat().st_size
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.bin"
    secret.write_bytes(data.read_bytes())
    edit = {
        "absolute_etc_passwd": {"location": "/etc/passwd"},
        "absolute_outside_file": {"location": str(secret)},
        "dotdot": {"location": "../outside/secret.bin"},
        "dotdot_nested": {"location": "sub/../../outside/secret.bin"},
        "symlink_file": {"location": "link.data"},
        "symlink_dir": {"location": "linkdir/secret.bin"},
        "offset_beyond_end": {"offset": size + 64},
        "length_beyond_end": {"length": size * 2},
        "negative_offset": {"offset": -64},
        "negative_length": {"length": -1},
        "non_numeric_offset": {"offset": "abc"},
        "non_numeric_length": {"length": "12kb"},
        "no_location": {"location": None},
    }.get(case)
    if case == "missing_data":
        data.unlink()
    elif case == "dotdot_nested":
        (folder / "sub").mkdir()
    elif case == "symlink_file":
        (folder / "link.data").symlink_to(secret)
    elif case == "symlink_dir":
        (folder / "linkdir").symlink_to(outside, target_is_directory=True)
    if edit:
        B.edit_external(path, **edit)
    return path, secret


@pytest.mark.parametrize("command", ALL)
@pytest.mark.parametrize("case", sorted(EXTERNAL_ERRORS))
def test_bad_external_data(tmp_path, out, monkeypatch, case, command):
    path, secret = make_external_case(case, tmp_path)
    never = [secret, "/etc/passwd"] if OUTSIDE in EXTERNAL_ERRORS[case] else []
    refused(
        tmp_path, argv(command, path, out), *EXTERNAL_ERRORS[case], path.name, never_open=never, monkeypatch=monkeypatch
    )


def test_good_external_data_control(tmp_path, out, monkeypatch):
    """Control: the unedited external-data model goes through every command, and the open()
    spy used above does see the data file being read."""
    path = B.external_model(tmp_path / "model")
    before = snapshot(tmp_path / "model")
    with monkeypatch.context() as mp:
        spy = B.OpenSpy(mp)
        assert_ok(invoke(argv("convert", path, out) + ["-q"]))
    assert spy.opened(tmp_path / "model" / "ext.onnx.data")
    lint = invoke(["lint", path])
    assert_ok(lint, code=lint.code if lint.code in (0, 1) else 0)  # findings or none, never an error
    assert_ok(invoke(argv("validate", path, out)))
    assert_ok(invoke(["explain", path, "fc"]))
    assert snapshot(tmp_path / "model") == before


# =============================================================================================
# 3. Broken graphs
# =============================================================================================
def graph_case(case) -> onnx.ModelProto:
    W = np.eye(8, dtype=np.float32)
    x, y = tensor("x", F32, [2, 8]), tensor("y", F32, [2, 8])
    mk = helper.make_node
    if case == "cycle":
        return model(
            [
                mk("Relu", ["b"], ["a"], name="fc"),
                mk("Relu", ["a"], ["b"], name="second"),
                mk("Relu", ["a"], ["y"], name="out"),
            ],
            [x],
            [y],
        )
    if case == "cycle_in_subgraph":
        then = helper.make_graph(
            [
                mk("Relu", ["b"], ["a"], name="t1"),
                mk("Relu", ["a"], ["b"], name="t2"),
                mk("Identity", ["a"], ["t_out"], name="t3"),
            ],
            "then",
            [],
            [tensor("t_out", F32, [2, 8])],
        )
        other = helper.make_graph(
            [mk("Identity", ["x"], ["e_out"], name="e1")], "else", [], [tensor("e_out", F32, [2, 8])]
        )
        return model(
            [mk("If", ["c"], ["y"], name="fc", then_branch=then, else_branch=other)],
            [tensor("c", TensorProto.BOOL, []), x],
            [y],
        )
    if case == "duplicate_producer":
        return model([mk("Relu", ["x"], ["y"], name="fc"), mk("Sigmoid", ["x"], ["y"], name="other")], [x], [y])
    if case == "dangling_input":
        return model([mk("MatMul", ["ghost", "w"], ["y"], name="fc")], [x], [y], [init("w", W)])
    if case == "dangling_output":
        return model([mk("MatMul", ["x", "w"], ["h"], name="fc")], [x], [y], [init("w", W)])
    if case == "duplicate_initializer":
        return model([mk("MatMul", ["x", "w"], ["y"], name="fc")], [x], [y], [init("w", W), init("w", W)])
    raise ValueError(case)


GRAPH_ERRORS = {
    "cycle": "cycle",
    "cycle_in_subgraph": "cycle",
    "duplicate_producer": "produced twice",
    "dangling_input": "nothing produces",
    "dangling_output": "produced by nothing",
    "duplicate_initializer": "defined twice",
}


@pytest.mark.parametrize("command", ALL)
@pytest.mark.parametrize("case", sorted(GRAPH_ERRORS))
def test_broken_graph(tmp_path, out, case, command):
    path = write_model(graph_case(case), tmp_path / "models" / f"{case}.onnx")
    # validate hands the model to ONNX Runtime, whose own words say what is wrong
    fragments = (path.name,) if command == "validate" else (GRAPH_ERRORS[case], path.name)
    refused(tmp_path, argv(command, path, out), *fragments)


@pytest.mark.parametrize("command", ["convert", "check", "explain"])
@pytest.mark.parametrize("opset,precision", [(5, "fp16"), (12, "bf16")])
def test_opset_too_old_for_the_target_type(tmp_path, out, opset, precision, command):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("w", np.eye(8, dtype=np.float32))],
        opset=opset,
    )
    path = write_model(m, tmp_path / "models" / f"opset{opset}.onnx")
    refused(tmp_path, argv(command, path, out) + ["--precision", precision], f"opset {opset}", precision, path.name)


def duplicate_names_model():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="same"),
        helper.make_node("Softmax", ["h"], ["y"], name="same"),
    ]
    return model(
        nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [init("w", np.eye(8, dtype=np.float32))]
    )


def test_duplicate_node_names_convert_and_keep_both(tmp_path, out):
    """ONNX allows two nodes with one name: convert keeps both names, explain lists both.
    (ONNX Runtime refuses such a model, so validate says so in one line; see the next test.)"""
    path = write_model(duplicate_names_model(), tmp_path / "models" / "dup_names.onnx")
    before = sha(path)
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    converted = onnx.load(str(out / "o.onnx"))
    onnx.checker.check_model(converted, full_check=True)
    assert sorted(n.op_type for n in converted.graph.node if n.name == "same") == ["MatMul", "Softmax"]
    result = invoke(["explain", path, "same"])
    assert_ok(result)
    assert "same (MatMul)" in result.stdout and "same (Softmax)" in result.stdout
    assert sha(path) == before


@pytest.mark.parametrize("command", ["validate", "check"])
def test_duplicate_node_names_refused_by_the_runtime(tmp_path, out, command):
    path = write_model(duplicate_names_model(), tmp_path / "models" / "dup_names.onnx")
    refused(tmp_path, argv(command, path, out), "same")


def test_empty_graph_converts_and_validates(tmp_path, out):
    m = model([], [tensor("x", F32, [2, 8])], [tensor("x", F32, [2, 8])])
    path = write_model(m, tmp_path / "models" / "empty_graph.onnx")
    before = sha(path)
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    converted = onnx.load(str(out / "o.onnx"))
    onnx.checker.check_model(converted, full_check=True)
    assert len(converted.graph.node) == 0
    assert_ok(invoke(["validate", path, out / "o.onnx", "--no-speed"]))
    assert sha(path) == before


def scalar_model():
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["h"], name="mul"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    return model(nodes, [tensor("x", F32, [])], [tensor("y", F32, [])], [init("s", np.array(2.0, np.float32))])


def zero_size_model():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
        helper.make_node("Relu", ["h"], ["y"], name="relu"),
    ]
    return model(
        nodes,
        [tensor("x", F32, [0, 8])],
        [tensor("y", F32, [0, 8])],
        [init("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )


@pytest.mark.parametrize("case", ["scalar", "zero_size"])
def test_scalar_and_empty_tensors_convert_and_validate(tmp_path, out, case):
    m = scalar_model() if case == "scalar" else zero_size_model()
    path = write_model(m, tmp_path / "models" / f"{case}.onnx")
    before = sha(path)
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    onnx.checker.check_model(onnx.load(str(out / "o.onnx")), full_check=True)
    assert_ok(invoke(["validate", path, out / "o.onnx", "--no-speed"]))
    assert sha(path) == before


def huge_model(n):
    return model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], [tensor("x", F32, [n, n])], [tensor("y", F32, [n, n])]
    )


def test_huge_declared_dims_convert(tmp_path, out):
    path = write_model(huge_model(100_000_000), tmp_path / "models" / "huge.onnx")
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    onnx.checker.check_model(onnx.load(str(out / "o.onnx")), full_check=True)


@pytest.mark.parametrize("command", ["validate", "check"])
def test_huge_declared_dims_validate_refuses_in_one_line(tmp_path, out, command):
    """Generated inputs of 10^16 elements: one line naming the input (and what to do: --dim or
    --inputs), not a bare "out of memory"."""
    path = write_model(huge_model(100_000_000), tmp_path / "models" / "huge.onnx")
    line = refused(tmp_path, argv(command, path, out), "'x'")
    assert "--inputs" in line or "--dim" in line, line


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


@pytest.mark.slow
def test_large_declared_dims_validate_in_a_real_process(tmp_path, out):
    """[100000, 100000] float32 is 40 GB (80 GB as float64 noise): more than the machine should
    give. Under an 8 GiB address-space limit (so a test cannot take the machine down) validate
    must still fail in one line naming the input; it should refuse before allocating."""
    path = write_model(huge_model(100_000), tmp_path / "models" / "large.onnx")
    converted = write_model(huge_model(100_000), tmp_path / "models" / "large_copy.onnx")
    before = snapshot(tmp_path)
    outcome = run_process(["validate", path, converted, "--no-speed"], preexec_fn=_limit_memory)
    assert_one_error(outcome, "'x'")
    assert snapshot(tmp_path) == before


# =============================================================================================
# 4. Custom ops and domains
# =============================================================================================
def custom_op_model():
    return model(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"], name="fc"),
            helper.make_node("Foo", ["a"], ["y"], name="foo", domain="my.domain"),
        ],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("w", np.eye(8, dtype=np.float32))],
        extra_opsets=[("my.domain", 1)],
    )


def mixed_domain_model():
    ms = "com.microsoft"
    return model(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"], name="fc"),
            helper.make_node("Gelu", ["a"], ["g"], name="gelu", domain=ms),
            helper.make_node("Bar", ["g"], ["b"], name="bar", domain="my.custom"),
            helper.make_node("Relu", ["b"], ["y"], name="relu"),
        ],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("w", np.eye(8, dtype=np.float32))],
        extra_opsets=[(ms, 1), ("my.custom", 2)],
        value_info=[tensor("b", F32, [2, 8])],
    )


@pytest.mark.parametrize("case", ["custom", "mixed"])
def test_unknown_custom_op_converts_with_a_warning(tmp_path, out, case):
    m = custom_op_model() if case == "custom" else mixed_domain_model()
    op = "my.domain:Foo" if case == "custom" else "my.custom:Bar"
    path = write_model(m, tmp_path / "models" / f"{case}.onnx")
    before = sha(path)
    result = invoke(["convert", path, "-o", out / "o.onnx"])
    assert_ok(result)
    assert "unknown-op" in result.stdout and op in result.stdout
    converted = onnx.load(str(out / "o.onnx"))
    onnx.checker.check_model(converted, full_check=True)
    domain, op_type = op.split(":")
    assert [n.op_type for n in converted.graph.node if n.domain == domain] == [op_type]
    assert {o.domain: o.version for o in converted.opset_import} == {o.domain: o.version for o in m.opset_import}
    if case == "mixed":
        assert [n.op_type for n in converted.graph.node if n.domain == "com.microsoft"] == ["Gelu"]
    lint = invoke(["lint", path])
    assert_ok(lint, code=lint.code if lint.code in (0, 1) else 0)
    assert sha(path) == before


@pytest.mark.parametrize("command", ["validate", "check"])
@pytest.mark.parametrize("case", ["custom", "mixed"])
def test_unknown_custom_op_cannot_be_validated(tmp_path, out, case, command):
    """ONNX Runtime has no kernel for it: one line naming the op."""
    m = custom_op_model() if case == "custom" else mixed_domain_model()
    path = write_model(m, tmp_path / "models" / f"{case}.onnx")
    refused(tmp_path, argv(command, path, out), "Foo" if case == "custom" else "Bar")


def test_unused_unknown_domain_import(tmp_path, out):
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")],
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("w", np.eye(8, dtype=np.float32))],
        extra_opsets=[("org.nowhere", 3)],
    )
    path = write_model(m, tmp_path / "models" / "unknown_domain.onnx")
    assert_ok(invoke(["convert", path, "-o", out / "o.onnx", "-q"]))
    converted = onnx.load(str(out / "o.onnx"))
    onnx.checker.check_model(converted, full_check=True)
    assert ("org.nowhere", 3) in [(o.domain, o.version) for o in converted.opset_import]
    assert_ok(invoke(["validate", path, out / "o.onnx", "--no-speed"]))


# =============================================================================================
# 5. Rule files and configuration files
# =============================================================================================
# name: (text, fragments); tests/pipeline/test_pipeline.py covers an unknown settings key, an unknown
# table, an op in two categories (same spelling) and a bad regex in the first [[nodes]] entry.
RULE_FILES = {
    "invalid_toml": ('[ops.keep_fp32]\nMatMul = "a"\nSoftmax = \n', ("rules.toml:3", "invalid TOML")),
    "threshold_not_a_number": (
        '# limits\n[thresholds]\nmax_flush_fraction = "lots"\n',
        ("rules.toml:3", "max_flush_fraction"),
    ),
    "threshold_not_an_integer": (
        "[thresholds]\nsmall_constant_elements = 1.5\n",
        ("rules.toml:2", "small_constant_elements"),
    ),
    "threshold_bool": ("[thresholds]\ncalibration_headroom = true\n", ("rules.toml:2", "calibration_headroom")),
    "why_not_a_string": ("[ops.follow]\nRelu = 3\n", ("rules.toml:2", "Relu")),
    "unknown_category": ('[ops.sometimes]\nMatMul = "x"\n', ("rules.toml:1", "sometimes")),
    "bad_op_name": ('[ops.keep_fp32]\n"Mat Mul" = "x"\n', ("rules.toml:2", "Mat Mul")),
    "ops_not_tables": ('[ops]\nkeep_fp32 = "x"\n', ("rules.toml:2", "keep_fp32")),
    "two_categories_by_domain": (
        '[ops.keep_fp32]\n"ai.onnx:MatMul" = "x"\n[ops.low_precision]\nMatMul = "y"\n',
        ("rules.toml:4", "two categories"),
    ),
    "bad_regex_second_entry": (
        ('\n\n[[nodes]]\nname = "a"\nprecision = "fp32"\n\n[[nodes]]\nmatch = "(unclosed"\nprecision = "low"\n'),
        ("rules.toml:7", "regex"),
    ),
    "node_unknown_key": ('[[nodes]]\nmatch = "a"\nprecision = "fp32"\ncolour = "red"\n', ("rules.toml:4", "colour")),
    "node_bad_precision": ('[[nodes]]\nmatch = "fc"\nprecision = "half"\n', ("rules.toml:1", "half")),
    "node_match_and_name": (
        '[[nodes]]\nmatch = "a"\nname = "b"\nprecision = "fp32"\n',
        ("rules.toml:1", "exactly one"),
    ),
    "node_match_not_a_string": ('[[nodes]]\nmatch = 5\nprecision = "fp32"\n', ("rules.toml:1", "match")),
    "node_op_types_not_a_list": (
        '[[nodes]]\nmatch = "a"\nprecision = "fp32"\nop_types = "MatMul"\n',
        ("rules.toml:1", "op_types"),
    ),
    "nodes_not_an_array": ('nodes = "x"\n', ("rules.toml:1", "nodes")),
    "settings_not_a_table": ("settings = 3\n", ("rules.toml:1", "settings")),
    "unknown_op_category": ('[settings]\nunknown_op = "maybe"\n', ("rules.toml:2", "maybe")),
    "pin_inputs_not_a_list": ('[pins]\nMatMul = { inputs = "0" }\n', ("rules.toml:2", "inputs")),
    "pin_negative_port": ("[pins]\nMatMul = { inputs = [-1] }\n", ("rules.toml:2", "inputs")),
    "pin_unknown_key": ("[pins]\nMatMul = { inputs = [0], extra = 1 }\n", ("rules.toml:2", "extra")),
    "not_utf8": (b'[ops.keep_fp32]\nMatMul = "\xff\xfe"\n', ("rules.toml", "UTF-8")),
    "directory": (None, ("rules.toml", "directory")),
    "missing": ("", ("rules.toml", "not found")),
}


def write_rules(case, folder):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rules.toml"
    text = RULE_FILES[case][0]
    if case == "directory":
        path.mkdir()
    elif case == "missing":
        pass
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("case", sorted(RULE_FILES))
def test_bad_rule_file_convert(tmp_path, out, case):
    model_path = good_model(tmp_path)
    rules = write_rules(case, tmp_path / "rules")
    refused(tmp_path, argv("convert", model_path, out) + ["--rules", rules], *RULE_FILES[case][1])


@pytest.mark.parametrize("command", ["lint", "check", "explain"])
@pytest.mark.parametrize("case", ["invalid_toml", "two_categories_by_domain", "bad_regex_second_entry", "missing"])
def test_bad_rule_file_other_commands(tmp_path, out, case, command):
    """A broken --rules file is refused by every command that takes one, whether or not the
    model happens to need the rules (lint reads them to tell protected nodes)."""
    model_path = good_model(tmp_path)
    rules = write_rules(case, tmp_path / "rules")
    refused(tmp_path, argv(command, model_path, out) + ["--rules", rules], *RULE_FILES[case][1])


def test_bad_rule_file_changes_no_lint_verdict(tmp_path, out):
    """bert_tiny has findings that the default rules protect (info); a broken --rules file must
    be refused, not silently dropped (which turns those findings into errors and exit 1)."""
    rules = write_rules("why_not_a_string", tmp_path / "rules")
    refused(tmp_path, ["lint", B.BERT, "--rules", rules, "-o", out / "lint.txt"], *RULE_FILES["why_not_a_string"][1])


# name: (file name, text, fragments)
CONFIGS = {
    "unknown_key": ("autocast-onnx.toml", 'colour = "red"\n', ("autocast-onnx.toml", "colour")),
    "number_is_text": ("autocast-onnx.toml", 'atol = "big"\n', ("autocast-onnx.toml", "atol")),
    "number_is_bool": ("autocast-onnx.toml", "atol = true\n", ("autocast-onnx.toml", "atol")),
    "threshold_nan": ("autocast-onnx.toml", "rtol = nan\n", ("autocast-onnx.toml", "rtol")),
    "list_is_text": ("autocast-onnx.toml", 'select = "AC1"\n', ("autocast-onnx.toml", "select")),
    "bad_fail_on": ("autocast-onnx.toml", 'fail-on = "fatal"\n', ("autocast-onnx.toml", "fatal")),
    "invalid_toml": ("autocast-onnx.toml", "atol = \n", ("autocast-onnx.toml", "invalid TOML")),
    "suppression_bad_regex": (
        "autocast-onnx.toml",
        'suppress = [{ code = "AC101", node = "(" }]\n',
        ("autocast-onnx.toml", "regex"),
    ),
    "suppression_wrong_type": ("autocast-onnx.toml", "suppress = [{ code = 5 }]\n", ("autocast-onnx.toml", "suppress")),
    "pyproject_wrong_type": ("pyproject.toml", "[tool.autocast-onnx]\nselect = [1]\n", ("pyproject.toml", "select")),
    "pyproject_not_a_table": ("pyproject.toml", "[tool]\nautocast-onnx = 3\n", ("pyproject.toml", "table")),
    "rules_file_missing": ("autocast-onnx.toml", 'rules = ["nope.toml"]\n', ("nope.toml", "not found")),
    "rules_file_invalid": ("autocast-onnx.toml", 'rules = ["bad_rules.toml"]\n', ("bad_rules.toml:2", "MatMul")),
}


def write_config(case, folder):
    folder.mkdir(parents=True, exist_ok=True)
    name, text, _ = CONFIGS[case]
    (folder / name).write_text(text)
    (folder / "bad_rules.toml").write_text("[ops.keep_fp32]\nMatMul = 1\n")
    return folder / name


@pytest.mark.parametrize("command", ["lint", "check"])
@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bad_config_file(tmp_path, out, case, command):
    model_path = good_model(tmp_path)
    config = write_config(case, tmp_path / "cfg")
    refused(tmp_path, argv(command, model_path, out) + ["--config", config], *CONFIGS[case][2])


@pytest.mark.parametrize("flag,value", [("--rtol", "nan"), ("--atol", "inf"), ("--min-cosine", "nan")])
def test_non_finite_threshold_flag(tmp_path, out, flag, value):
    """A NaN threshold never fails (every comparison with NaN is false) and an infinite one
    cannot be written to the JSON report: refuse them up front."""
    model_path = good_model(tmp_path)
    refused(tmp_path, argv("validate", model_path, out) + [flag, value], flag)


@pytest.mark.parametrize("command", ["lint", "check"])
def test_config_file_not_found(tmp_path, out, command):
    model_path = good_model(tmp_path)
    refused(tmp_path, argv(command, model_path, out) + ["--config", tmp_path / "nope.toml"], "nope.toml", "not found")


@pytest.mark.parametrize("command", ["convert", "lint", "check"])
@pytest.mark.parametrize("case", ["unknown_key", "invalid_toml", "pyproject_wrong_type"])
def test_bad_discovered_config(tmp_path, out, isolated, monkeypatch, case, command):
    """The configuration found from the current folder up (here: in a parent of it)."""
    model_path = good_model(tmp_path)
    write_config(case, isolated)
    sub = isolated / "deeper"
    sub.mkdir()
    monkeypatch.chdir(sub)
    refused(tmp_path, argv(command, model_path, out), *CONFIGS[case][2])


def test_broken_pyproject_is_reported(tmp_path, out, isolated):
    """A pyproject.toml on the way up that is not TOML: one line naming it."""
    model_path = good_model(tmp_path)
    (isolated / "pyproject.toml").write_text("[project\nname = 'x'\n")
    refused(tmp_path, argv("lint", model_path, out), "pyproject.toml", "invalid TOML")


# =============================================================================================
# 6. Output problems
# =============================================================================================
def output_spelling(spelling, folder, path):
    """(input to pass, output to pass) naming the same file another way."""
    if spelling == "symlink_to_input":
        link = folder / "link.onnx"
        link.symlink_to(path.name)
        return path, link
    if spelling == "input_is_a_symlink":
        link = folder / "link.onnx"
        link.symlink_to(path.name)
        return link, path
    if spelling == "hardlink":
        hard = folder / "hard.onnx"
        os.link(path, hard)
        return path, hard
    if spelling == "dotdot":  # ./<...>/dir/../m.onnx, relative to the current folder
        (folder / "dir").mkdir()
        return path, "./" + os.path.relpath(folder / "dir") + "/../" + path.name
    if spelling == "relative":
        return path, os.path.relpath(path)
    raise ValueError(spelling)


@pytest.mark.parametrize("command", ["convert", "check"])
@pytest.mark.parametrize("spelling", ["symlink_to_input", "input_is_a_symlink", "hardlink", "dotdot", "relative"])
def test_output_is_the_input_by_another_name(tmp_path, spelling, command):
    path = good_model(tmp_path, "m.onnx")
    given, target = output_spelling(spelling, path.parent, path)
    args = ["convert", given, "-o", target] if command == "convert" else ["check", given, "--no-speed", "-o", target]
    refused(tmp_path, args, "output path is the input")


REPORT_OVER_INPUT = {
    "lint -o": lambda m, c: ["lint", m, "-o", m],
    "validate --report-json reference": lambda m, c: ["validate", m, c, "--no-speed", "--report-json", m],
    "validate --report-html converted": lambda m, c: ["validate", m, c, "--no-speed", "--report-html", c],
    "check --report-json": lambda m, c: ["check", m, "--no-speed", "--report-json", m],
    "check --report-html": lambda m, c: ["check", m, "--no-speed", "--report-html", m],
    "check --sarif": lambda m, c: ["check", m, "--no-speed", "--sarif", m],
    "convert --plan-out": lambda m, c: ["convert", m, "-o", m.with_name("o.onnx"), "--plan-out", m],
    "convert --validate --report-json": lambda m, c: [
        "convert",
        m,
        "-o",
        m.with_name("o.onnx"),
        "--validate",
        "--no-speed",
        "--report-json",
        m,
    ],
}


@pytest.mark.parametrize("case", sorted(REPORT_OVER_INPUT))
def test_report_over_an_input_model(tmp_path, case):
    """No command writes a report over a model it reads."""
    path = good_model(tmp_path, "m.onnx")
    converted = path.with_name("m.fp16.onnx")
    assert_ok(invoke(["convert", path, "-o", converted, "-q"]))
    refused(tmp_path, REPORT_OVER_INPUT[case](path, converted), "input")


@pytest.mark.parametrize("target", ["weights", "weights.data"])
def test_output_over_the_inputs_external_data(tmp_path, target):
    """-o FOLDER/weights writes weights.data beside it, and -o FOLDER/weights.data writes the
    model there: both would replace the input's data file."""
    folder = tmp_path / "model"
    path = B.external_model(folder, "m.onnx", location="weights.data")
    refused(tmp_path, ["convert", path, "-o", folder / target], "weights.data")


OUTPUT_FLAGS = {
    "convert -o": lambda m, o: ["convert", m, "-o", o],
    "convert --plan-out": lambda m, o: ["convert", m, "-o", o.parent.parent / "ok" / "o.onnx", "--plan-out", o],
    "lint -o": lambda m, o: ["lint", m, "-o", o],
    "validate --report-json": lambda m, o: ["validate", m, m, "--no-speed", "--report-json", o],
    "validate --report-html": lambda m, o: ["validate", m, m, "--no-speed", "--report-html", o],
    "check -o": lambda m, o: ["check", m, "--no-speed", "-o", o],
    "check --report-json": lambda m, o: ["check", m, "--no-speed", "--report-json", o],
    "check --sarif": lambda m, o: ["check", m, "--no-speed", "--sarif", o],
}


@pytest.mark.parametrize("flag", sorted(OUTPUT_FLAGS))
def test_output_folder_is_a_regular_file(tmp_path, flag):
    """Unwritable destination (tests run as root, so permission bits would not stop a write):
    the would-be parent folder is a regular file."""
    path = good_model(tmp_path, "m.onnx")
    (tmp_path / "ok").mkdir()
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder\n")
    refused(tmp_path, OUTPUT_FLAGS[flag](path, blocker / "x.out"), "blocker")


@pytest.mark.parametrize("flag", ["convert -o", "lint -o", "validate --report-json", "check --report-json"])
def test_output_path_is_a_directory(tmp_path, flag):
    path = good_model(tmp_path, "m.onnx")
    target = tmp_path / "adir"
    target.mkdir()
    refused(tmp_path, OUTPUT_FLAGS[flag](path, target), "adir")


def _is_model_tmp(name):
    return name.startswith(".o.onnx.") and not name.startswith(".o.onnx.data.")


def _is_data_tmp(name):
    return name.startswith(".o.onnx.data.")


# (where the disk fills up, --external-data?)
DISK_FULL = [
    ("write model", False),
    ("fsync model", False),
    ("rename model", False),
    ("write data", True),
    ("fsync data", True),
    ("rename data", True),
    ("write model", True),
    ("fsync model", True),
    ("rename model", True),
]


@pytest.mark.parametrize("source", ["inline", "external"])
@pytest.mark.parametrize("fault,external", DISK_FULL, ids=[f"{f} ext={e}" for f, e in DISK_FULL])
def test_disk_full(tmp_path, out, monkeypatch, source, fault, external):
    """ENOSPC at each step of the atomic writer (model file, external data file): exit 2, one
    line, nothing left in the output folder (not even the data file when only the model failed),
    the input untouched. The data file is written, synced and renamed before the model."""
    path = good_model(tmp_path) if source == "inline" else B.external_model(tmp_path / "model")
    step = 2 if external and "model" in fault else 1
    if fault.startswith("write"):
        B.full_disk_on_write(monkeypatch, aio, _is_model_tmp if "model" in fault else _is_data_tmp)
    elif fault.startswith("fsync"):
        B.fail_nth(monkeypatch, os, "fsync", step)
    else:
        B.fail_nth(monkeypatch, os, "replace", step)
    args = ["convert", path, "-o", out / "o.onnx", "--external-data" if external else "--no-external-data"]
    refused(tmp_path, args, "No space left", "o.onnx")


def test_disk_full_writing_the_plan(tmp_path, out, monkeypatch):
    """The plan is the last file convert writes: when it fails, the command fails and leaves
    no converted model behind (all or nothing)."""
    path = good_model(tmp_path)
    B.fail_nth(monkeypatch, os, "replace", 2)  # 1: the model, 2: the plan
    refused(tmp_path, argv("convert", path, out), "No space left")


@pytest.mark.parametrize("command", ["lint", "validate", "check"])
def test_disk_full_writing_a_report(tmp_path, out, monkeypatch, command):
    path = good_model(tmp_path)
    args = {
        "lint": ["lint", path, "-o", out / "lint.txt"],
        "validate": ["validate", path, path, "--no-speed", "--report-json", out / "r.json"],
        "check": ["check", path, "--no-speed", "--report-json", out / "r.json"],
    }[command]
    B.fail_nth(monkeypatch, os, "replace", 1)
    refused(tmp_path, args, "No space left")


# =============================================================================================
# 7. Reports into a folder that does not exist
# =============================================================================================
MISSING_FOLDER = {
    "convert --plan-out": lambda m, d: ["convert", m, "-o", d.parent / "out" / "o.onnx", "--plan-out", d / "p.json"],
    "convert --validate --report-json": lambda m, d: [
        "convert",
        m,
        "-o",
        d.parent / "out" / "o.onnx",
        "--validate",
        "--no-speed",
        "--report-json",
        d / "r.json",
    ],
    "convert --validate --report-html": lambda m, d: [
        "convert",
        m,
        "-o",
        d.parent / "out" / "o.onnx",
        "--validate",
        "--no-speed",
        "--report-html",
        d / "r.html",
    ],
    "lint -o": lambda m, d: ["lint", m, "-o", d / "lint.txt"],
    "validate --report-json": lambda m, d: ["validate", m, m, "--no-speed", "--report-json", d / "r.json"],
    "validate --report-html": lambda m, d: ["validate", m, m, "--no-speed", "--report-html", d / "r.html"],
    "check -o": lambda m, d: ["check", m, "--no-speed", "-o", d / "o.onnx"],
    "check --report-json": lambda m, d: ["check", m, "--no-speed", "--report-json", d / "r.json"],
    "check --report-html": lambda m, d: ["check", m, "--no-speed", "--report-html", d / "r.html"],
    "check --sarif": lambda m, d: ["check", m, "--no-speed", "--sarif", d / "r.sarif"],
}


@pytest.mark.parametrize("case", sorted(MISSING_FOLDER))
def test_report_into_a_missing_folder(tmp_path, out, case):
    """Refused before any work: nothing printed on stdout, nothing written (not even the model)."""
    path = good_model(tmp_path)
    missing = tmp_path / "missing"
    before = snapshot(tmp_path)
    outcome = invoke(MISSING_FOLDER[case](path, missing))
    assert_one_error(outcome, "missing", "does not exist")
    assert outcome.stdout == ""
    assert snapshot(tmp_path) == before


# =============================================================================================
# 8. The same contract in a real process (real stderr, exit code, usage errors)
# =============================================================================================
@pytest.mark.slow
def test_real_process_non_numeric_external_offset(tmp_path, out):
    path, _ = make_external_case("non_numeric_offset", tmp_path)
    before = snapshot(tmp_path)
    assert_one_error(run_process(argv("convert", path, out)), "initializer 'w1'", path.name)
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_real_process_bad_rule_file(tmp_path, out):
    model_path = good_model(tmp_path)
    rules = write_rules("bad_regex_second_entry", tmp_path / "rules")
    before = snapshot(tmp_path)
    assert_one_error(run_process(argv("check", model_path, out) + ["--rules", rules]), "rules.toml:7", "regex")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [["validate", "{m}"], ["explain", "{m}"], ["convrt", "{m}"], ["convert", "{m}", "--check", "most"]],
    ids=["validate missing CONVERTED", "explain missing NODE", "unknown command", "bad choice"],
)
def test_real_process_usage_errors(tmp_path, args):
    model_path = good_model(tmp_path)
    before = snapshot(tmp_path)
    outcome = run_process([a.format(m=model_path) for a in args])
    assert_one_error(outcome, "--help")
    assert snapshot(tmp_path) == before


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
