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
from helpers import F32, parse, randn, run, tensor
from helpers import model as make_model
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx import AutocastError
from autocast_onnx.rewrite.opset import default_opset, upgrade_opset

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"


def _bn(opset=11):
    """Conv -> BatchNormalization -> Relu: BN takes fp16 data with fp32 parameters only from 15."""
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
        scale=np.ones(c, np.float32),
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
def test_batchnorm_at_opset_11_runs_fp16_with_fp32_parameters_after_opset_15():
    before = autocast_onnx.convert(_bn(11))
    assert _by_name(before, "bn").precision == "fp32"  # the opset-11 schema ties parameters to the data type
    result = autocast_onnx.convert(_bn(11), opset=15)
    assert _by_name(result, "bn").precision == "fp16"
    out = result.model
    assert default_opset(out) == 15
    types = {t.name: t.data_type for t in out.graph.initializer}
    assert all(types[name] == TensorProto.FLOAT for name in ("scale", "bias", "mean", "var"))
    (bn,) = [n for n in out.graph.node if n.op_type == "BatchNormalization"]
    assert bn.input[1:] == ["scale", "bias", "mean", "var"]  # read as they are, no Cast in between
    x = randn([1, 3, 8, 8], 5)
    (want,) = run(_bn(11), {"x": x})
    (got,) = run(out, {"x": x})
    assert np.abs(got - want).max() < 1e-2


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
    bn = autocast_onnx.convert(_bn(11))
    (limited,) = [w for w in bn.plan.warnings if w.code == "schema-limited"]
    assert "pass --opset 15" in limited.message
    assert default_opset(bn.model) == 11


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
