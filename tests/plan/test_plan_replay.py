"""Plan contract: the plan is the only input of the rewrite, and a plan written by --plan-out,
possibly edited by hand, is replayed on the model it belongs to and refused on any other
(`autocast_onnx.convert(model, plan=...)`, `autocast-onnx convert MODEL --plan PLAN`)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from helpers import F16, F32, parse, randn

import autocast_onnx
from autocast_onnx import AutocastError, PrecisionPlan
from autocast_onnx.graph import build_index
from autocast_onnx.plan import PLAN_VERSION, index_fingerprint
from autocast_onnx.rewrite import apply_plan

MLP = """
mlp (float[2,8] x) => (float[2,8] y, int64[2] shape) {
    [fc1] h = MatMul(x, w1)
    [bias] hb = Add(h, b1)
    [act] a = Relu(hb)
    [fc2] z = MatMul(a, w2)
    [softmax] y = Softmax<axis = -1>(z)
    [shape] shape = Shape(x)
}"""


def mlp(seed=0, scale=1.0):
    return parse(MLP, w1=randn([8, 8], seed, scale), b1=randn([8], seed + 1), w2=randn([8, 8], seed + 2, scale))


def elem_type(model, name):
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    inferred = onnx.shape_inference.infer_shapes(model)
    for vi in inferred.graph.value_info:
        if vi.name == name:
            return vi.type.tensor_type.elem_type
    return None


def node_output_type(model, node_name):
    node = next(n for n in model.graph.node if n.name == node_name)
    return elem_type(model, node.output[0])


def written_plan(model, tmp_path, **kw) -> tuple[dict, object]:
    result = autocast_onnx.convert(model, **kw)
    path = tmp_path / "plan.json"
    result.plan.save(path)
    return json.loads(path.read_text()), result


def save_plan(data, tmp_path, name="edited.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def entry(data, name):
    return next(n for n in data["nodes"] if n["name"] == name)


# ------------------------------------------------------------------------------------ the contract


def test_apply_plan_needs_only_the_index_and_the_plan(tmp_path):
    """A plan read back from JSON, applied to a freshly indexed copy of the model, gives the same
    model as converting it: the classification is not needed by the rewrite."""
    model = mlp()
    _data, result = written_plan(model, tmp_path)
    plan = PrecisionPlan.load(tmp_path / "plan.json")
    fresh = onnx.ModelProto.FromString(model.SerializeToString())
    apply_plan(build_index(fresh), plan)
    assert fresh.SerializeToString() == result.model.SerializeToString()


def test_plan_file_carries_version_fingerprint_roles_and_a_legend(tmp_path):
    data, _ = written_plan(mlp(), tmp_path)
    assert data["version"] == PLAN_VERSION == 2
    assert len(data["model_fingerprint"]) == 32
    assert entry(data, "fc1")["roles_in"] == "pp" and entry(data, "fc1")["roles_out"] == "p"
    assert entry(data, "shape")["roles_in"] == "a" and entry(data, "shape")["roles_out"] == "x"
    assert set(data["vocabulary"]["roles"]) == {"p", "f", "x", "u", "a", "o"}
    assert set(data["vocabulary"]["precision"]) == {"fp16", "bf16", "fp32", "unchanged"}


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_replaying_an_unedited_plan_gives_the_same_model(tmp_path, precision):
    _, result = written_plan(mlp(), tmp_path, precision=precision)
    replayed = autocast_onnx.convert(mlp(), plan=tmp_path / "plan.json")
    assert replayed.model.SerializeToString() == result.model.SerializeToString()
    assert replayed.plan.counts() == result.plan.counts()


def test_edited_node_runs_in_the_edited_precision(tmp_path):
    data, result = written_plan(mlp(), tmp_path)
    assert entry(data, "fc2")["precision"] == "fp16"
    assert node_output_type(result.model, "fc2") == F16
    entry(data, "fc2")["precision"] = "fp32"
    replayed = autocast_onnx.convert(mlp(), plan=save_plan(data, tmp_path))
    assert node_output_type(replayed.model, "fc2") == F32
    assert node_output_type(replayed.model, "fc1") == F16  # untouched nodes keep their plan
    assert replayed.plan.by_name("fc2")[0].precision == "fp32"
    last = replayed.plan.by_name("fc2")[0].reasons[-1]  # the edit is explained by the plan file
    assert last.code == "plan-edit" and last.source.endswith("edited.json")
    # the edited model still computes the same function
    import onnxruntime as ort

    x = randn([2, 8], seed=9)
    ref = ort.InferenceSession(mlp().SerializeToString()).run(None, {"x": x})[0]
    out = ort.InferenceSession(replayed.model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(out, ref, atol=2e-2)


def test_keep_fp32_node_can_be_edited_low_and_the_model_follows(tmp_path):
    """An edit against the category (Softmax to fp16) is the user's call: the op can take fp16."""
    data, _ = written_plan(mlp(), tmp_path)
    entry(data, "softmax")["precision"] = "fp16"
    replayed = autocast_onnx.convert(mlp(), plan=save_plan(data, tmp_path))
    assert replayed.plan.by_name("softmax")[0].precision == "fp16"
    onnx.checker.check_model(replayed.model, full_check=True)


def test_fingerprint_survives_renamed_tensors_and_new_weights():
    """Re-exporting renames tensors (onnx::MatMul_12 -> onnx::MatMul_13) and retraining changes
    weights: neither changes the structure the plan describes."""
    a = mlp(seed=0)
    b = mlp(seed=5, scale=3.0)
    for node in b.graph.node:
        node.input[:] = [{"h": "h_renamed"}.get(n, n) for n in node.input]
        node.output[:] = [{"h": "h_renamed"}.get(n, n) for n in node.output]
    assert index_fingerprint(build_index(a)) == index_fingerprint(build_index(b))


# ------------------------------------------------------------------------------------ refusals


def test_plan_of_another_model_is_refused_naming_the_node(tmp_path):
    written_plan(mlp(), tmp_path)
    other = parse(
        MLP.replace("[fc2] z = MatMul(a, w2)", "[fc2] z = Mul(a, w2)"),
        w1=randn([8, 8]),
        b1=randn([8]),
        w2=randn([8, 8]),
    )
    with pytest.raises(AutocastError) as err:
        autocast_onnx.convert(other, plan=tmp_path / "plan.json")
    assert "node #3" in str(err.value) and "'fc2' (MatMul) in the plan" in str(err.value)
    assert "plan.json" in str(err.value)


def test_plan_of_a_model_with_more_nodes_is_refused(tmp_path):
    written_plan(mlp(), tmp_path)
    bigger = parse(
        MLP.replace("[act] a = Relu(hb)", "[act] a0 = Relu(hb)\n    [act2] a = Relu(a0)"),
        w1=randn([8, 8]),
        b1=randn([8]),
        w2=randn([8, 8]),
    )
    with pytest.raises(AutocastError, match="the plan has 6 nodes but the model has 7"):
        autocast_onnx.convert(bigger, plan=tmp_path / "plan.json")


def test_plan_with_same_names_but_rewired_graph_is_refused(tmp_path):
    written_plan(mlp(), tmp_path)
    rewired = parse(
        MLP.replace("[fc2] z = MatMul(a, w2)", "[fc2] z = MatMul(hb, w2)"),
        w1=randn([8, 8]),
        b1=randn([8]),
        w2=randn([8, 8]),
    )
    with pytest.raises(AutocastError, match="fingerprint mismatch"):
        autocast_onnx.convert(rewired, plan=tmp_path / "plan.json")


@pytest.mark.parametrize(
    "name,precision,message",
    [
        ("shape", "fp16", "'shape' (Shape) cannot compute in fp16: none of its tensors follows"),
        ("fc1", "bf16", "'fc1' (MatMul): precision bf16 in a plan whose target is fp16"),
        ("fc1", "fp8", "precision 'fp8' is not one of"),
    ],
)
def test_edit_to_a_precision_the_op_cannot_take_is_refused(tmp_path, name, precision, message):
    data, _ = written_plan(mlp(), tmp_path)
    entry(data, name)["precision"] = precision
    with pytest.raises(AutocastError, match=message.replace("(", r"\(").replace(")", r"\)")):
        autocast_onnx.convert(mlp(), plan=save_plan(data, tmp_path))


def test_edit_against_the_schema_is_refused():
    """Resize's `scales` is pinned fp32 by the rules; a plan that claims it follows the node and
    puts the node in fp16 is refused at that port (the schema allows only float scales)."""
    model = parse(
        """
        up (float[1,1,4,4] x) => (float[1,1,8,8] y) {
            [resize] y = Resize<mode = "nearest">(x, roi, scales)
        }""",
        roi=np.zeros(0, np.float32),
        scales=np.array([1, 1, 2, 2], np.float32),
    )
    result = autocast_onnx.convert(model)
    data = json.loads(result.plan.to_json())
    node = entry(data, "resize")
    assert node["roles_in"] == "pff"
    node["roles_in"] = "ppp"
    node["precision"] = "fp16"
    with pytest.raises(
        AutocastError,
        match=r"'resize' \(Resize\) cannot compute in fp16: its schema allows no fp16 "
        r"at input 2",
    ):
        autocast_onnx.convert(model, plan=PrecisionPlan.from_dict(data))


def test_role_on_a_non_float_tensor_is_refused(tmp_path):
    data, _ = written_plan(mlp(), tmp_path)
    entry(data, "shape")["roles_out"] = "p"
    with pytest.raises(AutocastError, match="output 0 is not a float tensor"):
        autocast_onnx.convert(mlp(), plan=save_plan(data, tmp_path))


def test_plan_version_1_is_refused_with_a_hint(tmp_path):
    data, _ = written_plan(mlp(), tmp_path)
    data["version"] = 1
    with pytest.raises(AutocastError, match=r"plan version 1 is not supported.*re-create the plan"):
        autocast_onnx.convert(mlp(), plan=save_plan(data, tmp_path))


@pytest.mark.parametrize(
    "text,message",
    [
        ("{not json", "invalid JSON"),
        ("[]", r"no \"nodes\""),
        (
            '{"version": 2, "target": "fp16", "keep_io_types": true, "model_fingerprint": "x", "nodes": [{"id": 0}]}',
            r'"name" is missing',
        ),
    ],
)
def test_malformed_plan_files_are_refused(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(AutocastError, match=message):
        autocast_onnx.convert(mlp(), plan=path)


@pytest.mark.parametrize(
    "option",
    [
        {"exclude_ops": ["Softmax"]},
        {"rules": ["x.toml"]},
        {"include_nodes": ["fc"]},
        {"precision": "bf16"},
        {"keep_io_types": False},
    ],
)
def test_planning_options_with_a_plan_are_refused(tmp_path, option):
    """Nothing silent: an option the plan overrides would do nothing, so it is an error."""
    written_plan(mlp(), tmp_path)
    with pytest.raises(AutocastError, match=r"--plan|contradicts the plan"):
        autocast_onnx.convert(mlp(), plan=tmp_path / "plan.json", **option)


def test_matching_precision_with_a_plan_is_accepted(tmp_path):
    written_plan(mlp(), tmp_path)
    assert autocast_onnx.convert(mlp(), plan=tmp_path / "plan.json", precision="fp16").plan.target == "fp16"
