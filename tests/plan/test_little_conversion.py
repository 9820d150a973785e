"""A conversion that leaves most of the MatMul/Gemm/Conv work fp32 says so. `--precision bf16` on a
CNN below opset 22 (Conv has no bf16 before it) used to print "converted to bf16" with 0.0 % of
the multiply-accumulates in bf16 and no warning. Now the plan carries a `little-conversion`
warning with the share, the reason that keeps the work fp32 and the opset that would allow it,
and convert's summary, the plan file and check all show it."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx.cli.main import cli


def _cnn(opset=17, shaped=True):
    """Two Convs and a Gemm head: most of the work in the Convs."""
    x = "float[1,3,16,16] x" if shaped else "float x"
    return parse(
        f"""
        g ({x}) => (float[1,10] y) {{
            [conv1] a = Conv<pads = [1, 1, 1, 1]>(x, w1)
            [relu1] b = Relu(a)
            [conv2] c = Conv<pads = [1, 1, 1, 1]>(b, w2)
            [pool] p = GlobalAveragePool(c)
            [flat] f = Flatten(p)
            [fc] y = Gemm<transB = 1>(f, w3)
        }}""",
        opset=opset,
        w1=randn([16, 3, 3, 3], 1, 0.2),
        w2=randn([16, 16, 3, 3], 2, 0.1),
        w3=randn([10, 16], 3, 0.2),
    )


def _little(result):
    return [w for w in result.plan.warnings if w.code == "little-conversion"]


def test_bf16_conv_below_opset_22_warns_with_share_reason_and_remedy():
    result = autocast_onnx.convert(_cnn(), precision="bf16")
    (warning,) = _little(result)
    text = warning.message
    assert "of the MatMul/Gemm/Conv work" in text and "multiply-accumulates" in text and "runs in bf16" in text
    assert "'schema'" in text and "Conv" in text
    assert "from opset 22" in text and "pass --opset 22 to upgrade the model first" in text


def test_counted_by_node_when_shapes_are_unknown():
    result = autocast_onnx.convert(_cnn(shaped=False), precision="bf16")
    (warning,) = _little(result)
    assert "MatMul/Gemm/Conv nodes (counted by node" in warning.message and "opset 22" in warning.message


def test_no_warning_when_most_work_is_low_or_the_user_excluded_it():
    assert not _little(autocast_onnx.convert(_cnn()))  # fp16: every Conv low
    assert not _little(autocast_onnx.convert(_cnn(opset=22), precision="bf16"))
    assert not _little(autocast_onnx.convert(_cnn(), exclude_ops=["Conv"]))  # what was asked


def test_convert_summary_plan_file_and_check_show_it(tmp_path):
    path = tmp_path / "cnn.onnx"
    path.write_bytes(_cnn().SerializeToString())
    run = CliRunner().invoke(
        cli,
        [
            "convert",
            str(path),
            "-o",
            str(tmp_path / "o.onnx"),
            "--precision",
            "bf16",
            "--plan-out",
            str(tmp_path / "plan.json"),
            "-v",
        ],
    )
    assert run.exit_code == 0, run.output
    assert "little-conversion" in run.output or "runs in bf16" in run.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert any(w["code"] == "little-conversion" for w in plan["warnings"])
    result = autocast_onnx.check(str(path), precision="bf16", speed=False)
    assert "runs in bf16" in json.dumps(result.report)


def _batchnorm_stack(opset: int, layers: int = 3):
    """`layers` BatchNormalization nodes in a row on an fp32 image, at `opset`, with a scale of
    1e-40 that no low type holds (so the parameters stay fp32: plan/batchnorm.py)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for k in range(layers):
        names = [f"{p}{k}" for p in ("scale", "bias", "mean", "var")]
        for name, value in zip(names, (1e-40, 0.0, 0.0, 1.0)):
            inits.append(numpy_helper.from_array(np.full(4, value, np.float32), name))
        nodes.append(helper.make_node("BatchNormalization", [prev, *names], [f"bn{k}"], name=f"bn{k}"))
        prev = f"bn{k}"
    graph = helper.make_graph(
        nodes,
        "bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _leaky_stack(opset: int, layers: int = 3):
    """MatMul -> LeakyRelu x `layers` -> MatMul at `opset`: LeakyRelu's schema has bfloat16 only
    from opset 16."""
    from onnx import helper, numpy_helper

    nodes, prev = [helper.make_node("MatMul", ["x", "w"], ["m0"], name="mm0")], "m0"
    for k in range(layers):
        nodes.append(helper.make_node("LeakyRelu", [prev], [f"l{k}"], name=f"leaky{k}"))
        prev = f"l{k}"
    nodes.append(helper.make_node("MatMul", [prev, "w"], ["y"], name="mm1"))
    graph = helper.make_graph(
        nodes,
        "leaky",
        [helper.make_tensor_value_info("x", 1, [4, 8])],
        [helper.make_tensor_value_info("y", 1, [4, 8])],
        [numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_ops_a_later_opset_would_convert_warn_with_that_opset():
    """LeakyRelu has bfloat16 only from opset 16: before, every one stays fp32 for its schema, and
    the plan says so once, with the opset that would let them convert."""
    for opset in (13, 15):
        plan = autocast_onnx.convert(_leaky_stack(opset), precision="bf16").plan
        found = [w.message for w in plan.warnings if w.code == "schema-limited"]
        assert len(found) == 1 and "3 LeakyRelu node(s) stay fp32" in found[0], (opset, found)
        assert "opset 16 lets them run in bf16" in found[0], found[0]
    plan = autocast_onnx.convert(_leaky_stack(16), precision="bf16").plan  # the schema admits it
    assert not [w for w in plan.warnings if w.code == "schema-limited"]


def test_batchnorm_whose_parameters_do_not_survive_is_offered_no_opset():
    """A BatchNormalization whose parameters no low type holds runs fp32 whole at every opset
    (plan/batchnorm.py): no later opset would let it convert, so nothing suggests one."""
    for opset, precision in ((11, "fp16"), (14, "fp16"), (13, "bf16"), (15, "fp16")):
        plan = autocast_onnx.convert(_batchnorm_stack(opset), precision=precision).plan
        assert not [w for w in plan.warnings if w.code == "schema-limited"], (opset, precision)
