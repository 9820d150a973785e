"""The drop-ins for NVIDIA ModelOpt AutoCast's Python entry points (modelopt.onnx.autocast's
convert_to_mixed_precision and convert_to_f16): its parameters in its order, called as its
documentation calls them, each keyword mapped to an autocast-onnx option or refused.

ModelOpt is not installed here (it needs torch and TensorRT's tools); the signatures below are
transcribed from nvidia-modelopt 0.47.0's modelopt/onnx/autocast/convert.py, with its list
defaults ([] / ["cpu"] / {}) written as tuples or None: the same call means the same."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from autocast_onnx import compat
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "digits_cnn.onnx"

CONVERT_TO_MIXED_PRECISION = [
    ("onnx_path", inspect.Parameter.empty), ("low_precision_type", "fp16"), ("nodes_to_exclude", None),
    ("op_types_to_exclude", None), ("nodes_to_include", None), ("op_types_to_include", None), ("data_max", 512),
    ("init_max", 65504), ("keep_io_types", False), ("calibration_data", None), ("custom_rule", None),
    ("init_conversion_max_bytes", None), ("providers", ("cpu",)), ("trt_plugins", ()), ("trt_plugins_precision", ()),
    ("max_depth_of_reduction", None), ("opset", None), ("use_standalone_type_inference", False),
]  # fmt: skip
CONVERT_TO_F16 = [
    ("model", inspect.Parameter.empty), ("low_precision_type", "fp16"), ("keep_io_types", True),
    ("op_block_list", ()), ("tensor_block_dict", None), ("trt_plugins", ()),
    ("use_standalone_type_inference", False), ("opset", None),
]  # fmt: skip


def quiet(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return function(*args, **kwargs)


def io_types(m: onnx.ModelProto) -> list:
    return [v.type.tensor_type.elem_type for v in list(m.graph.input) + list(m.graph.output)]


def kept_fp32(m: onnx.ModelProto, op: str) -> int:
    """How many `op` nodes read a float32 first input (the model's own, or a Cast to float)."""
    fp32 = {v.name for v in m.graph.input if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    fp32 |= {t.name for t in m.graph.initializer if t.data_type == TensorProto.FLOAT}
    for node in m.graph.node:
        if node.op_type == "Cast" and node.attribute[0].i == TensorProto.FLOAT:
            fp32.add(node.output[0])
    produced_fp32 = set(fp32)
    for node in m.graph.node:  # a node reading fp32 writes fp32 unless it is a Cast
        if node.op_type != "Cast" and node.input and node.input[0] in produced_fp32:
            produced_fp32.update(node.output)
    return sum(1 for n in m.graph.node if n.op_type == op and n.input[0] in produced_fp32)


@pytest.mark.parametrize(
    "function,peer",
    [
        (compat.modelopt_convert_to_mixed_precision, CONVERT_TO_MIXED_PRECISION),
        (compat.modelopt_convert_to_f16, CONVERT_TO_F16),
    ],
    ids=["convert_to_mixed_precision", "convert_to_f16"],
)
def test_the_drop_ins_take_autocasts_parameters_in_its_order(function, peer):
    params = list(inspect.signature(function).parameters.values())
    assert [(p.name, p.default) for p in params] == peer
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_one_import_switches_a_script_written_for_autocast():
    """`from modelopt.onnx import autocast` -> `from autocast_onnx.compat import modelopt_autocast as autocast`."""
    autocast = compat.modelopt_autocast
    assert autocast.convert_to_mixed_precision is compat.modelopt_convert_to_mixed_precision
    assert autocast.convert_to_f16 is compat.modelopt_convert_to_f16


def test_convert_to_mixed_precision_as_autocasts_documentation_calls_it(tmp_path):
    """The documented call, with calibration data in an .npz: a valid model, float32 kept at the edges."""
    source = onnx.load(str(MODEL))
    batch = generate(plan_inputs(describe_inputs(source)), seed=0)
    np.savez(tmp_path / "calib.npz", **batch)
    out = quiet(
        compat.modelopt_convert_to_mixed_precision,
        onnx_path=str(MODEL), low_precision_type="fp16", nodes_to_exclude=None, op_types_to_exclude=None,
        data_max=512, init_max=65504, keep_io_types=True, calibration_data=str(tmp_path / "calib.npz"),
    )  # fmt: skip
    onnx.checker.check_model(out, full_check=True)
    assert io_types(out) == io_types(source)
    assert any(t.data_type == TensorProto.FLOAT16 for t in out.graph.initializer)


def test_keep_io_types_false_lowers_the_edges_as_autocast_does():
    out = quiet(compat.modelopt_convert_to_mixed_precision, MODEL)
    assert set(io_types(out)) == {TensorProto.FLOAT16}


def test_node_regexes_match_from_the_start_of_the_name_as_re_match():
    """AutoCast's nodes_to_exclude uses re.match: "conv" does not match "/conv1/Conv" there, "/conv" does."""
    names = [n.name for n in onnx.load(str(MODEL)).graph.node if n.op_type == "Conv"]
    assert names and all(re.match("/conv", n) and not re.match("conv", n) for n in names)
    plain = quiet(compat.modelopt_convert_to_mixed_precision, MODEL, keep_io_types=True)
    missed = quiet(compat.modelopt_convert_to_mixed_precision, MODEL, keep_io_types=True, nodes_to_exclude=["conv"])
    hit = quiet(compat.modelopt_convert_to_mixed_precision, MODEL, keep_io_types=True, nodes_to_exclude=["/conv"])
    assert kept_fp32(plain, "Conv") == kept_fp32(missed, "Conv") == 0
    assert kept_fp32(hit, "Conv") == len(names)


def test_op_types_and_the_bf16_type():
    out = quiet(compat.modelopt_convert_to_f16, onnx.load(str(MODEL)), op_block_list=["Gemm"])
    assert kept_fp32(out, "Gemm") == 2 and kept_fp32(out, "Conv") == 0
    bf16 = quiet(compat.modelopt_convert_to_f16, str(MODEL), low_precision_type="bf16", opset=22)
    assert bf16.opset_import[0].version == 22
    assert any(t.data_type == TensorProto.BFLOAT16 for t in bf16.graph.initializer)


def test_the_given_model_is_not_edited():
    source = onnx.load(str(MODEL))
    before = source.SerializeToString()
    quiet(compat.modelopt_convert_to_f16, source)
    assert source.SerializeToString() == before


def test_use_standalone_type_inference_does_nothing_and_says_so():
    with pytest.warns(compat.CompatWarning, match="does nothing"):
        with_it = compat.modelopt_convert_to_f16(str(MODEL), use_standalone_type_inference=True)
    without = quiet(compat.modelopt_convert_to_f16, str(MODEL))
    assert with_it.SerializeToString() == without.SerializeToString()


REFUSED = [
    ("convert_to_mixed_precision", {"data_max": 100}, "data_max"),
    ("convert_to_mixed_precision", {"init_max": 1e4}, "init_max"),
    ("convert_to_mixed_precision", {"custom_rule": object()}, "custom_rule"),
    ("convert_to_mixed_precision", {"init_conversion_max_bytes": 1024}, "init_conversion_max_bytes"),
    ("convert_to_mixed_precision", {"trt_plugins": ["libplugin.so"]}, "trt_plugins"),
    ("convert_to_mixed_precision", {"trt_plugins_precision": ["MyOp:fp16"]}, "trt_plugins_precision"),
    ("convert_to_mixed_precision", {"max_depth_of_reduction": 4}, "max_depth_of_reduction"),
    ("convert_to_mixed_precision", {"providers": ["tpu"]}, "providers"),
    ("convert_to_mixed_precision", {"low_precision_type": "fp8"}, "low_precision_type"),
    ("convert_to_mixed_precision", {"nodes_to_exclude": ["("]}, "nodes_to_exclude"),
    ("convert_to_mixed_precision", {"op_types_to_exclude": ["Softmaxx"]}, "op_types_to_exclude"),
    ("convert_to_mixed_precision", {"onnx_path": 7}, "onnx_path"),
    ("convert_to_f16", {"tensor_block_dict": {"Resize": {"inputs": [2]}}}, "tensor_block_dict"),
    ("convert_to_f16", {"keep_io_types": "yes"}, "keep_io_types"),
]


@pytest.mark.parametrize("which,change,where", REFUSED, ids=[f"{w}-{k}" for w, _, k in REFUSED])
def test_what_autocast_does_differently_is_refused_naming_the_keyword(which, change, where):
    function = getattr(compat.modelopt_autocast, which)
    first = {"onnx_path": str(MODEL)} if which == "convert_to_mixed_precision" else {"model": str(MODEL)}
    with pytest.raises(AutocastError) as err:
        quiet(function, **{**first, **change})
    assert err.value.where == where and "\n" not in err.value.line()


def test_the_migration_page_names_every_keyword():
    text = (ROOT / "docs" / "migrating.md").read_text(encoding="utf-8")
    for function in (compat.modelopt_convert_to_mixed_precision, compat.modelopt_convert_to_f16):
        for name in inspect.signature(function).parameters:
            assert re.search(rf"`{name}\b", text), f"{function.__name__}'s {name} is not in docs/migrating.md"
