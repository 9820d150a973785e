"""Sequence- and optional-typed values (issue 26, follow-up). A sequence's element type is never
changed by the conversion, so the tensors that go into a sequence or come out of one keep the
element type, with casts at the tensor boundary. It used to relabel the output of a SequenceAt
reading an fp32 sequence to fp16 (and a SequenceConstruct's inputs), which ONNX Runtime refuses,
while `--check basic`, `validate` (emulated numerics: PASS) and `diagnose` (a local model with a
sequence input of type -1) did not say so."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, invoke
from helpers import F32, check, node_by_name, ops, parse, randn, run

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.core import ValidateOptions, validate

W = randn([8, 8], 1, 0.3)
SEQ = [randn([2, 8], 5), randn([2, 8], 6)]
PRECISIONS = ("fp16", "bf16")


def seq_at(declared: bool = True) -> onnx.ModelProto:
    """A sequence graph input, one tensor of it taken out by SequenceAt and fed to a MatMul; with
    `declared` the tensor has a value_info (how exporters and shape inference leave it)."""
    info = "<float[2,8] x>" if declared else ""
    return parse(
        f"""
        g (seq(float[2,8]) s) => (float[2,8] y) {info} {{
            idx = Constant <value = int64 {{1}}> ()
            [at] x = SequenceAt(s, idx)
            [mm] y = MatMul(x, w)
        }}""",
        w=W,
    )


def split_at() -> onnx.ModelProto:
    """SplitToSequence -> SequenceAt -> MatMul, between MatMuls."""
    m = parse(
        """
        g (float[4,8] a) => (float[2,8] y) {
            [mm0] h = MatMul(a, w)
            [split] s = SplitToSequence <axis = 0> (h, parts)
            idx = Constant <value = int64 {1}> ()
            [at] z = SequenceAt(s, idx)
            [mm] y = MatMul(z, w)
        }""",
        w=W,
        parts=np.array([2, 2], dtype=np.int64),
    )
    return onnx.shape_inference.infer_shapes(m)  # the sequence and its tensors declared


def construct_concat(infer: bool = True) -> onnx.ModelProto:
    """SequenceConstruct of two MatMul results -> ConcatFromSequence -> MatMul (no Loop)."""
    m = parse(
        """
        g (float[2,8] a, float[2,8] b) => (float[4,8] y) {
            [mm0] ha = MatMul(a, w)
            [mm1] hb = MatMul(b, w)
            [cons] s = SequenceConstruct(ha, hb)
            [cat] c = ConcatFromSequence <axis = 0> (s)
            [mm] y = MatMul(c, w)
        }""",
        w=W,
    )
    return onnx.shape_inference.infer_shapes(m) if infer else m


def optional_get() -> onnx.ModelProto:
    """Optional -> OptionalGetElement -> MatMul (opset 18)."""
    m = parse(
        """
        g (float[2,8] a) => (float[2,8] y) {
            [mm0] h = MatMul(a, w)
            [opt] o = Optional(h)
            [get] c = OptionalGetElement(o)
            [mm] y = MatMul(c, w)
        }""",
        opset=18,
        w=W,
    )
    return onnx.shape_inference.infer_shapes(m)


FEEDS = {
    "seq_at": {"s": SEQ},
    "split_at": {"a": randn([4, 8], 7)},
    "construct_concat": {"a": randn([2, 8], 8), "b": randn([2, 8], 9)},
    "optional_get": {"a": randn([2, 8], 10)},
}
MODELS = {"seq_at": seq_at, "split_at": split_at, "construct_concat": construct_concat, "optional_get": optional_get}


def loads_on_cpu(m: onnx.ModelProto) -> None:
    """ONNX Runtime's CPU provider resolves the graph (its types agree with every schema). A bf16
    model may then lack CPU kernels (NOT_IMPLEMENTED, raised only after the graph resolved)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    try:
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        assert "NOT_IMPLEMENTED" in str(exc) and "Could not find an implementation" in str(exc), str(exc)


def converted_and_checked(name: str, precision: str) -> onnx.ModelProto:
    """The conversion of MODELS[name] at `precision`, with the full checker (shape and type
    inference) and an ONNX Runtime CPU session on it."""
    result = autocast_onnx.convert(MODELS[name](), precision=precision, check="full")
    check(result.model)
    loads_on_cpu(result.model)
    return result.model


def close_to_fp32(name: str, converted: onnx.ModelProto) -> None:
    feeds = FEEDS[name]
    want = run(MODELS[name](), feeds)[0]
    got = run(converted, feeds)[0].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=0.02, atol=0.02)


@pytest.mark.parametrize("name", ["seq_at", "split_at", "construct_concat"])
def test_converted_model_loads_at_fp16_and_bf16_and_matches_fp32(name):
    """A sequence's element type is never changed: the node that takes a tensor out of an fp32
    sequence gives fp32 (a Cast feeds the fp16 MatMul), and tensors put into one are cast back.
    It used to relabel SequenceAt's output (and SequenceConstruct's inputs) to fp16."""
    for precision in PRECISIONS:
        converted = converted_and_checked(name, precision)
        if precision == "fp16":
            close_to_fp32(name, converted)
            assert ops(converted, "Cast"), "a cast at the tensor boundary"


def test_sequence_input_keeps_its_type_and_the_tensor_taken_out_stays_fp32():
    result = autocast_onnx.convert(seq_at(), precision="fp16", keep_io_types=False)
    m = result.model
    check(m)
    loads_on_cpu(m)
    s = next(v for v in m.graph.input if v.name == "s")
    assert s.type.sequence_type.elem_type.tensor_type.elem_type == F32
    entry = result.plan.by_name("at")[0]
    assert entry.precision == "unchanged" and entry.roles_out == "o"
    assert "sequence or optional" in entry.reasons[-1].message
    assert result.plan.by_name("mm")[0].precision == "fp16"
    cast = ops(m, "Cast")[0]
    assert cast.input[0] == "x" and node_by_name(m, "mm").input[0] == cast.output[0]


def test_undeclared_tensor_of_a_sequence_input_gets_the_sequence_element_type():
    """Without a value_info for SequenceAt's output, its type comes from the sequence's element
    type: the MatMul after it is converted (it used to be left as it was, of unknown type)."""
    result = autocast_onnx.convert(seq_at(declared=False), precision="fp16", check="full")
    assert not [w for w in result.plan.warnings if w.code == "unknown-type"], result.plan.warnings
    assert result.plan.by_name("mm")[0].precision == "fp16"
    loads_on_cpu(result.model)
    close_to_fp32("seq_at", result.model)


def test_undeclared_sequences_between_nodes_are_typed():
    """Sequences produced by nodes without value_info: their tensors' types still follow."""
    result = autocast_onnx.convert(construct_concat(infer=False), precision="fp16", check="full")
    assert {e.name: e.precision for e in result.plan.nodes if e.name} == {
        "mm0": "fp16",
        "mm1": "fp16",
        "cons": "unchanged",
        "cat": "unchanged",
        "mm": "fp16",
    }
    loads_on_cpu(result.model)
    close_to_fp32("construct_concat", result.model)


def test_optional_get_element_keeps_the_optional_type():
    for precision in PRECISIONS:
        result = autocast_onnx.convert(optional_get(), precision=precision, check="full")
        assert result.plan.by_name("get")[0].precision == "unchanged"
        assert "sequence or optional" in result.plan.by_name("get")[0].reasons[-1].message
        loads_on_cpu(result.model)


def test_a_plan_with_sequence_ops_replays(tmp_path):
    """--plan-out then --plan: the roles that keep a sequence op's tensors are accepted."""
    result = autocast_onnx.convert(split_at(), precision="fp16")
    path = tmp_path / "plan.json"
    result.plan.save(path)
    again = autocast_onnx.convert(split_at(), precision="fp16", plan=str(path), check="full")
    assert again.plan.precisions == result.plan.precisions
    loads_on_cpu(again.model)


def loop_collect() -> onnx.ModelProto:
    """A Loop whose body appends a MatMul result to a loop-carried sequence each iteration; the
    sequence is concatenated after the loop and fed to a MatMul. No value_info: the element type
    comes from the body's declared sequence input, through SequenceInsert and the Loop output."""
    return parse(
        """
        g (float[2,8] a) => (float[6,8] y) {
            trip = Constant <value = int64 {3}> ()
            cond = Constant <value = bool {1}> ()
            empty = SequenceEmpty <dtype = 1> ()
            [loop] collected = Loop(trip, cond, empty) <body = body (int64 i, bool c, seq(float) acc)
                                                                => (bool c_out, seq(float) acc_out) {
                c_out = Identity(c)
                [inner_mm] h = MatMul(a, w)
                [ins] acc_out = SequenceInsert(acc, h)
            }>
            [cat] c = ConcatFromSequence <axis = 0> (collected)
            [mm] y = MatMul(c, w)
        }""",
        w=W,
    )


def test_a_loop_that_collects_tensors_in_a_sequence():
    """The tensor put into the loop-carried fp32 sequence is cast back from fp16, the one taken
    out after the loop is fp32 and cast for the fp16 MatMul; both MatMuls convert."""
    for precision in PRECISIONS:
        result = autocast_onnx.convert(loop_collect(), precision=precision, check="full")
        got = {e.name: e.precision for e in result.plan.nodes if e.name}
        assert got == {
            "loop": "unchanged",
            "inner_mm": precision,
            "ins": "unchanged",
            "cat": "unchanged",
            "mm": precision,
        }
        assert not result.plan.warnings, result.plan.warnings
        loads_on_cpu(result.model)
        if precision == "fp16":
            feeds = {"a": randn([2, 8], 3)}
            np.testing.assert_allclose(run(result.model, feeds)[0], run(loop_collect(), feeds)[0], rtol=0.02, atol=0.02)


def test_the_rewrite_refuses_a_tensor_that_disagrees_with_its_sequence(monkeypatch):
    """The output check: with the old rule (a sequence op's tensor ports follow its precision)
    the rewrite stops with an internal error at every --check level, instead of writing a model
    that onnx.checker's structural check passes and ONNX Runtime refuses."""
    import sys

    from autocast_onnx.errors import InternalCheckError

    old_output = broken_seq_at()  # what the old rule wrote: the structural check passes it, type inference does not
    onnx.checker.check_model(old_output)
    with pytest.raises(onnx.shape_inference.InferenceError, match="SequenceAt"):
        onnx.checker.check_model(old_output, full_check=True)
    classify = sys.modules["autocast_onnx.plan.classify"]
    monkeypatch.setattr(classify, "holds_container", lambda *args: False)
    for name, fragment in (
        ("seq_at", "output 0 'x' would be fp16"),
        ("construct_concat", "input 0 'ha' would be fp16"),
    ):
        for level in ("none", "basic"):
            with pytest.raises(InternalCheckError, match=fragment):
                autocast_onnx.convert(MODELS[name](), precision="fp16", check=level)


# ---- validate and diagnose -----------------------------------------------------------------
def _save(m: onnx.ModelProto, path) -> str:
    path.write_bytes(m.SerializeToString())
    return str(path)


def broken_seq_at() -> onnx.ModelProto:
    """seq_at converted to fp16 as the converter used to write it: SequenceAt's output declared
    fp16 (its sequence is fp32) and read by the fp16 MatMul directly. ONNX Runtime refuses it."""
    return parse(
        """
        g (seq(float[2,8]) s) => (float[2,8] y) <float16[2,8] x> {
            idx = Constant <value = int64 {1}> ()
            [at] x = SequenceAt(s, idx)
            [mm] y16 = MatMul(x, w16)
            y = Cast <to = 1> (y16)
        }""",
        w16=W.astype(np.float16),
    )


@pytest.mark.parametrize("name", ["seq_at", "split_at", "construct_concat"])
def test_validate_passes_for_the_fp16_conversion_which_loads_as_it_is(tmp_path, name):
    """Emulated numerics pass, and the converted model itself loads on CPU: its speed is measured
    (the old conversion passed too, with "speed not measured: does not load")."""
    ref = _save(MODELS[name](), tmp_path / "ref.onnx")
    conv = _save(autocast_onnx.convert(MODELS[name](), precision="fp16").model, tmp_path / "conv.onnx")
    options = ValidateOptions(device="cpu", numerics="emulate", speed=True, iterations=1, warmup=0)  # timed on request
    report = validate(ref, conv, options)
    assert report["passed"], report["outputs"]
    assert report["speed"] is not None and report["speed_skipped"] is None, report["speed_skipped"]


def test_validate_with_emulation_refuses_a_converted_model_onnx_runtime_cannot_load(tmp_path):
    """Emulation computes the numbers from an fp32 rewrite of the model, which loads; the model
    itself must load too. It used to PASS (the refusal only showed in the speed line). A bf16
    model that resolves but lacks CPU kernels (NOT_IMPLEMENTED) is no refusal: it still passes."""
    ref = _save(seq_at(), tmp_path / "ref.onnx")
    conv = _save(broken_seq_at(), tmp_path / "conv.onnx")
    for speed in (False, True):
        with pytest.raises(AutocastError) as err:
            validate(ref, conv, ValidateOptions(device="cpu", numerics="emulate", speed=speed))
        assert "ONNX Runtime cannot load the converted model" in err.value.what
        assert "Type Error" in err.value.what and err.value.where == conv
    outcome = invoke(["validate", ref, conv, "--device", "cpu"])
    assert_ok(outcome, 2)
    assert "PASS" not in outcome.stdout
    assert "cannot load the converted model" in outcome.stderr and len(outcome.lines()) == 1

    ref = _save(split_at(), tmp_path / "ref16.onnx")
    conv = _save(autocast_onnx.convert(split_at(), precision="bf16").model, tmp_path / "conv16.onnx")
    options = ValidateOptions(device="cpu", numerics="emulate", speed=True, iterations=1, warmup=0)
    report = validate(ref, conv, options)
    assert report["passed"] and report["speed"] is None and "does not load" in report["speed_skipped"]


def test_diagnose_says_the_converted_model_does_not_load(tmp_path):
    """It used to fail on its own local model (a sequence input declared with type -1)."""
    ref = _save(seq_at(), tmp_path / "ref.onnx")
    conv = _save(broken_seq_at(), tmp_path / "conv.onnx")
    outcome = invoke(["diagnose", ref, conv])
    assert_ok(outcome, 2)
    said = outcome.stderr.replace(str(tmp_path), "<tmp>")  # the folder's name may hold "-1" (pytest-16)
    assert "cannot load the converted model" in said and "-1" not in said


def low_sequence_conversion() -> onnx.ModelProto:
    """construct_concat converted by hand keeping its sequence in fp16: SequenceConstruct of the
    fp16 MatMul results, ConcatFromSequence giving fp16 to the fp16 MatMul."""
    m = parse(
        """
        g (float[2,8] a, float[2,8] b) => (float[4,8] y) {
            a16 = Cast <to = 10> (a)
            b16 = Cast <to = 10> (b)
            [mm0] ha = MatMul(a16, w16)
            [mm1] hb = MatMul(b16, w16)
            [cons] s = SequenceConstruct(ha, hb)
            [cat] c = ConcatFromSequence <axis = 0> (s)
            [mm] y16 = MatMul(c, w16)
            y = Cast <to = 1> (y16)
        }""",
        w16=W.astype(np.float16),
    )
    check(m)
    loads_on_cpu(m)
    return m


def test_diagnose_recomputes_a_node_that_reads_a_sequence(tmp_path):
    """A low node whose input is a sequence (ConcatFromSequence of an fp16 sequence) is recomputed
    in diagnose's local model with its sequence input typed as a sequence (it was declared a
    tensor of type -1, which ONNX Runtime refused)."""
    ref = _save(construct_concat(infer=False), tmp_path / "ref.onnx")
    conv = _save(low_sequence_conversion(), tmp_path / "conv.onnx")
    outcome = invoke(["diagnose", ref, conv, "--report-json", "-", "-q"])
    assert_ok(outcome, 0)
    import json

    report = json.loads(outcome.stdout)
    cat = next(n for n in report["nodes"] if n["name"] == "cat")
    assert cat["precision"] == "fp16" and 0 < cat["introduced"] < 1e-2
    assert 0 < cat["introduced_exact_inputs"] < 1e-2  # recomputed, not estimated from its tensors
