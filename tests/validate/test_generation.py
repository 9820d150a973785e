"""validate on causal LMs: the signature is recognised, a KV cache is fed as a model wrote it
(in the converted model's own input types), and greedy-continuation agreement is reported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

import autocast_onnx
from autocast_onnx.cli.main import cli
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate import generation

ROOT = Path(__file__).resolve().parents[2]
DECODERS = ROOT / "tests" / "data" / "decoders"
CACHE = r"past_key_values\..*|present\..*"


def session(path_or_model):
    data = path_or_model if isinstance(path_or_model, (str, Path)) else path_or_model.SerializeToString()
    return ort.InferenceSession(str(data) if isinstance(data, Path) else data, providers=["CPUExecutionProvider"])


def test_the_causal_lm_signature_is_recognised():
    kv = generation.recognise(onnx.load(DECODERS / "llama_kv.onnx"))
    assert kv is not None and kv.has_cache and kv.vocab == 256
    assert kv.attention_mask == "attention_mask" and kv.position_ids == "position_ids"
    assert [(p, o) for p, o, _ in kv.cache][:2] == [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]
    assert {tuple(shape) for _, _, shape in kv.cache} == {(2, 16)}
    plain = generation.recognise(onnx.load(DECODERS / "llama.onnx"))
    assert plain is not None and not plain.has_cache and plain.position_ids is None
    assert generation.recognise(onnx.load(ROOT / "examples/models/gpt2_tiny.onnx")) is not None
    # an encoder (no logits) and a vision model (no input_ids) are not causal LMs
    assert generation.recognise(onnx.load(ROOT / "examples/models/bert_tiny.onnx")) is None
    assert generation.recognise(onnx.load(ROOT / "examples/models/vit_tiny.onnx")) is None


def test_greedy_with_the_cache_equals_greedy_over_the_whole_sequence():
    # The loop's own consistency: feeding the cache back (positions and mask extended one token at
    # a time) gives the tokens that re-reading the whole sequence with an empty cache gives.
    lm = generation.recognise(onnx.load(DECODERS / "qwen2_kv.onnx"))
    sess = session(DECODERS / "qwen2_kv.onnx")
    ids, mask = generation.prompts(lm, 2, 6, seed=3)
    assert mask[1, 0] == 0 and mask[0].all()  # one full and one left-padded prompt
    with_cache = generation.greedy(lm, sess, ids, mask, 6)
    names = [o.name for o in sess.get_outputs()]
    whole = []
    for _ in range(6):
        out = dict(zip(names, sess.run(None, generation.step_feeds(lm, sess, ids, mask, None))))
        nxt = out["logits"][:, -1, :].argmax(-1)
        whole.append(nxt)
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    np.testing.assert_array_equal(with_cache, np.stack(whole, axis=1))


def test_agreement_counts_the_tokens_before_the_first_divergence():
    # tools/export_decoders.py builds Llama and Mistral from one seed; they differ only in
    # Mistral's 64-token sliding window. So their greedy paths agree until a sequence (8 prompt
    # tokens + generated ones) passes 64 positions, and the counts must say where.
    lm = generation.recognise(onnx.load(DECODERS / "llama.onnx"))
    llama, mistral = session(DECODERS / "llama.onnx"), session(DECODERS / "mistral.onnx")
    report = generation.agreement(lm, llama, mistral, 72, 2, seed=0)
    for want, got, count in zip(report["reference_tokens"], report["converted_tokens"], report["agreeing_tokens"]):
        differ = [k for k, (a, b) in enumerate(zip(want, got)) if a != b]
        assert differ and count == differ[0]
        assert count >= 64 - generation.PROMPT_LENGTH  # nothing differs before the window acts
    assert not report["all_agree"] and report["min_agreeing_tokens"] == min(report["agreeing_tokens"])
    short = generation.agreement(lm, llama, mistral, 16, 2, seed=0)
    assert short["agreeing_tokens"] == [16, 16] and short["all_agree"]


@pytest.fixture(scope="module")
def llama_kv16(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv") / "llama_kv.fp16.onnx"
    autocast_onnx.convert_file(DECODERS / "llama_kv.onnx", out, low_precision_io=CACHE)
    return out


def test_validate_feeds_a_written_cache_in_fp16_and_reports_the_continuation(llama_kv16):
    report = autocast_onnx.validate(DECODERS / "llama_kv.onnx", llama_kv16, speed=False)
    assert report.passed, report.text()
    data = report.to_dict()
    assert "KV cache" in data["inputs"]["source"]
    shapes = {s["name"]: s["shape"] for s in data["inputs"]["specs"]}
    assert shapes["past_key_values.0.key"] == [2, 2, 8, 16] and shapes["input_ids"] == [2, 4]
    gen = report.generation
    assert gen["cache"] and gen["tokens"] == 16 and gen["prompts"] == 2
    assert gen["agreeing_tokens"] == [16, 16]  # fp16 keeps these random-init greedy paths
    assert "greedy continuation (16 tokens after 2 prompt(s) of 8, with the KV cache)" in report.text()


def test_generate_zero_turns_it_off_and_a_non_lm_has_none(llama_kv16):
    assert autocast_onnx.validate(DECODERS / "llama_kv.onnx", llama_kv16, speed=False, generate=0).generation is None
    bert = ROOT / "examples/models/bert_tiny.onnx"
    converted = autocast_onnx.convert(str(bert)).model
    assert autocast_onnx.validate(bert, converted, speed=False).generation is None
    with pytest.raises(AutocastError, match="generate= must be a whole number"):
        autocast_onnx.validate(bert, converted, speed=False, generate=-1)


def test_cli_generate_option_and_report_json(llama_kv16, tmp_path):
    report_path = tmp_path / "r.json"
    result = CliRunner().invoke(
        cli,
        ["validate", str(DECODERS / "llama_kv.onnx"), str(llama_kv16), "--no-speed", "--generate", "4",
         "--report-json", str(report_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "greedy continuation (4 tokens" in result.output
    assert json.loads(report_path.read_text())["generation"]["tokens"] == 4
