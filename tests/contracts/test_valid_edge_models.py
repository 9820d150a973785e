"""Valid models and inputs at the edges of the format, which used to end in an internal error
(exit 3) or a misleading refusal, and bad input that used to be slow:

- a main-graph input or output with a type but no shape, or a graph without a name: the input
  check accepts them, but the output check (onnx.checker on the result) refused the conversion
  as a bug, in every command that converts;
- validate on a model with a sequence input (KeyError 0) or a rank-0 bool input (numpy gave a
  scalar, which ONNX Runtime refuses as a feed);
- --input-range parsed by a regex that backtracked quadratically (128 KB took ~40 s; the parser
  that replaced it applies no regex, and its work, counted in function calls, is linear);
- convert_file(..., "missing/") wrote a file named 'missing' (the CLI refuses it);
- a model nested deeper than protobuf reads was called truncated or corrupted."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, snapshot, write_model
from helpers import F32, init, model, tensor
from onnx import TensorProto, helper
from work_helpers import call_count, in_re, profiled

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.errors import InternalCheckError
from autocast_onnx.io import load_model
from autocast_onnx.pipeline import convert_file
from autocast_onnx.rewrite.checks import check_result
from autocast_onnx.validate.inputs import describe_inputs, generate, parse_ranges, plan_inputs

W = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)


# ---- 1. inputs and outputs without a shape, graphs without a name ------------------------------
def _mlp(in_shape=(2, 8), out_shape=(2, 8), name="g") -> onnx.ModelProto:
    """x -> MatMul(fc) -> Relu(act) -> y; a shape of None declares the type without a shape."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], ["y"], name="act"),
    ]
    m = model(nodes, [tensor("x", F32, in_shape)], [tensor("y", F32, out_shape)], [init("w", W)])
    m.graph.name = name
    return m


def _unnamed_body() -> onnx.ModelProto:
    """An If whose then_branch has no name (and no shapes on the bodies' outputs)."""
    branch = [helper.make_node("Relu", ["h"], ["t"])], [helper.make_node("Neg", ["h"], ["e"])]
    then = helper.make_graph(branch[0], "", [], [tensor("t", F32)])
    other = helper.make_graph(branch[1], "else", [], [tensor("e", F32)])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other),
    ]
    inputs = [tensor("x", F32, [2, 8]), tensor("c", TensorProto.BOOL, [])]
    return model(nodes, inputs, [tensor("y", F32, [2, 8])], [init("w", W)])


EDGE_MODELS = {
    "input-without-shape": lambda: _mlp(in_shape=None),
    "output-without-shape": lambda: _mlp(out_shape=None),
    "unnamed-graph": lambda: _mlp(name=""),
    "unnamed-subgraph": _unnamed_body,
}


@pytest.mark.parametrize("check", ["basic", "full"])
@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("case", sorted(EDGE_MODELS))
def test_model_the_input_check_accepts_converts_at_every_check_level(tmp_path, case, check, external):
    """Each used to end in exit 3: 'the converted model fails onnx.checker: Field 'shape' of
    'type' is required' / 'Field 'name' of 'graph' is required to be non-empty'. With --check
    full, an empty shape put in for the check would declare rank 0: shapes are inferred on the
    model as it is."""
    src = write_model(EDGE_MODELS[case](), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    args = ["convert", src, "-o", out, "--check", check] + (["--external-data"] if external else [])
    assert_ok(invoke(args))
    converted = onnx.load(str(out))
    assert any(i.data_type == TensorProto.FLOAT16 for i in converted.graph.initializer)
    original = onnx.load(str(src))
    for kept, given in [
        *zip(converted.graph.input, original.graph.input),
        *zip(converted.graph.output, original.graph.output),
    ]:
        assert kept.type.tensor_type.HasField("shape") == given.type.tensor_type.HasField("shape")
    assert converted.graph.name == original.graph.name


@pytest.mark.parametrize("case", ["output-without-shape", "unnamed-graph"])
def test_every_command_takes_a_model_without_io_shape_or_graph_name(tmp_path, case):
    """check converted and validated it (exit 3 before); validate and diagnose compare it with its
    conversion; lint and explain read it."""
    src = write_model(EDGE_MODELS[case](), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    assert_ok(invoke(["convert", src, "-o", out]))
    assert_ok(invoke(["check", src, "--no-speed", "-o", tmp_path / "c.onnx"]))
    validated = invoke(["validate", src, out, "--no-speed"])
    assert_ok(validated)
    assert "result: PASS" in validated.stdout
    assert_ok(invoke(["diagnose", src, out]))
    assert_ok(invoke(["lint", src]))
    assert_ok(invoke(["explain", src, "fc"]))


def _converted(case: str) -> onnx.ModelProto:
    return autocast_onnx.convert(EDGE_MODELS[case]()).model


@pytest.mark.parametrize("case", sorted(EDGE_MODELS))
@pytest.mark.parametrize("full", [False, True])
def test_a_defect_in_the_result_still_fails_the_check(case, full):
    """What the output check lets through is the input's own allowance, nothing more: a node the
    rewrite would leave malformed (an attribute its op does not have) still fails."""
    m = _converted(case)
    m.graph.node[-1].attribute.append(helper.make_attribute("bogus", 1))
    with pytest.raises(InternalCheckError, match="bogus"):
        check_result(m, full=full)


@pytest.mark.parametrize("case", ["input-without-shape", "output-without-shape"])
def test_a_type_error_in_the_result_still_fails_the_full_check(case):
    """The full check's inference still runs on a model whose I/O has no shape: an fp16 tensor
    fed where the op's other input is fp32 fails."""
    m = _converted(case)
    relu = next(n for n in m.graph.node if n.op_type == "Relu")
    m.graph.node.append(helper.make_node("Add", [relu.output[0], "x"], ["bad"], name="bad"))
    m.graph.output.append(tensor("bad", TensorProto.FLOAT16, None))
    check_result(m, full=False)  # the structure is fine
    with pytest.raises(InternalCheckError, match=r"fails onnx\.checker"):
        check_result(m, full=True)


# ---- 2. validate: sequence inputs, rank-0 bool inputs ------------------------------------------
def _sequence_model() -> onnx.ModelProto:
    """y = MatMul(a, w) + SequenceAt(s, 0): a sequence input beside a tensor input."""
    nodes = [
        helper.make_node("SequenceAt", ["s", "zero"], ["x"], name="at"),
        helper.make_node("MatMul", ["a", "w"], ["h"], name="fc"),
        helper.make_node("Add", ["h", "x"], ["y"], name="add"),
    ]
    inputs = [helper.make_tensor_sequence_value_info("s", F32, ["batch", 8]), tensor("a", F32, ["batch", 8])]
    zero = init("zero", np.array(0, np.int64))
    return model(nodes, inputs, [tensor("y", F32, ["batch", 8])], [init("w", W), zero])


def _bool_scalar_model() -> onnx.ModelProto:
    """y = Where(c, MatMul(x, w), x) with c a rank-0 bool."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Where", ["c", "h", "x"], ["y"], name="pick"),
    ]
    inputs = [tensor("c", TensorProto.BOOL, []), tensor("x", F32, [2, 8])]
    return model(nodes, inputs, [tensor("y", F32, [2, 8])], [init("w", W)])


def _optional_model() -> onnx.ModelProto:
    optional = helper.make_optional_type_proto(helper.make_tensor_type_proto(F32, [2, 8]))
    nodes = [
        helper.make_node("OptionalGetElement", ["o"], ["x"], name="get"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
    ]
    return model(nodes, [helper.make_value_info("o", optional)], [tensor("y", F32, [2, 8])], [init("w", W)], opset=18)


@pytest.mark.parametrize("build", [_sequence_model, _bool_scalar_model, _optional_model])
def test_validate_generates_inputs_of_every_tensor_kind(tmp_path, build):
    """A sequence input ended in exit 3 (KeyError 0), a rank-0 bool input in exit 2 ('Unable to
    handle object of type numpy.bool'): both are generated and the comparison passes."""
    src = write_model(build(), tmp_path / "m.onnx")
    out = tmp_path / "o.onnx"
    assert_ok(invoke(["convert", src, "-o", out]))
    outcome = invoke(["validate", src, out, "--no-speed"])
    assert_ok(outcome)
    assert "result: PASS" in outcome.stdout


def test_generated_sequence_is_a_list_of_arrays_and_scalars_are_arrays():
    feeds = generate(plan_inputs(describe_inputs(_sequence_model()), {"batch": 3}))
    assert isinstance(feeds["s"], list) and len(feeds["s"]) >= 1
    assert all(isinstance(t, np.ndarray) and t.shape == (3, 8) and t.dtype == np.float32 for t in feeds["s"])
    assert feeds["a"].shape == (3, 8)
    for elem_type, dtype in [(TensorProto.BOOL, np.bool_), (TensorProto.INT64, np.int64), (F32, np.float32)]:
        m = model(
            [helper.make_node("Identity", ["c"], ["y"])], [tensor("c", elem_type, [])], [tensor("y", elem_type, [])]
        )
        value = generate(plan_inputs(describe_inputs(m)))["c"]
        assert isinstance(value, np.ndarray) and value.shape == () and value.dtype == dtype


def test_npz_inputs_for_a_sequence_input_are_refused_by_name(tmp_path):
    src = write_model(_sequence_model(), tmp_path / "m.onnx")
    np.savez(tmp_path / "b.npz", s=np.ones((2, 3, 8), np.float32), a=np.ones((3, 8), np.float32))
    before = snapshot(tmp_path)
    assert_one_error(invoke(["validate", src, src, "--no-speed", "--inputs", tmp_path / "b.npz"]), "'s'", "sequence")
    assert snapshot(tmp_path) == before


def test_a_map_input_is_refused_in_one_line(tmp_path):
    map_type = helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(F32, []))
    m = model(
        [helper.make_node("Identity", ["m"], ["y"], name="id")],
        [helper.make_value_info("m", map_type)],
        [helper.make_value_info("y", map_type)],
    )
    src = write_model(m, tmp_path / "m.onnx")
    assert_one_error(invoke(["validate", src, src, "--no-speed"]), "input 'm' is a map")


# ---- 3. --input-range: a linear parser ---------------------------------------------------------
_OLD_SYNTAX = re.compile(r"\s*([^=]+?)\s*=\s*(-?[\d.eE+-]+)\s*:\s*(-?[\d.eE+-]+)\s*")


def calls(fn, *args) -> tuple[int, list[str]]:
    """The function calls (Python and built-in, generator steps included) made while fn(*args)
    runs, a measure of its work that does not move with the machine's speed (no test here reads a
    clock: a loaded machine must not fail them); and the regexes applied meanwhile, through a
    compiled pattern (its method, as cProfile names it) or through `re` (its Python functions)."""
    stats = profiled(fn, *args)
    regexes = [
        e.code if isinstance(e.code, str) else e.code.co_name
        for e in stats
        if (isinstance(e.code, str) and "Pattern' objects" in e.code)
        or (not isinstance(e.code, str) and in_re(e.code.co_filename))
    ]
    return call_count(stats), regexes


def _refused(text: str) -> None:
    """parse_ranges refuses `text` as an --input-range (pytest.raises(match=) would apply a regex)."""
    try:
        parse_ranges([text])
    except AutocastError as exc:
        assert exc.where == "--input-range", exc.where
    else:
        pytest.fail(f"{text[:20]!r}... was taken")


RANGE_TEXTS = {  # n characters, about
    "blank-run-in-name": lambda n: "x" + " " * n + "y",  # the old regex: quadratic in the run of blanks
    "blanks": lambda n: " " * n,
    "long-lo": lambda n: "x=" + "1" * n,
    "blank-run-in-hi": lambda n: "x=1:" + " " * n + "y",
    "long-both": lambda n: "x" * (n // 2) + "=" + "9" * (n // 2) + ":",
}


def linear_and_regex_free(fn) -> None:
    """fn(n) applies no regex, and fn(4,000) makes no more than 4 times the calls of fn(1,000):
    lengths short enough that a regex or a quadratic parser fails here rather than hangs (at
    200,000 characters either takes minutes)."""
    small, regexes = calls(fn, 1_000)
    assert regexes == [], regexes
    large, _ = calls(fn, 4_000)
    assert large <= 4 * small, (small, large)


@pytest.mark.parametrize("make", list(RANGE_TEXTS.values()), ids=list(RANGE_TEXTS))
def test_a_200kb_input_range_is_refused_in_linear_work(make):
    """Refused applying no regex (the parser splits the argument; the regex it replaced
    backtracked on it), with calls in proportion to the argument's length at most (measured: 13
    to 23 calls, whatever the length, or 1 per character where a number's digits are looked at)."""
    linear_and_regex_free(lambda n: _refused(make(n)))
    _refused(make(200_000))


def test_a_200kb_input_range_that_is_well_formed_is_parsed_in_linear_work():
    def parsed(n: int) -> None:
        name = "n" * n
        assert parse_ranges([f" {name} = -1.5e0 : 2 "]) == {name: (-1.5, 2.0)}

    linear_and_regex_free(parsed)
    parsed(200_000)


CASES = [
    "x=0:1", " x = -1 : 2 ", "x=1e-3:1E3", "a b=0:1", "a:b=0:1", "x=+1:2", "x=1", "x=1:", "x=:1", "=0:1",
    "x", "x=a:b", "x=1e:2", "x=.:1", "x=1:2:3", "x==1:2", "x=1 2:3", "x=0:1\n", "\tx\t=\t0\t:\t1\t",
    "x=\u0663:\u0664", "x=0x1:2", "x=inf:1", "x=1-:2", "x=--1:2", "x=2:1", "é=0:1", "x=0:1e999",
]  # fmt: skip


@pytest.mark.parametrize("text", CASES)
def test_input_range_syntax_and_messages_are_unchanged(text):
    """The same arguments are taken, with the same values, and the same ones refused with the
    same message as by the regex it replaces."""
    old = _OLD_SYNTAX.fullmatch(text)
    try:
        got = parse_ranges([text])
    except AutocastError as exc:
        if old is None:
            assert "needs NAME=LO:HI" in exc.what
        else:
            assert "needs NAME=LO:HI" not in exc.what  # a number or range check, as before
        return
    assert old is not None
    assert got == {old.group(1): (float(old.group(2)), float(old.group(3)))}


def test_a_blank_name_is_refused_as_the_form():
    """The regex took '  =0:1' with the name ' ' (then refused as an unknown input ' ')."""
    with pytest.raises(AutocastError, match="needs NAME=LO:HI"):
        parse_ranges(["  =0:1"])


# ---- 4. convert_file: a file output spelled as a folder ----------------------------------------
@pytest.mark.parametrize(
    ("state", "fragment"),
    [
        ("missing", "output folder does not exist"),
        ("file", "ends in a separator but is not a folder"),
        ("folder", "output path is a folder"),
    ],
)
def test_convert_file_refuses_an_output_ending_in_a_separator_like_the_cli(tmp_path, state, fragment):
    """convert_file(model, 'missing/') wrote a file named 'missing': Path() dropped the separator
    before the output checks saw it."""
    src = write_model(_mlp(), tmp_path / "m.onnx")
    target = tmp_path / "dest"
    if state == "file":
        target.write_bytes(b"keep")
    elif state == "folder":
        target.mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(AutocastError, match=fragment):
        convert_file(src, str(target) + "/")
    assert snapshot(tmp_path) == before
    assert_one_error(invoke(["convert", src, "-o", str(target) + "/"]), fragment)


# ---- 5. nesting deeper than protobuf reads -----------------------------------------------------
def _nested_if_bytes(depth: int) -> bytes:
    """If nested `depth` levels deep, serialized (protobuf writes what it cannot read back)."""
    from helpers import nested_ifs

    return nested_ifs(depth).SerializeToString()


def test_a_file_nested_deeper_than_protobuf_reads_says_so(tmp_path):
    """It was 'not an ONNX model (protobuf parse failed: truncated or corrupted?)'."""
    path = tmp_path / "deep.onnx"
    path.write_bytes(_nested_if_bytes(40))
    with pytest.raises(AutocastError, match="nested deeper than protobuf reads") as info:
        load_model(path)
    assert "truncated" not in info.value.line()
    assert_one_error(invoke(["convert", path, "-o", tmp_path / "o.onnx"]), "nested deeper than protobuf reads")


def test_a_truncated_file_is_still_called_truncated(tmp_path):
    path = tmp_path / "cut.onnx"
    path.write_bytes(_nested_if_bytes(3)[:-7])
    with pytest.raises(AutocastError, match="truncated or corrupted"):
        load_model(path)
