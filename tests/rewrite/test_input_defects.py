"""A defect of the input is not a bug of the conversion. When the converted model fails
onnx.checker, the input is checked the same way; if it fails alike, the defect is the input's,
which the conversion kept: exit 2 with one line naming it and `--check none` (it used to be
`internal error ... this is a bug in autocast-onnx`, exit 3). A refusal the input does not share
stays a bug (exit 3)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from bad_input_helpers import PREFIX
from click.testing import CliRunner
from helpers import parse, randn

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.cli.main import cli
from autocast_onnx.errors import InternalCheckError


def _incompatible_shapes():
    """An Add of [2,8] and [3,8]: the structural check passes it, shape inference (--check full)
    does not. ONNX Runtime refuses it too, but the conversion itself never looks at shapes."""
    return parse(
        """
        g (float[2,8] x) => (float[2,8] y) {
            [fc] h = MatMul(x, w)
            [add] y = Add(h, b)
        }""",
        w=randn([8, 8], 1),
        b=randn([3, 8], 2),
    )


def _convert(path, *args):
    return CliRunner().invoke(cli, ["convert", str(path), "-o", str(path.with_name("out.onnx")), "-q", *args])


def test_full_check_refusal_the_input_shares_is_the_inputs_defect(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_incompatible_shapes(), path)
    with pytest.raises(onnx.shape_inference.InferenceError):  # the input has the defect
        onnx.checker.check_model(str(path), full_check=True)
    run = _convert(path, "--check", "full")
    assert run.exit_code == 2, run.output
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(PREFIX + str(path) + ": the input model fails onnx.checker (full check)")
    assert "--check none" in line and "internal error" not in line
    assert not path.with_name("out.onnx").exists()
    assert _convert(path, "--check", "none").exit_code == 0  # the remedy the line names


def test_the_api_blames_the_input_as_given(tmp_path):
    with pytest.raises(AutocastError, match=r"the input model fails onnx.checker"):
        autocast_onnx.convert(_incompatible_shapes(), check="full")
    path = tmp_path / "m.onnx"
    onnx.save(_incompatible_shapes(), path)
    with pytest.raises(AutocastError, match=r"the input model fails onnx.checker"):
        autocast_onnx.convert(str(path), check="full")


def test_a_refusal_the_input_does_not_share_stays_a_bug(monkeypatch, tmp_path):
    """An output the conversion broke (here: a node with an op no schema knows, added after the
    rewrite) is still exit 3: the input passes the same check."""
    from autocast_onnx import pipeline

    real = pipeline.apply_plan

    def breaking(index, plan, **kw):
        stats = real(index, plan, **kw)
        index.main.graph.node.append(onnx.helper.make_node("NoSuchOp", ["x"], ["junk"], name="junk"))
        return stats

    monkeypatch.setattr(pipeline, "apply_plan", breaking)
    model = parse("g (float[2,8] x) => (float[2,8] y) { [fc] y = MatMul(x, w) }", w=randn([8, 8], 1))
    with pytest.raises(InternalCheckError):
        autocast_onnx.convert(model)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    run = _convert(path)
    assert run.exit_code == 3 and "internal error" in run.stderr, run.output


def _relu_out(shape: str):
    return parse(
        f"""
        g (float[2,8] x) => ({shape} y) {{
            [fc] h = MatMul(x, w)
            [act] y = Relu(h)
        }}""",
        w=randn([8, 8], 1),
    )


def test_a_graph_output_declared_with_an_empty_shape_is_the_inputs_defect(tmp_path):
    """The case of the issue: `make_tensor_value_info("y", FLOAT, [])` declares rank 0 for a
    [2, 8] output. ONNX Runtime runs it (with a warning); the full check refuses input and output
    alike, which used to end in `internal error ... this is a bug`, exit 3."""
    model = _relu_out("float")
    assert len(model.graph.output[0].type.tensor_type.shape.dim) == 0
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    from helpers import run

    assert run(model, {"x": np.ones((2, 8), np.float32)})[0].shape == (2, 8)
    result = _convert(path, "--check", "full")
    assert result.exit_code == 2, result.output
    assert "differ in rank" in result.stderr and "--check none" in result.stderr
    assert _convert(path).exit_code == 0  # the structural check (basic) has nothing against it


@pytest.mark.parametrize("level", ["basic", "full"])
def test_a_graph_output_with_a_type_and_no_shape_converts(tmp_path, level):
    """A type without any shape field is what the input check accepts: it converts at every level."""
    model = _relu_out("float[2,8]")
    model.graph.output[0].type.tensor_type.ClearField("shape")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    result = _convert(path, "--check", level)
    assert result.exit_code == 0, result.output
