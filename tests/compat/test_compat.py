"""autocast_onnx.compat: the drop-ins for onnxconverter-common's and ONNX Runtime's fp16 converters.

Each peer's documented call pattern runs against the drop-in on the example models (no peer
installed: tests/compat/test_compat_peers.py compares with the peers themselves), and the behaviour
the keyword asks for is asserted: the returned ModelProto passes onnx.checker and loads in ONNX
Runtime, the inputs and outputs keep or change type as asked, blocked ops and nodes compute in
fp32, and a keyword the project does not reproduce is refused in one line naming it."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import types

from autocast_onnx import compat
from autocast_onnx.compat import CompatWarning, auto_convert_mixed_precision, convert_float_to_float16
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate import runner
from autocast_onnx.validate.emulate import emulation_model

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "examples" / "models"
F32, F16, BF16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16


def load(name: str) -> onnx.ModelProto:
    return onnx.load(str(MODELS / f"{name}.onnx"))


def io_types(m: onnx.ModelProto) -> dict:
    return {v.name: v.type.tensor_type.elem_type for v in list(m.graph.input) + list(m.graph.output)}


def compute_types(m: onnx.ModelProto) -> dict:
    """Node name -> the element type of its first output (ONNX shape inference, strict)."""
    inferred = types(m)
    return {n.name: inferred.get(n.output[0]) for n in m.graph.node}


def feeds(m: onnx.ModelProto, seed: int = 0) -> dict:
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

    return generate(plan_inputs(describe_inputs(m)), seed=seed)


def assert_valid(m: onnx.ModelProto, *, emulate: bool = False) -> list:
    """The full checker passes and ONNX Runtime loads and runs the model (bf16 through the
    project's emulation model: ONNX Runtime's CPU provider has no bf16 MatMul); its outputs."""
    onnx.checker.check_model(m, full_check=True)
    model = emulation_model(m) if emulate else m
    sess = runner.session(model.SerializeToString(), "cpu", optimize=not emulate)
    return runner.run(sess, runner.feeds_for(sess, feeds(m)))


def quiet(call, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CompatWarning)
        return call(*args, **kwargs)


# ---- the peers' call patterns ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["bert_tiny", "vit_tiny", "digits_cnn"])
def test_keep_io_types_true_keeps_every_float_input_and_output_fp32(name):
    """onnxconverter-common's README call: convert_float_to_float16(model, keep_io_types=True)."""
    source = load(name)
    out = quiet(convert_float_to_float16, source, keep_io_types=True)
    assert io_types(out) == io_types(source)
    assert F16 in set(compute_types(out).values())  # it did convert
    assert_valid(out)


def test_keep_io_types_false_gives_every_float_input_and_output_float16():
    """The peers' default: every float32 input and output becomes float16, also an output that a
    node kept fp32 computes (digits_cnn's probs, from a Softmax): a cast lowers it."""
    source = load("digits_cnn")
    out = quiet(convert_float_to_float16, source)
    assert io_types(out) == {"pixels": F16, "probs": F16}
    softmax = next(n.name for n in source.graph.node if n.op_type == "Softmax")
    assert compute_types(out)[softmax] == F32
    (probs,) = assert_valid(out)
    assert probs.dtype == np.float16


def test_ort_keep_io_types_list_keeps_the_named_ones_and_lowers_the_others():
    """ONNX Runtime's variant: keep_io_types=["input_ids", ...], a list of names."""
    source = load("bert_tiny")
    out = quiet(convert_float_to_float16, source, keep_io_types=["input_ids", "last_hidden_state"])
    got = io_types(out)
    assert got["input_ids"] == onnx.TensorProto.INT64
    assert got["last_hidden_state"] == F32 and got["pooler_output"] == F16
    assert_valid(out)


def test_op_block_list_keeps_every_node_of_the_op_fp32():
    """convert_float_to_float16(model, op_block_list=["MatMul"]): every MatMul computes fp32."""
    source = load("vit_tiny")
    matmuls = [n.name for n in source.graph.node if n.op_type == "MatMul"]
    plain = compute_types(quiet(convert_float_to_float16, source, keep_io_types=True))
    assert {plain[n] for n in matmuls} == {F16}
    out = quiet(convert_float_to_float16, source, keep_io_types=True, op_block_list=["MatMul"])
    got = compute_types(out)
    assert {got[n] for n in matmuls} == {F32}
    assert F16 in {got[n.name] for n in source.graph.node if n.op_type == "Conv"}
    assert_valid(out)


def test_op_block_list_matches_the_op_type_in_any_domain():
    """The peers compare op_type alone: a com.microsoft op named without its domain is blocked."""
    from helpers import parse, randn

    m = parse(
        """
        g (float[4,8] x) => (float[4,8] y) {
            ["fused"] h = com.microsoft.FusedMatMul(x, w)
            ["matmul"] y = MatMul(h, w)
        }""",
        domains={"com.microsoft": 1},
        w=randn([8, 8]),
    )
    plain = quiet(convert_float_to_float16, m, keep_io_types=True)
    out = quiet(convert_float_to_float16, m, keep_io_types=True, op_block_list=["FusedMatMul"])
    assert reads(plain, "fused") == F16  # (ONNX shape inference does not type com.microsoft ops)
    assert reads(out, "fused") == F32 and reads(out, "matmul") == F16
    assert_valid(out)


def reads(m: onnx.ModelProto, name: str) -> int:
    """The element type of the named node's first input: a graph input's, an initializer's, or
    the type a Cast produces it as."""
    first = next(n for n in m.graph.node if n.name == name).input[0]
    declared = {v.name: v.type.tensor_type.elem_type for v in m.graph.input}
    declared.update({t.name: t.data_type for t in m.graph.initializer})
    if first in declared:
        return declared[first]
    cast = next(n for n in m.graph.node if first in n.output)
    assert cast.op_type == "Cast", cast.op_type
    return next(a.i for a in cast.attribute if a.name == "to")


def test_peer_default_block_list_is_accepted_and_absent_ops_are_dropped():
    """`float16.DEFAULT_OP_BLOCK_LIST + ["Softmax"]` runs after the import switch: the list's
    ops that the model lacks (ZipMap, TreeEnsembleClassifier, ...) do nothing, as in the peers."""
    source = load("bert_tiny")
    out = quiet(convert_float_to_float16, source, op_block_list=compat.DEFAULT_OP_BLOCK_LIST + ["Softmax"])
    got = compute_types(out)
    assert {got[n.name] for n in source.graph.node if n.op_type == "Softmax"} == {F32}
    assert_valid(out)


def test_node_block_list_keeps_exactly_the_named_nodes_fp32():
    """node_block_list names nodes whole: '/.../self/MatMul' does not also block '.../MatMul_1'
    (the names hold regex characters; each is matched as the whole name)."""
    source = load("bert_tiny")
    blocked = "/encoder/layer.0/attention/self/MatMul"
    sibling = blocked + "_1"
    assert {blocked, sibling} <= {n.name for n in source.graph.node}
    out = quiet(convert_float_to_float16, source, keep_io_types=True, node_block_list=[blocked])
    got = compute_types(out)
    assert got[blocked] == F32 and got[sibling] == F16
    assert_valid(out)


def test_use_bfloat16_converts_to_bfloat16():
    source = load("bert_tiny")
    out = quiet(convert_float_to_float16, source, use_bfloat16=True)
    got = compute_types(out)
    assert BF16 in set(got.values()) and F16 not in set(got.values())
    assert io_types(out)["last_hidden_state"] == BF16
    assert_valid(out, emulate=True)


def test_a_path_is_converted_and_a_given_model_is_left_unchanged():
    source = load("vit_tiny")
    before = source.SerializeToString()
    from_proto = quiet(convert_float_to_float16, source, keep_io_types=True)
    assert source.SerializeToString() == before
    from_path = quiet(convert_float_to_float16, str(MODELS / "vit_tiny.onnx"), keep_io_types=True)
    assert compute_types(from_path) == compute_types(from_proto)


def test_the_peers_defaults_for_the_clamping_bounds_are_accepted():
    """Both peers' defaults (onnxconverter-common 1e-7/1e4, ONNX Runtime 5.96e-08/65504) mean
    "not given"; the project keeps out-of-range constants' nodes fp32 instead of clamping."""
    source = load("digits_cnn")
    a = quiet(convert_float_to_float16, source, 1e-7, 1e4, True)
    b = quiet(convert_float_to_float16, source, min_positive_val=5.96e-08, max_finite_val=65504.0, keep_io_types=True)
    assert compute_types(a) == compute_types(b)


def test_disable_shape_infer_chooses_whether_the_result_check_runs_shape_inference(monkeypatch):
    """disable_shape_infer=False (the default) checks the result with ONNX shape inference too
    (check="full"); True skips it (check="basic"): the planning never needs it."""
    import autocast_onnx.api

    seen = []
    real = autocast_onnx.api.convert

    def spy(model, **kw):
        seen.append(kw.get("check"))
        return real(model, **kw)

    monkeypatch.setattr(autocast_onnx.api, "convert", spy)
    quiet(convert_float_to_float16, load("digits_cnn"))
    quiet(convert_float_to_float16, load("digits_cnn"), disable_shape_infer=True)
    assert seen == ["full", "basic"]


def test_check_fp16_ready_refuses_a_converted_model_unless_turned_off():
    converted = quiet(convert_float_to_float16, load("digits_cnn"))
    with pytest.raises(AutocastError) as err:
        quiet(convert_float_to_float16, converted)
    assert err.value.where == "check_fp16_ready" and "check_fp16_ready=False" in err.value.hint
    again = quiet(convert_float_to_float16, converted, check_fp16_ready=False)
    assert_valid(again)


def test_plan_warnings_reach_the_caller_as_python_warnings():
    """A node_block_list name no node has does nothing: the plan's warning is issued."""
    with pytest.warns(CompatWarning, match="no_such_node.*matches no node"):
        convert_float_to_float16(load("vit_tiny"), node_block_list=["no_such_node"])


def test_runtime_plans_for_the_cuda_kernels():
    """BatchNormalization's parameters follow its fp16 data where their values survive it (plan/batchnorm.py), the
    one form ONNX Runtime's CUDA kernel takes: with runtime= or without, resnet_tiny's run fp16 with no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatWarning)
        plain = convert_float_to_float16(load("resnet_tiny"), keep_io_types=True)
        cuda = convert_float_to_float16(load("resnet_tiny"), keep_io_types=True, runtime="cuda")

    def bn_types(m):
        return {types(m)[name] for n in m.graph.node if n.op_type == "BatchNormalization" for name in n.input}

    assert bn_types(plain) == {F16} and bn_types(cuda) == {F16}
    with pytest.raises(AutocastError, match="unknown runtime 'rocm'"):
        convert_float_to_float16(load("resnet_tiny"), runtime="rocm")


REFUSED = [
    ({"min_positive_val": 1e-4}, "min_positive_val", "clamp"),
    ({"max_finite_val": 100.0}, "max_finite_val", "clamp"),
    ({"max_finite_val": "big"}, "max_finite_val", "not a number"),
    ({"force_fp16_initializers": True}, "force_fp16_initializers", "weights of fp32 nodes"),
    ({"force_fp16_inputs": {"Resize": [2]}}, "force_fp16_inputs", "[pins]"),
    ({"use_bfloat16_as_blocked_nodes_dtype": True}, "use_bfloat16_as_blocked_nodes_dtype", "fp32"),
    ({"keep_io_types": "yes"}, "keep_io_types", "list of names"),
    ({"keep_io_types": ["pixel"]}, "keep_io_types", "'pixel' is not an input or output"),
    ({"op_block_list": "Softmax"}, "op_block_list", "not a list of names"),
    ({"op_block_list": ["Softmaxx"]}, "op_block_list", "'Softmaxx'"),
    ({"node_block_list": [3]}, "node_block_list", "not a list of names"),
    ({"use_bfloat16": "yes"}, "use_bfloat16", "True or False"),
]


@pytest.mark.parametrize("keywords,where,fragment", REFUSED, ids=[r[1] + "-" + r[2] for r in REFUSED])
def test_keywords_the_project_does_not_reproduce_are_refused_in_one_line(keywords, where, fragment):
    with pytest.raises(AutocastError) as err:
        convert_float_to_float16(load("digits_cnn"), **keywords)
    line = err.value.line()
    assert err.value.where == where and fragment in line and "\n" not in line and err.value.hint


# The peers' signatures (onnxconverter-common 1.16 float16.py and auto_mixed_precision.py, ONNX
# Runtime's transformers/float16.py): every parameter that can be passed by position, with its
# default. tests/compat/test_compat_peers.py holds the drop-ins to the peers' own inspect.signature.
ONNXCONVERTER_COMMON_FLOAT16 = [
    ("model", inspect.Parameter.empty), ("min_positive_val", 1e-7), ("max_finite_val", 1e4),
    ("keep_io_types", False), ("disable_shape_infer", False), ("op_block_list", None), ("node_block_list", None),
    ("check_fp16_ready", True),
]  # fmt: skip
ONNXRUNTIME_FLOAT16 = [
    *ONNXCONVERTER_COMMON_FLOAT16[:1], ("min_positive_val", 5.96e-08), ("max_finite_val", 65504.0),
    *ONNXCONVERTER_COMMON_FLOAT16[3:7], ("force_fp16_initializers", False), ("force_fp16_inputs", None),
    ("use_bfloat16_as_blocked_nodes_dtype", False),
]  # fmt: skip
AUTO_MIXED_PRECISION = [
    ("model", inspect.Parameter.empty), ("feed_dict", inspect.Parameter.empty), ("validate_fn", None),
    ("rtol", None), ("atol", None), ("keep_io_types", False),
]  # fmt: skip


def positional(function) -> list:
    """(name, default) of each parameter of `function` that can be passed by position."""
    params = inspect.signature(function).parameters.values()
    return [(p.name, p.default) for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]


@pytest.mark.parametrize(
    "function,peer",
    [
        (convert_float_to_float16, ONNXCONVERTER_COMMON_FLOAT16),
        (compat.onnxruntime_convert_float_to_float16, ONNXRUNTIME_FLOAT16),
        (auto_convert_mixed_precision, AUTO_MIXED_PRECISION),
    ],
    ids=["onnxconverter-common-float16", "onnxruntime-float16", "auto-mixed-precision"],
)
def test_each_drop_in_takes_its_peers_positional_parameters_and_only_those(function, peer):
    """Positional order and defaults are the peer's; what the drop-in adds (use_bfloat16,
    runtime, and in onnxconverter-common's the ONNX Runtime keywords) is keyword-only, so no
    positional value can mean something else than in the peer."""
    assert positional(function) == peer
    extra = [p for p in inspect.signature(function).parameters.values() if p.name not in dict(peer)]
    assert extra and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)
    assert compat.onnxruntime_float16.convert_float_to_float16 is compat.onnxruntime_convert_float_to_float16


def test_one_import_switches_a_script_written_for_onnxconverter_common():
    """`from autocast_onnx import compat as float16` / `as auto_mixed_precision` keep the
    script's own names working."""
    float16 = compat
    auto_mixed_precision = compat
    assert "Softmax" not in float16.DEFAULT_OP_BLOCK_LIST and "TopK" in float16.DEFAULT_OP_BLOCK_LIST
    assert callable(float16.convert_float_to_float16) and callable(auto_mixed_precision.auto_convert_mixed_precision)


# ---- auto_convert_mixed_precision -------------------------------------------------------------


def largest_relative_error(source: onnx.ModelProto, converted: onnx.ModelProto, batch: dict) -> float:
    """max |converted - fp32| / max |fp32| over the outputs, low precision emulated (rtol's measure)."""
    ref = runner.run(runner.session(source.SerializeToString(), "cpu"), batch)
    emu = runner.session(emulation_model(converted).SerializeToString(), "cpu", optimize=False)
    got = runner.run(emu, runner.feeds_for(emu, batch))
    return max(float(np.abs(g.astype(np.float64) - r).max() / np.abs(r).max()) for r, g in zip(ref, got))


def fp32_nodes(m: onnx.ModelProto) -> int:
    return sum(1 for t in compute_types(m).values() if t == F32)


def test_auto_convert_mixed_precision_meets_rtol_on_feed_dict_and_keeps_more_fp32_when_tighter():
    """auto_convert_mixed_precision(model, feed_dict, rtol=..., keep_io_types=True): the accuracy
    search keeps the fewest nodes fp32 that meet rtol on feed_dict; a tighter rtol keeps more."""
    source = load("vit_tiny")
    batch = feeds(source, seed=3)
    plain = quiet(convert_float_to_float16, source, keep_io_types=True)
    loose_error = largest_relative_error(source, plain, batch)
    tight = loose_error / 4
    out = quiet(auto_convert_mixed_precision, source, batch, rtol=tight, keep_io_types=True)
    assert io_types(out) == io_types(source)
    assert largest_relative_error(source, out, batch) <= tight
    assert fp32_nodes(out) > fp32_nodes(plain)
    assert_valid(out)


def test_auto_convert_mixed_precision_with_atol_and_float16_io():
    source = load("digits_cnn")
    batch = feeds(source, seed=1)
    out = quiet(auto_convert_mixed_precision, source, batch, rtol=0.05, atol=0.05)
    assert io_types(out) == {"pixels": F16, "probs": F16}
    assert_valid(out)


AUTO_REFUSED = [
    ({}, "rtol", "no accuracy criterion"),
    ({"rtol": -1.0}, "rtol", "positive"),
    ({"rtol": 1e-12}, "rtol", "cannot be met"),
    ({"rtol": 0.01, "feed": {"x": np.zeros((1, 1, 8, 8), np.float32)}}, "feed_dict", "missing input"),
    ({"rtol": 0.01, "feed": {}}, "feed_dict", "non-empty mapping"),
]


@pytest.mark.parametrize("keywords,where,fragment", AUTO_REFUSED, ids=[r[1] + "-" + r[2] for r in AUTO_REFUSED])
def test_auto_convert_mixed_precision_refusals_name_the_keyword(keywords, where, fragment):
    source = load("digits_cnn")
    batch = keywords.pop("feed", None)
    batch = feeds(source) if batch is None else batch
    with pytest.raises(AutocastError) as err:
        quiet(auto_convert_mixed_precision, source, batch, **keywords)
    line = err.value.line()
    assert err.value.where == where and fragment in line and "\n" not in line and "feed_dict.npz" not in line


# ---- docs/migrating.md -----------------------------------------------------------------------


def test_every_keyword_of_the_drop_ins_is_in_the_migration_page():
    text = (ROOT / "docs" / "migrating.md").read_text(encoding="utf-8")
    for function in (
        convert_float_to_float16,
        compat.onnxruntime_convert_float_to_float16,
        auto_convert_mixed_precision,
        compat.auto_convert_mixed_precision_model_path,
    ):
        for name in inspect.signature(function).parameters:
            assert re.search(rf"`{name}\b", text), f"{function.__name__}'s {name} is not in docs/migrating.md"
