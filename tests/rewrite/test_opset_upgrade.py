"""`--opset N` upgrades the model's default-domain opset before planning (ONNX's version converter),
never unasked. It lets a BatchNormalization at opset 11 run in fp16 with fp32 parameters (opset 15)
and a CNN's Conv run in bf16 (opset 22); it refuses a downgrade, an opset the installed onnx does
not know and a node the converter cannot upgrade, naming the node; the summary and the plan file
record the change, and a replayed plan repeats it. The upgraded fp32 model computes what the
original does, and the input file is never modified."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_one_error, invoke, sha
from helpers import F16, F32, parse, randn, run, tensor
from helpers import model as make_model
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.rewrite.opset import default_opset, upgrade_opset

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "models"


def _bn(opset=11):
    """Conv -> BatchNormalization -> Relu: BN takes fp16 data with fp32 parameters only from 15. One
    channel's scale (1e-9) flushes in fp16, so the parameters stay fp32 (plan/batchnorm.py)."""
    c = 4
    return parse(
        """
        g (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            [conv] a = Conv<pads = [1, 1, 1, 1]>(x, w)
            [bn] b = BatchNormalization(a, scale, bias, mean, var)
            [relu] y = Relu(b)
        }""",
        opset=opset,
        w=randn([c, 3, 3, 3], 1, 0.2),
        scale=np.array([1e-9] + [1.0] * (c - 1), np.float32),
        bias=np.zeros(c, np.float32),
        mean=randn([c], 2, 0.1),
        var=np.full(c, 0.5, np.float32),
    )


def _cnn(opset=17):
    return parse(
        """
        g (float[1,3,16,16] x) => (float[1,10] y) {
            [conv1] a = Conv<pads = [1, 1, 1, 1]>(x, w1)
            [relu1] b = Relu(a)
            [conv2] c = Conv<pads = [1, 1, 1, 1]>(b, w2)
            [pool] p = GlobalAveragePool(c)
            [flat] f = Flatten(p)
            [fc] y = Gemm<transB = 1>(f, w3)
        }""",
        opset=opset,
        w1=randn([16, 3, 3, 3], 1, 0.2),
        w2=randn([16, 16, 3, 3], 2, 0.1),
        w3=randn([10, 16], 3, 0.2),
    )


def _scan_with_lengths():
    """A Scan at opset 8 with its sequence_lens input: opset 9 dropped that input, and ONNX's
    version converter cannot carry such a node over ("Unsupported conversion to opset 9")."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"], name="acc"),
            helper.make_node("Identity", ["s_out"], ["y_t"], name="copy"),
        ],
        "body",
        [tensor("s_in", F32, [2]), tensor("x_t", F32, [2])],
        [tensor("s_out", F32, [2]), tensor("y_t", F32, [2])],
    )
    scan = helper.make_node(
        "Scan", ["lens", "s0", "xs"], ["s_final", "ys"], name="running_sum", body=body, num_scan_inputs=1
    )
    relu = helper.make_node("Relu", ["s_final"], ["out"], name="act")
    inputs = [tensor("lens", TensorProto.INT32, [1]), tensor("s0", F32, [1, 2]), tensor("xs", F32, [1, 3, 2])]
    return make_model([scan, relu], inputs, [tensor("out", F32, [1, 2]), tensor("ys", F32, [1, 3, 2])], opset=8)


def _by_name(result, name):
    (entry,) = [n for n in result.plan.nodes if n.name == name]
    return entry


def _save(m, path: Path) -> Path:
    onnx.save(m, path)
    return path


# ---- what the upgrade gains ----------------------------------------------------------------------
def test_batchnorm_whose_parameters_flush_is_not_offered_the_opset_15_upgrade():
    # Opset 15 lets BatchNormalization take fp16 data beside fp32 parameters, but ONNX Runtime's
    # CUDA provider has no such kernel (a CPU fallback): a node whose parameters do not survive fp16
    # runs fp32 whole at any opset (plan/batchnorm.py), so no warning suggests the upgrade.
    before = autocast_onnx.convert(_bn(11))
    assert _by_name(before, "bn").precision == "fp32"
    assert not [w for w in before.plan.warnings if w.code == "schema-limited"]
    result = autocast_onnx.convert(_bn(11), opset=15)
    assert _by_name(result, "bn").precision in ("fp32", "unchanged")
    out = result.model
    assert default_opset(out) == 15
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert all(types[name] == TensorProto.FLOAT for name in ("scale", "bias", "mean", "var"))
    x = randn([1, 3, 8, 8], 5)
    (want,) = run(_bn(11), {"x": x})
    (got,) = run(out, {"x": x})
    assert np.abs(got - want).max() < 1e-2


def test_batchnorm_whose_parameters_survive_runs_fp16_whole_at_opset_11():
    m = _bn(11)
    for t in m.graph.initializer:
        if t.name == "scale":
            t.CopyFrom(numpy_helper.from_array(np.ones(4, np.float32), "scale"))
    result = autocast_onnx.convert(m)
    assert _by_name(result, "bn").precision == "fp16"
    types = {t.name: t.data_type for t in result.model.graph.initializer}
    assert all(types[name] == TensorProto.FLOAT16 for name in ("scale", "bias", "mean", "var"))


def test_cnn_at_opset_17_puts_conv_in_bf16_with_opset_22():
    before = autocast_onnx.convert(_cnn(17), precision="bf16")
    assert _by_name(before, "conv1").precision == "fp32"
    result = autocast_onnx.convert(_cnn(17), precision="bf16", opset=22)
    assert [_by_name(result, n).precision for n in ("conv1", "conv2")] == ["bf16", "bf16"]
    assert not [w for w in result.plan.warnings if w.code == "little-conversion"]
    assert default_opset(result.model) == 22
    onnx.checker.check_model(result.model, full_check=True)


def test_the_warnings_suggest_opset_but_nothing_upgrades_unasked():
    result = autocast_onnx.convert(_cnn(17), precision="bf16")
    (little,) = [w for w in result.plan.warnings if w.code == "little-conversion"]
    assert "pass --opset 22 to upgrade the model first" in little.message
    assert default_opset(result.model) == 17 and result.plan.opset is None


# ---- refusals --------------------------------------------------------------------------------------
def test_a_downgrade_is_refused(tmp_path):
    path = _save(_cnn(17), tmp_path / "m.onnx")
    line = assert_one_error(invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "13"]))
    assert "--opset 13 would downgrade the model from opset 17" in line
    assert not (tmp_path / "o.onnx").exists()


def test_an_opset_onnx_does_not_know_is_refused(tmp_path):
    path = _save(_cnn(17), tmp_path / "m.onnx")
    known = onnx.defs.onnx_opset_version()
    line = assert_one_error(invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", known + 1]))
    assert f"knows opsets up to {known}" in line


def test_a_node_the_converter_cannot_upgrade_is_refused_by_name(tmp_path):
    path = _save(_scan_with_lengths(), tmp_path / "scan.onnx")
    for command in (["convert", path, "-o", tmp_path / "o.onnx"], ["explain", path, "act"]):
        line = assert_one_error(invoke([*command, "--opset", "13"]))
        assert "node 'running_sum' (Scan)" in line and "from opset 8" in line and "drop --opset" in line


def test_an_opset_the_model_has_is_said_not_silent():
    result = autocast_onnx.convert(_cnn(17), opset=17)
    assert result.plan.opset is None
    assert any(w.code == "opset" and "already at opset 17" in w.message for w in result.plan.warnings)


@pytest.mark.parametrize("value", [0, "22", True, 2.5])
def test_a_bad_opset_value_is_refused(value):
    with pytest.raises(AutocastError, match="--opset"):
        autocast_onnx.convert(_cnn(17), opset=value)


# ---- the record --------------------------------------------------------------------------------------
def test_summary_and_plan_file_record_the_change_and_replay_repeats_it(tmp_path):
    path = _save(_cnn(17), tmp_path / "m.onnx")
    plan = tmp_path / "plan.json"
    ok = invoke(
        ["convert", path, "-o", tmp_path / "o.onnx", "--precision", "bf16", "--opset", "22", "--plan-out", plan]
    )
    assert ok.code == 0, ok.stderr
    assert "opset upgraded: 17 -> 22" in ok.stdout
    assert json.loads(plan.read_text())["opset"] == {"from": 17, "to": 22}
    replayed = invoke(["convert", path, "-o", tmp_path / "r.onnx", "--plan", plan])
    assert replayed.code == 0, replayed.stderr
    assert sha(tmp_path / "r.onnx") == sha(tmp_path / "o.onnx")
    # beside a replayed plan --opset is compared: the API refuses one that differs
    with pytest.raises(AutocastError, match="--opset 21 contradicts the plan"):
        autocast_onnx.convert(path, plan=plan, opset=21)
    assert autocast_onnx.convert(path, plan=plan, opset=22).plan.opset == {"from": 17, "to": 22}


def test_a_plan_file_with_a_bad_opset_record_is_refused(tmp_path):
    result = autocast_onnx.convert(_cnn(17), opset=22)
    data = result.plan.to_dict() | {"opset": {"from": 22, "to": 17}}
    with pytest.raises(AutocastError, match='"opset": an upgrade'):
        autocast_onnx.PrecisionPlan.from_dict(data)


# ---- surfaces: configuration key, API keyword, check, lint -------------------------------------------
def test_configuration_key(tmp_path, monkeypatch):
    path = _save(_cnn(17), tmp_path / "m.onnx")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "autocast-onnx.toml").write_text('precision = "bf16"\nopset = 22\n')
    ok = invoke(["convert", path, "-o", tmp_path / "o.onnx"])
    assert ok.code == 0, ok.stderr
    assert default_opset(onnx.load(tmp_path / "o.onnx")) == 22
    (tmp_path / "autocast-onnx.toml").write_text('opset = "22"\n')
    assert_one_error(invoke(["convert", path, "-o", tmp_path / "o2.onnx"]), "opset must be a whole number")


def test_api_keyword_on_explain_and_lint():
    entries = autocast_onnx.explain(_cnn(17), op="Conv", precision="bf16", opset=22)
    assert [n.precision for n in entries] == ["bf16", "bf16"]
    assert [n.precision for n in autocast_onnx.explain(_cnn(17), op="Conv", precision="bf16")] == ["fp32", "fp32"]
    report = autocast_onnx.lint(_cnn(17), precision="bf16", opset=22)
    assert report.results  # linted the upgraded copy
    with pytest.raises(AutocastError, match="downgrade"):
        autocast_onnx.lint(_cnn(17), opset=12)


def test_check_takes_opset(tmp_path):
    path = _save(_bn(11), tmp_path / "m.onnx")
    out = invoke(["check", path, "-o", tmp_path / "o.onnx", "--opset", "15", "--no-speed"])
    assert out.code in (0, 1), out.stderr
    assert default_opset(onnx.load(tmp_path / "o.onnx")) == 15


# ---- the upgraded model is the same model -------------------------------------------------------------
def _feeds(m: onnx.ModelProto, seed=0) -> dict:
    """Inputs for the example models: floats standard normal, integers small ids (masks and token
    types 0 or 1), open dims 2."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in m.graph.input:
        t = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in t.shape.dim]
        if t.elem_type == TensorProto.FLOAT:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        else:
            feeds[value.name] = rng.integers(
                0, 2 if "mask" in value.name or "type" in value.name else 50, shape
            ).astype(np.int64)
    return feeds


@pytest.mark.parametrize("name", ["digits_cnn", "resnet_tiny", "bert_tiny", "gpt2_tiny", "vit_tiny"])
@pytest.mark.parametrize("opset", [19, 22])
def test_upgraded_fp32_model_computes_what_the_original_does(name, opset):
    original = onnx.load(EXAMPLES / f"{name}.onnx")
    upgraded = onnx.load(EXAMPLES / f"{name}.onnx")
    change = upgrade_opset(upgraded, opset, name)
    assert (change.before, change.after) == (17, opset) and default_opset(upgraded) == opset
    onnx.checker.check_model(upgraded, full_check=True)
    feeds = _feeds(original)
    for want, got in zip(run(original, feeds), run(upgraded, feeds), strict=True):
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# ---- inputs untouched; external data --------------------------------------------------------------------
def test_the_input_file_and_a_caller_model_are_never_modified(tmp_path):
    path = _save(_bn(11), tmp_path / "m.onnx")
    before = sha(path)
    assert invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "15"]).code == 0
    assert sha(path) == before
    m = _bn(11)
    autocast_onnx.convert(m, opset=15)
    assert default_opset(m) == 11


def test_external_weights_survive_the_upgrade(tmp_path):
    m = _bn(11)
    x = randn([1, 3, 8, 8], 7)
    (want,) = run(m, {"x": x})
    path = tmp_path / "ext.onnx"
    onnx.save(m, path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data", size_threshold=0)
    data = sha(tmp_path / "ext.data")
    out = tmp_path / "o.onnx"
    ok = invoke(["convert", path, "-o", out, "--opset", "15", "--external-data"])
    assert ok.code == 0, ok.stderr
    assert sha(tmp_path / "ext.data") == data
    (got,) = run(onnx.load(out), {"x": x})  # loads the output's own data file
    assert np.abs(got - want).max() < 1e-2


# ---- issue 36, defect 2: what the upgrade computes, keeps and says ---------------------------------
def _resize_10_linear():
    """Resize-10 in linear mode: the converter makes it a Resize-11+ with the default half_pixel
    coordinates, where Resize-10 computes asymmetric ones."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="pre"),
        helper.make_node("Resize", ["r", "scales"], ["up"], name="upsample", mode="linear"),
        helper.make_node("Neg", ["up"], ["y"], name="post"),
    ]
    scales = helper.make_tensor("scales", TensorProto.FLOAT, [4], [1, 1, 2, 2])
    return make_model(nodes, [tensor("x", F32, [1, 1, 3, 3])], [tensor("y", F32, [1, 1, 6, 6])], [scales], opset=10)


def _hardmax_11():
    """Hardmax-11 with axis 1 on a rank-3 input: one winner per row of the flattened [2, 12]; the
    converter keeps the node as Hardmax-13, which takes one winner along axis 1 alone."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="pre"),
        helper.make_node("Hardmax", ["r"], ["h"], name="pick", axis=1),
        helper.make_node("Neg", ["h"], ["y"], name="post"),
    ]
    return make_model(nodes, [tensor("x", F32, [2, 3, 4])], [tensor("y", F32, [2, 3, 4])], opset=11)


def test_resize_10_linear_is_refused_naming_the_node(tmp_path):
    """Used to exit 0 with a model whose Resize gave other pixels than the fp32 input's."""
    path = _save(_resize_10_linear(), tmp_path / "resize.onnx")
    line = assert_one_error(invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "13"]))
    assert "--opset 13: the upgraded model computes something else than the original" in line
    assert "node 'upsample' (Resize-10 -> Resize-13): its output 'up' differs by up to" in line
    assert "drop --opset" in line and not (tmp_path / "o.onnx").exists()


def test_hardmax_11_axis_is_refused_naming_the_node():
    """Used to exit 0: Hardmax-11's flattened axis became Hardmax-13's single one. The first tensor
    that disagrees names its producer ('pick'), not the later nodes it feeds."""
    with pytest.raises(AutocastError, match=r"at node 'pick' \(Hardmax-11 -> Hardmax-13\): its output 'h'"):
        autocast_onnx.convert(_hardmax_11(), opset=13)


def test_every_command_that_upgrades_makes_the_check(tmp_path):
    """convert (CLI and API), explain, check and lint --opset all go through the upgrade's check."""
    path = _save(_hardmax_11(), tmp_path / "hardmax.onnx")
    commands = [
        ["convert", path, "-o", tmp_path / "o.onnx"],
        ["explain", path, "pick"],
        ["check", path, "-o", tmp_path / "c.onnx", "--no-speed"],
        ["lint", path],
    ]
    for command in commands:
        assert_one_error(invoke([*command, "--opset", "13"]), "node 'pick' (Hardmax-11 -> Hardmax-13)")
    calls = [autocast_onnx.lint, lambda m, **kw: autocast_onnx.explain(m, "pick", **kw), autocast_onnx.convert]
    for call in calls:
        with pytest.raises(AutocastError, match="node 'pick'"):
            call(_hardmax_11(), opset=13)


def _soft_reduce():
    """A model-local function whose body (opset 11) reduces with an axes attribute, which ReduceSum-13
    takes as an input."""
    body = [helper.make_node("ReduceSum", ["a"], ["s"], axes=[-1], keepdims=1), helper.make_node("Exp", ["s"], ["b"])]
    function = helper.make_function("local", "SoftRed", ["a"], ["b"], body, [helper.make_opsetid("", 11)])
    nodes = [helper.make_node("SoftRed", ["x"], ["y"], domain="local", name="red")]
    m = make_model(nodes, [tensor("x", F32, [2, 3, 4])], [tensor("y", F32, [2, 3, 1])], opset=11)
    m.opset_import.append(helper.make_opsetid("local", 1))
    m.functions.append(function)
    return m


def test_model_local_functions_survive_the_upgrade(tmp_path):
    """Used to write a model that did not load ("local:SoftRed(-1) is not a registered function/op"):
    the converter dropped the function. Its body is upgraded with the model."""
    path = _save(_soft_reduce(), tmp_path / "f.onnx")
    ok = invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "13"])
    assert ok.code == 0, ok.stderr
    out = onnx.load(tmp_path / "o.onnx")
    (function,) = out.functions
    assert [(o.domain, o.version) for o in function.opset_import] == [("", 13)]
    assert [n.op_type for n in function.node] == ["Constant", "ReduceSum", "Exp"]  # axes is an input now
    onnx.checker.check_model(out, full_check=True)
    x = randn([2, 3, 4], 3)
    (want,) = run(_soft_reduce(), {"x": x})
    (got,) = run(out, {"x": x})
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-3)


def test_a_function_body_the_converter_cannot_upgrade_is_refused_by_name():
    scan = _scan_with_lengths().graph.node[0]
    outputs = list(scan.output)
    function = helper.make_function("local", "Running", list(scan.input), outputs, [scan], [helper.make_opsetid("", 8)])
    call = helper.make_node("Running", list(scan.input), outputs, domain="local", name="call")
    m = _scan_with_lengths()
    del m.graph.node[:]
    m.graph.node.extend([call, helper.make_node("Relu", ["s_final"], ["out"], name="act")])
    m.functions.append(function)
    m.opset_import.append(helper.make_opsetid("local", 1))
    with pytest.raises(AutocastError, match="body of model-local function 'local:Running' from opset 8"):
        upgrade_opset(m, 13, "f.onnx")


def _annotated_softmax():
    """An fp16 Softmax (lint AC101) whose node metadata suppresses AC101, at opset 11: the upgrade to 13
    wraps the Softmax in a Flatten and a Reshape."""
    softmax = helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=1)
    entry = softmax.metadata_props.add()
    entry.key, entry.value = "autocast-onnx:ignore", "AC101"
    return make_model([softmax], [tensor("x", F16, [2, 3, 4])], [tensor("y", F16, [2, 3, 4])], opset=11)


def test_node_metadata_survives_the_upgrade_so_suppressions_keep_working():
    """Used to drop every node's metadata_props: under lint --opset the model's own suppression stopped
    working and AC101 was reported."""
    plain = autocast_onnx.lint(_annotated_softmax(), select=["AC101"])
    upgraded = autocast_onnx.lint(_annotated_softmax(), select=["AC101"], opset=13)
    assert not plain.findings and not upgraded.findings
    assert plain.results[0].suppressed == upgraded.results[0].suppressed == 1
    m = _annotated_softmax()
    upgrade_opset(m, 13, "m.onnx")
    (softmax,) = [n for n in m.graph.node if n.op_type == "Softmax"]
    assert [(p.key, p.value) for p in softmax.metadata_props] == [("autocast-onnx:ignore", "AC101")]


def test_metadata_in_a_body_and_the_graphs_own_records_survive():
    """The converter drops metadata in bodies too, and the graph's metadata_props, value_info and
    quantization annotations."""
    inner = helper.make_node("ReduceSum", ["x"], ["t"], axes=[1], keepdims=1, name="inner")
    inner.metadata_props.add(key="k", value="v")
    then = helper.make_graph([inner], "then", [], [tensor("t", F32, None)])
    other = helper.make_graph(
        [helper.make_node("ReduceMax", ["x"], ["e"], axes=[1], name="o")], "else", [], [tensor("e", F32, None)]
    )
    nodes = [
        helper.make_node("Relu", ["x0"], ["x"], name="relu"),
        helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other),
    ]
    inputs = [tensor("x0", F32, [2, 3]), tensor("c", TensorProto.BOOL, [])]
    m = make_model(nodes, inputs, [tensor("y", F32, None)], opset=11, value_info=[tensor("x", F32, [2, 3])])
    m.graph.metadata_props.add(key="g", value="1")
    m.graph.quantization_annotation.add(tensor_name="x")
    upgrade_opset(m, 13, "m.onnx")
    body = next(a.g for a in m.graph.node[1].attribute if a.name == "then_branch")
    (reduce,) = [n for n in body.node if n.op_type == "ReduceSum"]
    assert [(p.key, p.value) for p in reduce.metadata_props] == [("k", "v")]
    assert [(p.key, p.value) for p in m.graph.metadata_props] == [("g", "1")]
    assert [v.name for v in m.graph.value_info] == ["x"]
    assert [q.tensor_name for q in m.graph.quantization_annotation] == ["x"]


def test_pad_10_value_outside_constant_mode_upgrades_to_a_valid_pad(tmp_path):
    """Used to exit 3 ("this is a bug"): the converter left Pad-10's `value` on a reflect Pad-11,
    which has no such attribute. Outside constant mode it pads with nothing, so it is dropped."""
    pad = helper.make_node("Pad", ["x"], ["y"], name="pad", mode="reflect", pads=[0, 0, 1, 1, 0, 0, 1, 1], value=2.0)
    m = make_model([pad], [tensor("x", F32, [1, 1, 3, 3])], [tensor("y", F32, [1, 1, 5, 5])], opset=10)
    path = _save(m, tmp_path / "pad.onnx")
    ok = invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "13"])
    assert ok.code == 0, ok.stderr
    out = onnx.load(tmp_path / "o.onnx")
    onnx.checker.check_model(out, full_check=True)
    (upgraded,) = [n for n in out.graph.node if n.op_type == "Pad"]
    assert sorted(a.name for a in upgraded.attribute) == ["mode"]
    x = randn([1, 1, 3, 3], 4)
    (want,) = run(m, {"x": x})
    (got,) = run(out, {"x": x})
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_an_attribute_the_converter_leaves_is_refused_by_name(monkeypatch):
    """Where an attribute the node had at its opset is left on a node whose new schema lacks it, and it
    is not one known to do nothing, the upgrade is refused in one line (not exit 3 later)."""
    from autocast_onnx.rewrite import opset

    monkeypatch.setattr(opset, "_drop_idle_attributes", lambda node, before, target: None)
    pad = helper.make_node("Pad", ["x"], ["y"], name="pad", mode="edge", pads=[0, 0, 1, 1, 0, 0, 1, 1], value=2.0)
    m = make_model([pad], [tensor("x", F32, [1, 1, 3, 3])], [tensor("y", F32, [1, 1, 5, 5])], opset=10)
    with pytest.raises(AutocastError, match="left attribute 'value' on node 'pad' \\(Pad\\), which Pad-13 does not"):
        upgrade_opset(m, 13, "pad.onnx")


def _roi_align(opset=17):
    nodes = [helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], name="roi", output_height=2, output_width=2)]
    rois = helper.make_tensor("rois", TensorProto.FLOAT, [1, 4], [0, 0, 3, 3])
    idx = helper.make_tensor("idx", TensorProto.INT64, [1], [0])
    return make_model(
        nodes, [tensor("x", F32, [1, 2, 5, 5])], [tensor("y", F32, [1, 2, 2, 2])], [rois, idx], opset=opset
    )


def test_an_upgraded_node_the_cpu_provider_cannot_run_is_a_warning(tmp_path):
    """Used to upgrade RoiAlign to RoiAlign-22, which ONNX Runtime's CPU provider has no kernel for,
    without a word; the summary now says so, naming the node."""
    path = _save(_roi_align(), tmp_path / "roi.onnx")
    ok = invoke(["convert", path, "-o", tmp_path / "o.onnx", "--opset", "22"])
    assert ok.code == 0, ok.stderr
    assert "--opset 22: ONNX Runtime" in ok.stdout and "has no kernel for RoiAlign-22 (node 'roi')" in ok.stdout
    result = autocast_onnx.convert(_roi_align(), opset=22)
    (warning,) = [w for w in result.plan.warnings if w.code == "opset"]
    assert warning.node == "roi" and "could not be compared with the original" in warning.message


def test_bf16_conv_22_that_the_cpu_provider_cannot_run_is_a_warning():
    """Planned for no runtime, the upgrade to 22 lets Conv take bf16, which ONNX Runtime's CPU
    provider has no kernel for: said, naming the nodes."""
    result = autocast_onnx.convert(_cnn(17), precision="bf16", opset=22)
    (warning,) = [w for w in result.plan.warnings if w.code == "opset"]
    assert "CPU provider has no bf16 kernel" in warning.message
    assert "node 'conv1' (Conv-11 -> Conv-22)" in warning.message and warning.node == "conv1"
    assert not [w for w in autocast_onnx.convert(_cnn(17), opset=22).plan.warnings if w.code == "opset"]


def test_an_upgraded_node_the_named_runtime_lacks_is_a_warning_in_convert_and_lint():
    """--runtime cuda: ONNX Runtime's CUDA kernel table registers Elu up to Elu-6 only, so the upgrade to
    22 sends the node to the CPU provider: the plan warns, and lint reports it as AC404 on the node."""
    nodes = [helper.make_node("Elu", ["x"], ["y"], name="act")]
    m = make_model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], opset=17)
    result = autocast_onnx.convert(m, opset=22, runtime="cuda")
    (warning,) = [w for w in result.plan.warnings if w.code == "opset"]
    assert "node 'act' (Elu-6 -> Elu-22): no float kernel for Elu in onnxruntime-cuda" in warning.message
    assert not [w for w in autocast_onnx.convert(m, opset=22).plan.warnings if w.code == "opset"]
    report = autocast_onnx.lint(m, opset=22, runtime="cuda", select=["AC404"])
    (finding,) = report.findings
    assert finding.node == "act" and "no float kernel for Elu" in finding.message


def test_an_upgrade_that_cannot_be_compared_says_so(monkeypatch):
    """Without onnxruntime the comparison cannot be made: a plan warning says so, never silence."""
    from autocast_onnx.rewrite import opset_check

    monkeypatch.setattr(opset_check, "_runtime", lambda: None)
    result = autocast_onnx.convert(_bn(11), opset=15)
    (warning,) = [w for w in result.plan.warnings if w.code == "opset"]
    assert "not compared with the original (onnxruntime is not installed" in warning.message
    assert "node 'bn' (BatchNormalization-9 -> BatchNormalization-15)" in warning.message


def test_an_upgrade_that_changes_no_op_version_runs_nothing(monkeypatch):
    """Where no node's op version changes, the converter changes only the opset: nothing to compare,
    and no session is opened (the check costs nothing there)."""
    from autocast_onnx.rewrite import opset_check

    def no_session(*args, **kwargs):
        raise AssertionError("a session was opened")

    monkeypatch.setattr(opset_check, "_session", no_session)
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    m = make_model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])], opset=14)
    change = upgrade_opset(m, 15, "m.onnx")
    assert (change.before, change.after, change.warnings) == (14, 15, ())


def test_an_adapter_that_changes_the_models_inputs_is_refused():
    """Scan-8 without sequence lengths: the converter drops the batch axis from the model's own inputs,
    so the upgraded model no longer takes the original's inputs."""
    m = _scan_with_lengths()
    scan = m.graph.node[0]
    scan.input[0] = ""
    del m.graph.input[0]
    with pytest.raises(AutocastError, match="takes other inputs than the original: its input 's0' is fp32"):
        upgrade_opset(m, 13, "scan.onnx")


def test_group_normalization_18_is_refused():
    """The converter keeps GroupNormalization-18's per-group scale and bias, which opset 21 reads per
    channel: ONNX Runtime refuses the upgraded model, so the upgrade is refused naming the node."""
    nodes = [helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], name="gn", num_groups=2)]
    inits = [
        helper.make_tensor("s", TensorProto.FLOAT, [2], [1, 2]),
        helper.make_tensor("b", TensorProto.FLOAT, [2], [0, 1]),
    ]
    m = make_model(nodes, [tensor("x", F32, [1, 4, 3, 3])], [tensor("y", F32, [1, 4, 3, 3])], inits, opset=18)
    with pytest.raises(
        AutocastError, match=r"refuses the upgraded model as invalid.*node 'gn' \(GroupNormalization-18"
    ):
        upgrade_opset(m, 21, "gn.onnx")


def test_lint_says_an_upgrade_it_could_not_compare_in_text_and_json(monkeypatch, tmp_path):
    """`lint --opset` has no finding for an upgrade it could not compare: the model's warnings
    (LintResult.warnings) say it, in the text report and in the JSON one (they were only logged)."""
    import json

    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli
    from autocast_onnx.rewrite import opset_check

    monkeypatch.setattr(opset_check, "_runtime", lambda: None)
    path = tmp_path / "bn.onnx"
    onnx.save_model(_bn(11), path)
    text = CliRunner().invoke(cli, ["lint", str(path), "--opset", "15"])
    assert text.exit_code == 0, text.output
    [line] = [x for x in text.output.splitlines() if x.startswith("  warning: --opset 15: ")]
    assert "not compared with the original (onnxruntime is not installed" in line
    report = CliRunner().invoke(cli, ["lint", str(path), "--opset", "15", "--format", "json"])
    [said] = json.loads(report.output)["models"][0]["warnings"]
    assert said == line[len("  warning: ") :]
