"""Training graphs (no runtime needed): recognition, the rewrite of real onnxruntime-training
artifacts (fp16 compute, fp32 master weights and gradients, loss scaling), the artifacts-folder
and emulate commands, the training lint checks, and the rules for the training ops. Running the
rewritten graphs needs onnxruntime-training: see test_training_runtime.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, invoke
from helpers import F32, model, run, tensor
from lint_helpers import findings
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx.catalog import load_rules
from autocast_onnx.errors import AutocastError
from autocast_onnx.graph import build_index
from autocast_onnx.graph.training import ALL_FINITE_OUTPUT, LOSS_SCALE_INPUT, LOSS_SCALE_MARK, recognise
from autocast_onnx.lint import lint
from autocast_onnx.validate.emulate import emulation_model, low_precision_tensors

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "data" / "training"
MODELS = ("mlp", "cnn", "ln_gelu")
PREFIX = "autocast-onnx: error: "


def training_model(name: str) -> onnx.ModelProto:
    return onnx.load(str(ARTIFACTS / name / "training_model.onnx"))


def producers(m: onnx.ModelProto) -> dict:
    return {o: n for n in m.graph.node for o in n.output}


def declared(m: onnx.ModelProto, which: str) -> dict:
    return {v.name: v.type.tensor_type.elem_type for v in getattr(m.graph, which)}


def precisions_by_op(result) -> dict:
    out: dict = {}
    for node in result.plan.nodes:
        out.setdefault(node.op_type, set()).add(node.precision)
    return out


# ---- recognition -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_ort_training_model_is_recognised_with_its_parameters_and_seed(name):
    m = training_model(name)
    training = recognise(m)
    assert training is not None and training.kind == "ort-training"
    params = [v.name for v in m.graph.input if f"{v.name}_grad.accumulation.buffer" in declared(m, "input")]
    assert list(training.parameters) == params and params
    assert len(training.accumulations) == len(params)
    assert training.seed == f"{training.losses[0]}_grad"
    assert training.loss_scale is None
    assert training.gradient_ops >= 2


@pytest.mark.parametrize("name", MODELS)
def test_eval_model_is_a_loss_graph_and_an_inference_model_is_none(name):
    evaluated = recognise(onnx.load(str(ARTIFACTS / name / "eval_model.onnx")))
    assert evaluated is not None and evaluated.kind == "loss" and not evaluated.has_backward
    assert recognise(onnx.load(str(ROOT / "examples" / "models" / "resnet_tiny.onnx"))) is None


def momentum_model() -> onnx.ModelProto:
    """An ai.onnx.preview.training optimizer step (Momentum) after a MatMul."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["g"], name="mm"),
        helper.make_node(
            "Momentum",
            ["r", "t", "w", "g", "v"],
            ["w_new", "v_new"],
            name="momentum",
            domain="ai.onnx.preview.training",
            alpha=0.9,
            beta=1.0,
            mode="standard",
            norm_coefficient=0.0,
        ),
    ]
    inputs = [
        tensor("x", F32, [4, 4]),
        tensor("w", F32, [4, 4]),
        tensor("r", F32, []),
        tensor("t", TensorProto.INT64, []),
        tensor("v", F32, [4, 4]),
    ]
    outputs = [tensor("w_new", F32, [4, 4]), tensor("v_new", F32, [4, 4])]
    return model(nodes, inputs, outputs, extra_opsets=[("ai.onnx.preview.training", 1)])


def test_preview_training_graph_is_recognised_kept_fp32_and_not_scaled():
    m = momentum_model()
    assert recognise(m).kind == "onnx-training"
    result = autocast_onnx.convert(m)
    assert result.plan.training["kind"] == "onnx-training"
    assert {n.name: n.precision for n in result.plan.nodes}["momentum"] == "fp32"
    assert result.loss_scaling is None
    with pytest.raises(AutocastError, match="no backward seed"):
        autocast_onnx.convert(m, loss_scale="dynamic")


# ---- the rewrite -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_converted_training_graph_keeps_fp32_master_weights_gradients_and_loss(name):
    source = training_model(name)
    training = recognise(source)
    result = autocast_onnx.convert(source, check="full")
    m = result.model
    inputs, outputs = declared(m, "input"), declared(m, "output")
    made_by = producers(m)
    # master weights and gradient buffers: fp32 graph inputs, at most one Cast each
    for acc in training.accumulations:
        assert inputs[acc.parameter] == F32 and inputs[acc.buffer] == F32
        casts = [n for n in m.graph.node if n.op_type == "Cast" and list(n.input) == [acc.parameter]]
        assert len(casts) <= 1
        assert all(a.i == TensorProto.FLOAT16 for c in casts for a in c.attribute if a.name == "to")
    # every gradient reaches its accumulator through the fp32 unscale Mul
    accumulators = [n for n in m.graph.node if n.op_type == "InPlaceAccumulatorV2"]
    assert len(accumulators) == len(training.accumulations)
    for acc in accumulators:
        unscale = made_by[acc.input[1]]
        assert unscale.op_type == "Mul" and unscale.input[1] == "loss_scale.inverse"
    # the loss stays fp32 and unscaled; loss_scale comes after the user inputs; all_finite after the outputs
    assert outputs[training.losses[0]] == F32
    names = [v.name for v in m.graph.input]
    assert names[:3] == ["input", "labels", LOSS_SCALE_INPUT] and inputs[LOSS_SCALE_INPUT] == F32
    assert [v.name for v in m.graph.output][:3] == [training.losses[0], "logits", ALL_FINITE_OUTPUT]
    assert outputs[ALL_FINITE_OUTPUT] == TensorProto.BOOL
    assert training.seed not in {t.name for t in m.graph.initializer}
    # forward and gradient MatMul/Gemm/Conv in fp16; loss, loss gradient, accumulators in fp32
    by_op = precisions_by_op(result)
    assert by_op["Gemm"] == {"fp16"}
    if name == "cnn":
        assert by_op["Conv"] == {"fp16"} and by_op["ConvGrad"] == {"fp16"}
        assert by_op["MaxPoolGrad"] == {"fp32"}
    for op in ("SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad", "InPlaceAccumulatorV2", "ReduceSum"):
        assert by_op[op] == {"fp32"}, op
    if name == "ln_gelu":
        assert by_op["LayerNormalizationGrad"] == {"fp32"}
    assert not result.plan.warnings, [w.message for w in result.plan.warnings]
    assert result.plan.training["loss_scaling"] == {
        "mode": "dynamic",
        "input": LOSS_SCALE_INPUT,
        "output": ALL_FINITE_OUTPUT,
        "gradients": len(training.accumulations),
    }
    assert {p.key: p.value for p in m.metadata_props}[LOSS_SCALE_MARK] == "dynamic"


def test_static_loss_scale_is_a_constant_seed_and_unscale():
    result = autocast_onnx.convert(training_model("mlp"), loss_scale="1024")
    m = result.model
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert LOSS_SCALE_INPUT not in declared(m, "input")
    assert float(inits["onnx::loss::2_grad"]) == 1024.0
    assert float(inits["loss_scale.inverse"]) == pytest.approx(1 / 1024)
    assert ALL_FINITE_OUTPUT in declared(m, "output")
    assert result.plan.training["loss_scaling"]["mode"] == "1024"


def test_loss_scale_none_leaves_the_seed_and_lint_warns():
    result = autocast_onnx.convert(training_model("mlp"), loss_scale="none")
    m = result.model
    assert LOSS_SCALE_INPUT not in declared(m, "input") and ALL_FINITE_OUTPUT not in declared(m, "output")
    seed = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}["onnx::loss::2_grad"]
    assert float(seed) == 1.0
    diags = findings(m, "AC502")
    assert len(diags) == 1 and "no loss scaling" in diags[0].message
    # the converted model with scaling has no such finding
    assert findings(autocast_onnx.convert(training_model("mlp")).model, "AC502") == []


@pytest.mark.parametrize("name", MODELS)
def test_converting_a_converted_training_model_changes_nothing(name):
    first = autocast_onnx.convert(training_model(name))
    second = autocast_onnx.convert(first.model)
    assert second.stats.casts_added == 0
    assert second.model.SerializeToString() == first.model.SerializeToString()
    assert second.plan.training["loss_scaling"] == {"mode": "dynamic"}
    with pytest.raises(AutocastError, match="already has loss scaling"):
        autocast_onnx.convert(first.model, loss_scale="dynamic")


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e39", "abc", ""])
def test_bad_loss_scale_values_are_refused(value):
    with pytest.raises(AutocastError, match="--loss-scale must be"):
        autocast_onnx.convert(training_model("mlp"), loss_scale=value)


def test_loss_scale_on_an_inference_model_and_fp16_master_weights_are_refused():
    with pytest.raises(AutocastError, match="nothing to scale"):
        autocast_onnx.convert(ROOT / "examples" / "models" / "resnet_tiny.onnx", loss_scale="dynamic")
    with pytest.raises(AutocastError, match="master weights"):
        autocast_onnx.convert(training_model("mlp"), keep_io_types=False)


def test_a_tensor_named_loss_scale_is_not_silently_shadowed():
    m = training_model("mlp")
    m.graph.input[0].name = LOSS_SCALE_INPUT
    for node in m.graph.node:
        for k, name in enumerate(node.input):
            if name == "input":
                node.input[k] = LOSS_SCALE_INPUT
    with pytest.raises(AutocastError, match="already has a tensor named 'loss_scale'"):
        autocast_onnx.convert(m)


def eval_feeds(m: onnx.ModelProto, seed: int = 0) -> dict:
    """Real digits as data, seeded weights for the parameter inputs (the checkpoint needs
    onnxruntime-training to read)."""
    data = np.load(ROOT / "examples" / "data" / "digits_test.npz")
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in m.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "input":
            feeds[vi.name] = data["x"].reshape([len(data["x"]), *dims[1:]]).astype(np.float32)
        elif vi.name == "labels":
            feeds[vi.name] = data["y"]
        else:
            feeds[vi.name] = (rng.standard_normal(dims) * 0.3).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", MODELS)
def test_converted_eval_model_runs_and_its_emulation_agrees_with_fp32(name):
    source = onnx.load(str(ARTIFACTS / name / "eval_model.onnx"))
    result = autocast_onnx.convert(source)
    assert result.loss_scaling is None and result.plan.training["kind"] == "loss"
    assert declared(result.model, "input") == declared(source, "input")  # parameters stay fp32 inputs
    feeds = eval_feeds(source)
    loss32, logits32 = run(source, feeds)
    loss16, logits16 = run(emulation_model(result.model), feeds)
    assert low_precision_tensors(result.model) > 0
    assert abs(float(loss16) - float(loss32)) < 1e-2 * max(1.0, abs(float(loss32)))
    assert float(np.abs(logits16 - logits32).max()) < 5e-2 * float(np.abs(logits32).max())
    assert (logits16.argmax(1) == logits32.argmax(1)).mean() > 0.98


# ---- artifacts folder and emulate (CLI) ---------------------------------------------------------


def test_convert_artifacts_folder_converts_two_models_copies_the_rest_and_writes_a_manifest(tmp_path):
    src = tmp_path / "mlp"
    shutil.copytree(ARTIFACTS / "mlp", src)
    before = {p.name: p.read_bytes() for p in src.iterdir()}
    out = tmp_path / "mlp16"
    outcome = invoke(["convert", str(src), "-o", str(out)])
    assert_ok(outcome)
    assert "training graph: onnxruntime-training graph: 4 parameters" in outcome.stdout
    assert "loss scaling: dynamic" in outcome.stdout and "manifest written" in outcome.stdout
    assert {p.name: p.read_bytes() for p in src.iterdir()} == before  # the input is untouched
    assert sorted(p.name for p in out.iterdir()) == sorted([*before, "autocast-manifest.json"])
    for copied in ("checkpoint", "optimizer_model.onnx"):
        assert (out / copied).read_bytes() == before[copied]
    manifest = json.loads((out / "autocast-manifest.json").read_text())
    assert manifest["loss_scale"] == {"mode": "dynamic", "input": "loss_scale", "output": "all_finite", "gradients": 4}
    assert manifest["files"]["checkpoint"] == {"action": "copied unchanged"}
    assert manifest["files"]["training_model.onnx"]["action"] == "converted"
    assert manifest["files"]["eval_model.onnx"]["training"]["kind"] == "loss"
    trained = onnx.load(str(out / "training_model.onnx"))
    assert LOSS_SCALE_INPUT in declared(trained, "input")
    # a second run replaces its own earlier output
    assert_ok(invoke(["convert", str(src), "-o", str(out), "--loss-scale", "512"]))
    again = json.loads((out / "autocast-manifest.json").read_text())
    assert again["loss_scale"]["mode"] == "512" and again["loss_scale"]["input"] is None
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_artifacts_folder_refuses_foreign_outputs_and_options_it_cannot_honour(tmp_path):
    src = tmp_path / "cnn"
    shutil.copytree(ARTIFACTS / "cnn", src)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases = [
        (["-o", str(foreign)], "holds files autocast-onnx did not write"),
        (["-o", str(src / "inside")], "inside it"),
        (["-o", str(tmp_path / "o"), "--plan-out", str(tmp_path / "p.json")], "--plan-out"),
        (["-o", str(tmp_path / "o"), "--validate"], "--validate"),
        (["-o", str(tmp_path / "o"), "--loss-scale", "-3"], "--loss-scale"),
    ]
    for extra, fragment in cases:
        outcome = invoke(["convert", str(src), *extra])
        assert outcome.code == 2, (extra, outcome.stderr)
        lines = outcome.lines()
        assert len(lines) == 1 and lines[0].startswith(PREFIX) and fragment in lines[0], (extra, lines)
    assert (foreign / "notes.txt").read_text() == "mine" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "o").exists()


def test_emulate_writes_an_fp32_model_and_folder(tmp_path):
    converted = tmp_path / "mlp16"
    assert_ok(invoke(["convert", str(ARTIFACTS / "mlp"), "-o", str(converted), "-q"]))
    outcome = invoke(["emulate", str(converted / "training_model.onnx"), "-o", str(tmp_path / "emu.onnx")])
    assert_ok(outcome)
    emu = onnx.load(str(tmp_path / "emu.onnx"))
    # fp16 tensors remain only between the rounding casts: every other node computes in fp32
    index = build_index(emu, "emu")
    low = [v for v in index.main.values.values() if v.dtype == TensorProto.FLOAT16]
    assert low and all(consumer.op == "Cast" for v in low for consumer, _ in v.consumers)
    assert declared(emu, "input") == declared(onnx.load(str(converted / "training_model.onnx")), "input")
    assert_ok(invoke(["emulate", str(converted), "-o", str(tmp_path / "emu_dir")]))
    assert (tmp_path / "emu_dir" / "checkpoint").read_bytes() == (converted / "checkpoint").read_bytes()
    emulated_eval = build_index(onnx.load(str(tmp_path / "emu_dir" / "eval_model.onnx")), "eval")
    assert all(c.op == "Cast" for v in emulated_eval.main.values.values() if v.dtype == 10 for c, _ in v.consumers)
    # an fp32 model: written, with a warning that nothing is emulated
    plain = invoke(["emulate", str(ARTIFACTS / "mlp" / "eval_model.onnx"), "-o", str(tmp_path / "same.onnx")])
    assert_ok(plain)
    assert "warning: eval_model.onnx has no fp16/bf16 tensor" in plain.stderr
    # never over the input
    refused = invoke(["emulate", str(tmp_path / "emu.onnx"), "-o", str(tmp_path / "emu.onnx")])
    assert refused.code == 2 and len(refused.lines()) == 1


# ---- lint ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_default_conversion_of_a_training_graph_has_no_training_lint_errors(name):
    result = lint(autocast_onnx.convert(training_model(name)).model)
    bad = [(d.code, d.message) for d in result.diagnostics if d.code in ("AC105", "AC106", "AC501", "AC502", "AC503")]
    assert bad == []


def forced(name: str, rule_lines: str, tmp_path: Path, **kw) -> onnx.ModelProto:
    rules = tmp_path / "force.toml"
    rules.write_text(rule_lines)
    return autocast_onnx.convert(training_model(name), rules=[rules], **kw).model


def test_lint_finds_a_loss_gradient_in_fp16(tmp_path):
    m = forced("mlp", '[ops.low_precision]\n"com.microsoft:SoftmaxCrossEntropyLossGrad" = "test"\n', tmp_path)
    diags = findings(m, "AC106")
    assert [d.op_type for d in diags] == ["SoftmaxCrossEntropyLossGrad"]
    assert diags[0].severity == "error"


def test_lint_finds_gradients_accumulated_and_reduced_in_fp16(tmp_path):
    m = forced("mlp", '[ops.low_precision]\nReduceSum = "test"\n', tmp_path)
    diags = findings(m, "AC501")
    assert [d.op_type for d in diags] == ["ReduceSum", "ReduceSum"]
    assert "fc1.bias" in diags[0].message or "fc2.bias" in diags[0].message
    # an accumulator fed an fp16 gradient directly
    m = autocast_onnx.convert(training_model("mlp")).model
    acc = next(n for n in m.graph.node if n.op_type == "InPlaceAccumulatorV2")
    casted = helper.make_node("Cast", [acc.input[1]], ["g16"], name="to16", to=TensorProto.FLOAT16)
    position = list(m.graph.node).index(acc)
    m.graph.node.insert(position, casted)
    acc.input[1] = "g16"
    diags = findings(m, "AC501")
    assert len(diags) == 1 and "fp16 gradient 'g16'" in diags[0].message


def test_lint_finds_low_precision_master_weights_and_optimizer_state():
    m = autocast_onnx.convert(training_model("mlp")).model
    m.graph.input[3].type.tensor_type.elem_type = TensorProto.FLOAT16  # fc1.weight
    diags = findings(m, "AC503")
    assert [d.tensor for d in diags] == ["fc1.weight"]
    optimizer = onnx.load(str(ARTIFACTS / "mlp" / "optimizer_model.onnx"))
    assert findings(optimizer, "AC503") == []
    weights = next(v for v in optimizer.graph.input if v.type.HasField("sequence_type"))
    weights.type.sequence_type.elem_type.tensor_type.elem_type = TensorProto.FLOAT16
    diags = findings(optimizer, "AC503")
    assert diags and all("AdamWOptimizer" in d.message for d in diags)


# ---- rules and checks ----------------------------------------------------------------------------


def test_every_training_op_has_a_default_rule():
    table = json.loads((ROOT / "autocast_onnx" / "data" / "ort_training_signatures.json").read_text())
    rules = load_rules()
    missing = [k for k in table if rules.op_rule(*(k.split(":") if ":" in k else ("", k))) is None]
    assert missing == []
    expected = {
        ("com.microsoft", "ConvGrad"): "low_precision",
        ("com.microsoft", "ReluGrad"): "follow",
        ("com.microsoft", "GeluGrad"): "follow",
        ("com.microsoft", "SoftmaxCrossEntropyLossGrad"): "keep_fp32",
        ("com.microsoft", "LayerNormalizationGrad"): "keep_fp32",
        ("com.microsoft", "SoftmaxGrad_13"): "keep_fp32",
        ("com.microsoft", "InPlaceAccumulatorV2"): "keep_fp32",
        ("com.microsoft", "AdamWOptimizer"): "keep_fp32",
        ("com.microsoft", "GatherGrad"): "keep_fp32",
        ("com.microsoft", "BroadcastGradientArgs"): "non_float",
        ("ai.onnx.preview.training", "Adam"): "keep_fp32",
    }
    for (domain, op), category in expected.items():
        assert rules.op_rule(domain, op).category == category, (domain, op)


def test_checker_accepts_ort_default_domain_training_ops_but_not_real_errors():
    from autocast_onnx.errors import InternalCheckError
    from autocast_onnx.rewrite.checks import check_result

    m = onnx.load(str(ARTIFACTS / "cnn" / "training_model.onnx"))
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m)  # as onnxruntime-training writes it (MaxPoolGrad in the default domain)
    check_result(m, full=True)
    broken = onnx.ModelProto()
    broken.CopyFrom(m)
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(InternalCheckError):
        check_result(broken)


def test_check_gates_a_training_model_without_validation_and_says_how_to_validate_it():
    model = str(ARTIFACTS / "ln_gelu" / "training_model.onnx")
    gated = invoke(["check", model, "--no-validate"])
    assert_ok(gated)
    assert "result: PASS" in gated.stdout
    refused = invoke(["check", model])
    assert refused.code == 2 and len(refused.lines()) == 1
    assert "--no-validate" in refused.lines()[0] and "autocast-onnx validate" in refused.lines()[0]


def test_emulation_keeps_declared_types_as_fp32_for_ops_without_shape_inference():
    """Regression: the emulation dropped every value_info, and onnxruntime-training crashed
    creating a session for MaxPoolGrad (no shape inference) without its output's declared type.
    Declared fp16 types now become fp32 instead of disappearing."""
    converted = autocast_onnx.convert(training_model("cnn")).model
    before = declared(converted, "value_info")
    assert TensorProto.FLOAT16 in before.values()
    emulated = declared(emulation_model(converted), "value_info")
    assert set(emulated) == set(before) - set(declared(converted, "output"))
    assert set(emulated.values()) == {F32}
    assert emulated["/Relu_output_0_grad"] == F32  # MaxPoolGrad's output


def test_a_replayed_plan_brings_its_loss_scaling(tmp_path):
    source = ARTIFACTS / "mlp" / "training_model.onnx"
    for scale in ("dynamic", "128", "none"):
        plan = tmp_path / f"{scale}.json"
        first = autocast_onnx.convert_file(source, tmp_path / f"{scale}.onnx", plan_out=plan, loss_scale=scale)
        assert json.loads(plan.read_text())["training"]["loss_scaling"]["mode"] == scale
        again = autocast_onnx.convert(source, plan=plan)
        assert again.model.SerializeToString() == first.model.SerializeToString()
        other = "256" if scale != "256" else "dynamic"
        with pytest.raises(AutocastError, match=f"--loss-scale {other} contradicts the plan's loss scaling"):
            autocast_onnx.convert(source, plan=plan, loss_scale=other)


def test_validating_a_training_step_without_onnxruntime_training_says_what_to_install(tmp_path, monkeypatch):
    import autocast_onnx.validate.training as step_validation

    monkeypatch.setattr(step_validation, "has_training_runtime", lambda: False)  # as with the plain wheel
    model = str(ARTIFACTS / "mlp" / "training_model.onnx")
    for args in (
        ["convert", model, "-o", str(tmp_path / "o.onnx"), "--validate"],
        ["validate", model, model],
    ):
        outcome = invoke(args)
        assert outcome.code == 2 and len(outcome.lines()) == 1, outcome.stderr
        assert "needs onnxruntime-training" in outcome.lines()[0] and "torch==2.13.0" in outcome.lines()[0]
    assert not (tmp_path / "o.onnx").exists()
