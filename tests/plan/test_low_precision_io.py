"""--low-precision-io: named model inputs and outputs take the low-precision type (a decoder's
KV cache), with the plan and summary saying which; and a decoder's present.* cache is state,
not an output head."""

from __future__ import annotations

import json
from pathlib import Path

import helpers as H
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

import autocast_onnx
from autocast_onnx.cli.main import cli
from autocast_onnx.errors import AutocastError
from autocast_onnx.plan import PrecisionPlan
from autocast_onnx.report import conversion_summary

ROOT = Path(__file__).resolve().parents[2]
LLAMA_KV = ROOT / "tests" / "data" / "decoders" / "llama_kv.onnx"
CACHE = r"past_key_values\..*|present\..*"
F16 = TensorProto.FLOAT16


def io_types(m: onnx.ModelProto) -> dict:
    return {v.name: v.type.tensor_type.elem_type for v in [*m.graph.input, *m.graph.output]}


@pytest.fixture(scope="module")
def llama_cache16():
    return autocast_onnx.convert(str(LLAMA_KV), low_precision_io=CACHE)


def test_the_cache_is_fp16_and_everything_else_keeps_its_type(llama_cache16):
    before, after = io_types(onnx.load(LLAMA_KV)), io_types(llama_cache16.model)
    cache = [n for n in before if n.startswith(("past_key_values.", "present."))]
    assert len(cache) == 8
    for name, t in before.items():
        assert after[name] == (F16 if name in cache else t), name
    assert llama_cache16.plan.low_precision_io == [n for n in before if n in cache]
    onnx.checker.check_model(llama_cache16.model, full_check=True)


def test_plan_and_summary_name_the_low_precision_io(llama_cache16, tmp_path):
    text = conversion_summary(llama_cache16)
    assert "fp16 model inputs/outputs (--low-precision-io): past_key_values.0.key" in text
    assert "(8 in all)" in text
    saved = tmp_path / "plan.json"
    llama_cache16.plan.save(saved)
    assert json.loads(saved.read_text())["low_precision_io"] == llama_cache16.plan.low_precision_io
    replayed = autocast_onnx.convert(str(LLAMA_KV), plan=PrecisionPlan.load(saved))
    assert replayed.model.SerializeToString() == llama_cache16.model.SerializeToString()


def test_a_step_with_an_fp16_cache_matches_the_fp32_model(llama_cache16):
    # Feed the same cache (rounded to fp16 for the converted model) to both: the logits and the
    # new cache entries agree to fp16 accuracy, and the converted model returns fp16 cache tensors.
    rng = np.random.default_rng(0)
    past = {f"past_key_values.{i}.{kv}": rng.standard_normal((2, 2, 5, 16)).astype(np.float32)
            for i in range(2) for kv in ("key", "value")}  # fmt: skip
    feeds = {
        "input_ids": rng.integers(0, 256, (2, 3)),
        "attention_mask": np.ones((2, 8), np.int64),
        "position_ids": np.tile(np.arange(5, 8), (2, 1)),
        **{k: v.astype(np.float16).astype(np.float32) for k, v in past.items()},
    }
    ref = ort.InferenceSession(str(LLAMA_KV), providers=["CPUExecutionProvider"])
    conv = ort.InferenceSession(llama_cache16.model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
    conv_feeds = {k: v.astype(np.float16) if k.startswith("past") else v for k, v in feeds.items()}
    got = dict(zip([o.name for o in conv.get_outputs()], conv.run(None, conv_feeds)))
    assert got["present.0.key"].dtype == np.float16 and got["logits"].dtype == np.float32
    for name, ref_value in want.items():
        scale = float(np.abs(ref_value).max())
        assert float(np.abs(got[name].astype(np.float32) - ref_value).max()) <= 2e-2 * scale, name


def test_a_low_precision_input_read_in_fp32_is_cast_and_an_fp32_output_is_cast_down():
    # x (fp16 by the flag) feeds a Softmax (fp32): a Cast up; y is written by the fp32 Softmax: a
    # Cast down restores its name in fp16. (The fast plan casts no model input down into a Softmax:
    # the caller's values are of a range nothing has checked.)
    m = H.model(
        [helper.make_node("Softmax", ["x"], ["y"], name="sm")],
        [H.tensor("x", H.F32, [2, 4])],
        [H.tensor("y", H.F32, [2, 4])],
    )
    result = autocast_onnx.convert(m, low_precision_io="x|y")
    assert io_types(result.model) == {"x": F16, "y": F16}
    casts = [(n.input[0], n.output[0]) for n in result.model.graph.node if n.op_type == "Cast"]
    assert len(casts) == 2 and casts[1][1] == "y"
    onnx.checker.check_model(result.model, full_check=True)
    out = H.run(result.model, {"x": np.arange(8, dtype=np.float16).reshape(2, 4)})[0]
    assert out.dtype == np.float16


def mixed_io_model():
    return H.model(
        [
            helper.make_node("Cast", ["ids"], ["idsf"], name="c", to=H.F32),
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "idsf"], ["y"], name="add"),
        ],
        [H.tensor("x", H.F32, [2, 4]), H.tensor("ids", TensorProto.INT64, [2, 4])],
        [H.tensor("y", H.F32, [2, 4])],
        [H.init("w", np.eye(4, dtype=np.float32))],
    )


@pytest.mark.parametrize(
    "pattern,words",
    [
        ("nosuch.*", "matches no float32 model input or output (the model's are: x, ids, y)"),
        ("ids", "matches no float32 model input or output (only input 'ids' (int64))"),
        ("x.", "matches no float32"),  # whole names: "x." does not match "x"
    ],
)
def test_a_pattern_that_changes_nothing_is_an_error(pattern, words):
    with pytest.raises(AutocastError) as info:
        autocast_onnx.convert(mixed_io_model(), low_precision_io=pattern)
    assert words in str(info.value)


def test_a_non_float_match_beside_a_float_one_is_a_plan_warning():
    result = autocast_onnx.convert(mixed_io_model(), low_precision_io="x|ids")
    assert result.plan.low_precision_io == ["x"]
    notes = [w.message for w in result.plan.warnings if w.code == "low-precision-io"]
    assert notes == ["--low-precision-io matches input 'ids', which is int64, not float32: left as it is"]


def test_cli_option_exit_codes_and_plan_refusal(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(mixed_io_model(), src)
    runner = CliRunner()
    ok = runner.invoke(cli, ["convert", str(src), "-o", str(tmp_path / "o.onnx"), "--low-precision-io", "x|y",
                             "--plan-out", str(tmp_path / "p.json")])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert "fp16 model inputs/outputs (--low-precision-io): x, y" in ok.output
    bad = runner.invoke(cli, ["convert", str(src), "-o", str(tmp_path / "o2.onnx"), "--low-precision-io", "nosuch"])
    assert bad.exit_code == 2 and "matches no float32 model input or output" in bad.output
    assert not (tmp_path / "o2.onnx").exists()
    replay = runner.invoke(cli, ["convert", str(src), "-o", str(tmp_path / "o3.onnx"), "--plan",
                                 str(tmp_path / "p.json"), "--low-precision-io", "x"])  # fmt: skip
    assert replay.exit_code == 2 and "--low-precision-io" in replay.output


def test_a_training_graph_refuses_low_precision_io():
    with pytest.raises(AutocastError, match="training graph"):
        autocast_onnx.convert(str(ROOT / "tests/data/training/mlp/training_model.onnx"), low_precision_io=".*")


def test_a_cache_output_is_state_not_an_output_head():
    # present = Concat(past, k) with k from a small MatMul (a tiny share of the work: the big one
    # writes y). The output passes the model input `past` on, so the output-head rule leaves it
    # alone and the Concat follows the MatMul into fp16; before, both were kept fp32 as a "head".
    m = H.model(
        [
            helper.make_node("MatMul", ["x", "w"], ["k"], name="k_proj"),
            helper.make_node("Concat", ["past", "k"], ["present"], name="concat", axis=0),
            helper.make_node("MatMul", ["z", "big"], ["y"], name="body"),
        ],
        [H.tensor("x", H.F32, [1, 4]), H.tensor("past", H.F32, ["p", 4]), H.tensor("z", H.F32, [8, 256])],
        [H.tensor("y", H.F32, [8, 256]), H.tensor("present", H.F32, ["t", 4])],
        [H.init("w", np.eye(4, dtype=np.float32)), H.init("big", np.eye(256, dtype=np.float32))],
    )
    result = autocast_onnx.convert(m)
    assert H.planned(result, "concat") == "fp16" and H.planned(result, "k_proj") == "fp16"
    assert all(r.code != "output-head" for e in result.plan.nodes for r in e.reasons)
