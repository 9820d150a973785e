"""validate on causal LMs exported with fixed shapes (issue 28, item 4): the greedy continuation
fits its prompts to a fixed batch and sequence length (right-padded, masked) instead of feeding
8-token prompts that ONNX Runtime refuses, and a model whose KV cache cannot grow skips the
continuation with the reason in the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from bad_input_helpers import assert_ok, invoke

import autocast_onnx
from autocast_onnx.validate import generation

ROOT = Path(__file__).resolve().parents[2]
GPT2 = ROOT / "examples" / "models" / "gpt2_tiny.onnx"  # input_ids, attention_mask [batch, sequence]; 64 positions
LLAMA_KV = ROOT / "tests" / "data" / "decoders" / "llama_kv.onnx"


def _fix(value_info, sizes: dict) -> None:
    """Give the named symbolic dims of `value_info` fixed sizes."""
    for dim in value_info.type.tensor_type.shape.dim:
        if dim.dim_param in sizes:
            size = sizes[dim.dim_param]
            dim.Clear()
            dim.dim_value = size


def static_gpt2(batch: int = 2, length: int = 64) -> onnx.ModelProto:
    """gpt2_tiny with its inputs and logits fixed to [batch, length] (as an export with static
    shapes declares them); ONNX Runtime runs it on exactly those shapes."""
    model = onnx.load(GPT2)
    for vi in [*model.graph.input, *model.graph.output]:
        _fix(vi, {"batch": batch, "sequence": length})
    return model


@pytest.fixture(scope="module")
def static_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("static")
    ref = folder / "gpt2_static.onnx"
    onnx.save(static_gpt2(), ref)
    conv = folder / "gpt2_static.fp16.onnx"
    autocast_onnx.convert_file(ref, conv)
    return ref, conv


def test_the_continuation_fits_a_fixed_sequence_length(static_pair):
    ref, conv = static_pair
    report = autocast_onnx.validate(ref, conv, speed=False)
    gen = report.generation
    assert gen is not None, report.to_dict()["generation_skipped"]
    assert (gen["fixed_length"], gen["prompts"], gen["prompt_length"], gen["tokens"]) == (64, 2, 8, 16)
    assert report.to_dict()["generation_skipped"] is None
    assert "right-padded to the fixed length 64" in report.text()


def test_the_fixed_window_generates_what_the_dynamic_model_generates():
    # Right padding changes nothing a causal model reads: the tokens equal those of the same
    # model with dynamic shapes fed the growing sequence.
    static = static_gpt2()
    lm_fixed = generation.recognise(static)
    lm_dynamic = generation.recognise(onnx.load(GPT2))
    assert (lm_fixed.batch, lm_fixed.length) == (2, 64) and (lm_dynamic.batch, lm_dynamic.length) == (None, None)
    fixed = ort.InferenceSession(static.SerializeToString(), providers=["CPUExecutionProvider"])
    dynamic = ort.InferenceSession(str(GPT2), providers=["CPUExecutionProvider"])
    ids, mask = generation.prompts(lm_fixed, 2, 8, seed=5)
    want = generation.greedy(lm_dynamic, dynamic, ids, mask, 12)
    np.testing.assert_array_equal(generation.greedy(lm_fixed, fixed, ids, mask, 12), want)


def test_the_cli_validates_a_static_gpt2_with_exit_0(static_pair, tmp_path):
    ref, conv = static_pair
    report = tmp_path / "r.json"
    outcome = invoke(["validate", ref, conv, "--report-json", report])
    assert_ok(outcome)
    data = json.loads(report.read_text())
    assert data["generation"]["fixed_length"] == 64 and data["generation"]["all_agree"] in (True, False)


def test_a_short_fixed_length_bounds_the_prompt_and_the_tokens():
    lm = generation.recognise(static_gpt2(batch=1, length=10))
    assert generation.fit(lm, 16) == (1, 5, 5)  # one prompt of 5 tokens, 5 generated fill the window
    assert generation.fit(lm, 3) == (1, 5, 3)
    one = generation.recognise(static_gpt2(batch=1, length=1))
    assert "fixed sequence length 1" in generation.fit(one, 16)


def test_a_cache_with_a_fixed_sequence_axis_is_skipped_with_the_reason():
    model = onnx.load(LLAMA_KV)
    for vi in model.graph.input:
        _fix(vi, {"past_sequence": 4})
    lm = generation.recognise(model)
    assert lm is not None and lm.has_cache
    reason = generation.fit(lm, 16)
    assert isinstance(reason, str) and "past_key_values.0.key has the fixed sequence length 4" in reason
    dynamic = generation.recognise(onnx.load(LLAMA_KV))
    assert dynamic.fixed_cache is None and generation.fit(dynamic, 16) == (2, generation.PROMPT_LENGTH, 16)


def test_validate_reports_why_a_fixed_cache_skips_the_continuation(tmp_path):
    model = onnx.load(LLAMA_KV)
    for vi in model.graph.input:
        _fix(vi, {"past_sequence": 4})
    ref, conv = tmp_path / "kv_fixed.onnx", tmp_path / "kv_fixed.fp16.onnx"
    onnx.save(model, ref)
    autocast_onnx.convert_file(ref, conv)
    report = autocast_onnx.validate(ref, conv, speed=False, dims={"total_sequence": 20})
    data = report.to_dict()
    assert data["generation"] is None and "fixed sequence length 4" in data["generation_skipped"]
    assert data["generation_skipped"] in report.text().splitlines()
    assert data["inputs"]["source"] == "generated"  # the cache is not built from a prompt: it cannot grow
