"""Converted training graphs trained for real with onnxruntime-training (CheckpointState, Module,
Optimizer) on sklearn's digits: the rewritten model loads and trains, its emulation (fp16
numerics on CPU) converges, a forced overflow is reported by all_finite and its step skipped,
and `validate` compares one training step gradient by gradient.

These tests need onnxruntime-training, which provides the same `onnxruntime` module as the
plain wheel and so lives in its own environment: .ci/run creates .venv-training and runs
`pytest -m training tests/training/test_training_runtime.py` there. In the main environment they are
skipped, with that reason (see conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from autocast_onnx.errors import AutocastError
from autocast_onnx.training import DynamicLossScaler, TrainingStep, convert_artifacts
from autocast_onnx.validate.emulate import emulate_file

pytestmark = pytest.mark.training

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "data" / "training"
DATA = ROOT / "examples" / "data"
MODELS = ("mlp", "cnn", "ln_gelu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """name -> {"fp32": original folder, "mixed": converted, "emu": emulation of the converted}."""
    root = tmp_path_factory.mktemp("training")
    out = {}
    for name in MODELS:
        converted, emulated = root / f"{name}.fp16", root / f"{name}.emu"
        convert_artifacts(ARTIFACTS / name, converted)
        emulate_file(converted, emulated)
        out[name] = {"fp32": ARTIFACTS / name, "mixed": converted, "emu": emulated}
    return out


def digits(name: str, split: str):
    data = np.load(DATA / f"digits_{split}.npz")
    x = data["x"] if name == "cnn" else data["x"].reshape(len(data["x"]), 64)
    return x.astype(np.float32), data["y"].astype(np.int64)


def session(folder: Path):
    import onnxruntime
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    onnxruntime.set_default_logger_severity(3)
    state = CheckpointState.load_checkpoint(str(folder / "checkpoint"))
    module = Module(str(folder / "training_model.onnx"), state, str(folder / "eval_model.onnx"))
    return state, module, Optimizer(str(folder / "optimizer_model.onnx"), module)


def parameters(state) -> dict:
    return {name: np.array(p.data, copy=True) for name, p in state.parameters}


def train(folder: Path, name: str, *, epochs: int, scaler=None, mixed: bool, batch: int = 32, steps=None):
    """Epoch losses, step results and test accuracy of one run (same data order for every run)."""
    x, y = digits(name, "train")
    state, module, optimizer = session(folder)
    step = TrainingStep(module, optimizer, scaler) if mixed else None
    rng = np.random.default_rng(0)
    losses, results = [], []
    module.train()
    for _ in range(epochs):
        order = rng.permutation(len(x))
        epoch = []
        for k in range(0, len(x) - batch + 1, batch):
            idx = order[k : k + batch]
            if mixed:
                result = step(x[idx], y[idx])
                results.append(result)
                epoch.append(result.loss)
            else:
                loss, _logits = module(x[idx], y[idx])
                optimizer.step()
                module.lazy_reset_grad()
                epoch.append(float(loss))
            if steps is not None and len(epoch) >= steps:
                break
        losses.append(float(np.mean(epoch)))
    module.eval()
    x_test, y_test = digits(name, "test")
    _loss, logits = module(x_test, y_test)[:2]
    accuracy = float((np.asarray(logits).argmax(1) == y_test).mean())
    return {"losses": losses, "results": results, "accuracy": accuracy, "state": state}


@pytest.mark.parametrize("name", MODELS)
def test_the_rewritten_model_trains_on_cpu_exactly_like_fp32(folders, name):
    """onnxruntime-training accepts the rewrite (loss_scale input, all_finite output, casts); on
    its CPU provider the fp16 casts are removed, so the run equals fp32 training."""
    fp32 = train(folders[name]["fp32"], name, epochs=1, mixed=False)
    mixed = train(folders[name]["mixed"], name, epochs=1, mixed=True, scaler=DynamicLossScaler())
    assert all(r.all_finite and not r.skipped for r in mixed["results"])
    assert np.allclose(mixed["losses"], fp32["losses"], rtol=1e-5)
    assert mixed["accuracy"] == pytest.approx(fp32["accuracy"], abs=1e-9)


@pytest.mark.parametrize("name", MODELS)
def test_emulated_mixed_precision_training_converges_like_fp32(folders, name):
    fp32 = train(folders[name]["fp32"], name, epochs=4, mixed=False)
    emu = train(folders[name]["emu"], name, epochs=4, mixed=True, scaler=DynamicLossScaler())
    assert emu["losses"][-1] < 0.8 * emu["losses"][0]
    assert not any(r.skipped for r in emu["results"])
    assert emu["results"][-1].scale == 2.0**16
    # fp16 numerics change the run slightly, not its outcome
    assert emu["losses"] != fp32["losses"]
    assert abs(emu["losses"][-1] - fp32["losses"][-1]) < 0.05 * fp32["losses"][-1]
    assert emu["accuracy"] >= fp32["accuracy"] - 0.02


def test_overflow_is_reported_skipped_and_backed_off(folders):
    """At 2**24 the scaled gradients leave fp16's range: all_finite is false, the optimizer does
    not step (the fp32 master weights stay as they were) and the scaler halves the scale until
    the gradients fit."""
    x, y = digits("mlp", "train")
    state, module, optimizer = session(folders["mlp"]["emu"])
    scaler = DynamicLossScaler(init_scale=2.0**24)
    step = TrainingStep(module, optimizer, scaler)
    module.train()
    before = parameters(state)
    first = step(x[:32], y[:32])
    assert not first.all_finite and first.skipped and first.scale == 2.0**24
    assert scaler.scale == 2.0**23
    after = parameters(state)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    results = [first]
    for k in range(1, 12):
        results.append(step(x[32 * k : 32 * (k + 1)], y[32 * k : 32 * (k + 1)]))
    finite = [r for r in results if r.all_finite]
    assert finite, [r.scale for r in results]
    assert all(r.skipped for r in results[: results.index(finite[0])])
    assert not any(np.array_equal(before[k], parameters(state)[k]) for k in before)
    assert scaler.skipped_steps == sum(r.skipped for r in results) >= results.index(finite[0])
    assert all(r.skipped == (not r.all_finite) for r in results)
    assert scaler.scale <= 2.0**20
    assert np.isfinite(first.loss)  # the loss output is unscaled fp32 even when the gradients overflow


def test_static_scale_overflow_is_skipped_without_a_scaler(tmp_path):
    converted, emulated = tmp_path / "big", tmp_path / "big.emu"
    convert_artifacts(ARTIFACTS / "mlp", converted, loss_scale="1e30")
    emulate_file(converted, emulated)
    x, y = digits("mlp", "train")
    state, module, optimizer = session(emulated)
    module.train()
    before = parameters(state)
    result = TrainingStep(module, optimizer)(x[:32], y[:32])
    assert result.skipped and not result.all_finite and result.scale is None
    assert all(np.array_equal(before[k], v) for k, v in parameters(state).items())


def test_training_step_refuses_a_model_without_all_finite(tmp_path):
    converted = tmp_path / "none"
    convert_artifacts(ARTIFACTS / "mlp", converted, loss_scale="none")
    _state, module, optimizer = session(converted)
    x, y = digits("mlp", "train")
    module.train()
    with pytest.raises(AutocastError, match="no 'loss_scale' input"):
        TrainingStep(module, optimizer, DynamicLossScaler())(x[:32], y[:32])


@pytest.mark.parametrize("name", MODELS)
def test_validate_compares_one_training_step(folders, name, tmp_path):
    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli

    ref = folders[name]["fp32"] / "training_model.onnx"
    conv = folders[name]["mixed"] / "training_model.onnx"
    report = tmp_path / "step.json"
    outcome = CliRunner().invoke(cli, ["validate", str(ref), str(conv), "--report-json", str(report)])
    assert outcome.exit_code == 0, outcome.output
    assert "PASS" in outcome.output and "cosine" in outcome.output
    data = json.loads(report.read_text())
    jsonschema.validate(data, json.loads((ROOT / "docs" / "training-step-report.schema.json").read_text()))
    assert data["all_finite"] is True and data["parameters_from"] == "checkpoint"
    for gradient in data["gradients"].values():
        assert gradient["cosine"] > 0.99 and gradient["nonfinite"] == 0 and gradient["underflow"] <= 0.01


def test_validate_fails_a_step_whose_gradients_overflow(tmp_path):
    from autocast_onnx.validate.training import validate_training_step

    converted = tmp_path / "big"
    convert_artifacts(ARTIFACTS / "mlp", converted, loss_scale=str(2.0**24))
    x, y = digits("mlp", "train")
    ref = ARTIFACTS / "mlp" / "training_model.onnx"
    report = validate_training_step(ref, converted / "training_model.onnx", inputs={"input": x[:64], "labels": y[:64]})
    assert report["all_finite"] is False and not report["passed"]
    assert any(g["nonfinite"] for g in report["gradients"].values())
    shutil.rmtree(converted)


def test_loss_scaling_saves_small_gradients_from_underflow(folders):
    """Gradients shrink as training converges (and with depth): after 20 epochs a few of
    fc1.weight's nonzero gradient entries flush to zero in fp16 at scale 1, none at 2**16; at
    2**-8 (gradients 256 times smaller, as in deeper models) percents of them do, and scaling
    them back by 2**8 saves them all."""
    from autocast_onnx.validate.training import validate_training_step

    trained = train(folders["mlp"]["fp32"], "mlp", epochs=20, mixed=False)
    params = parameters(trained["state"])
    x, y = digits("mlp", "train")
    batch = {"input": x[:256], "labels": y[:256]}
    ref = ARTIFACTS / "mlp" / "training_model.onnx"
    conv = folders["mlp"]["mixed"] / "training_model.onnx"

    def underflow(scale: float) -> float:
        report = validate_training_step(ref, conv, inputs=batch, parameters=params, loss_scale=scale)
        assert report["all_finite"] is True
        return report["gradients"]["fc1.weight"]["underflow"]

    tiny, one, scaled = underflow(2.0**-8), underflow(1.0), underflow(2.0**16)
    assert tiny > 0.01 and tiny > one > 0
    assert scaled == 0.0


def test_convert_validate_runs_the_training_step_and_refuses_inference_thresholds(tmp_path):
    from click.testing import CliRunner

    from autocast_onnx.cli.main import cli

    model = str(ARTIFACTS / "ln_gelu" / "training_model.onnx")
    report = tmp_path / "r.json"
    args = ["convert", model, "-o", str(tmp_path / "o.onnx"), "--validate", "--report-json", str(report)]
    outcome = CliRunner().invoke(cli, args)
    assert outcome.exit_code == 0, outcome.output
    assert "training graph:" in outcome.output and "PASS: every gradient finite" in outcome.output
    assert json.loads(report.read_text())["kind"] == "training-step"
    refused = CliRunner().invoke(cli, ["convert", model, "-o", str(tmp_path / "p.onnx"), "--validate", "--atol", "1"])
    assert refused.exit_code == 2 and "--atol cannot be used when validating a training step" in refused.output
    assert not (tmp_path / "p.onnx").exists()
