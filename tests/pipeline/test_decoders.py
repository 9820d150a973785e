"""Decoder language models (tests/data/decoders, random-init Llama, Qwen2, Mistral, Gemma from
transformers configs: RMSNorm, rotary embeddings, SiLU / GELU-tanh gates, grouped-query attention,
causal + padding masks) through convert, lint, validate and check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import autocast_onnx
from autocast_onnx.cli.main import cli
from autocast_onnx.lint.engine import LintOptions, lint

# evidence tests: the shipped decoders through whole pipelines
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DECODERS = ROOT / "tests" / "data" / "decoders"
PLAIN = ["llama", "qwen2", "mistral", "gemma"]
CACHED = ["llama_kv", "qwen2_kv"]
CACHE = r"past_key_values\..*|present\..*"


def ops(model) -> set:
    return {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("name", PLAIN + CACHED)
def test_the_decoders_hold_what_they_claim(name):
    m = onnx.load(DECODERS / f"{name}.onnx")
    found = ops(m)
    assert {"Sin", "Cos"} <= found  # rotary embeddings: cos/sin of positions
    assert {"Pow", "ReduceMean", "Sqrt"} <= found  # RMSNorm, decomposed
    assert {"Softmax", "Where"} <= found  # additive causal + padding mask before the softmax
    assert ("Tanh" in found) == (name == "gemma")  # GELU-tanh gate; the others use SiLU
    assert "Sigmoid" in found or name == "gemma"
    # grouped-query attention: 2 key/value heads for 4 query heads
    kv = [i for i in m.graph.input if i.name.startswith("past_key_values.")]
    assert all(i.type.tensor_type.shape.dim[1].dim_value == 2 for i in kv)
    assert len(kv) == (4 if name in CACHED else 0)


def precisions_by_op(result) -> dict:
    by_op: dict = {}
    for e in result.plan.nodes:
        by_op.setdefault(e.op_type, set()).add(e.precision)
    return by_op


@pytest.mark.parametrize("name", PLAIN + CACHED)
def test_the_plan_keeps_the_numerically_sensitive_parts_fp32(name):
    # Planned for the design's runtime (ONNX Runtime's CUDA provider), the Softmax runs at fp16: its
    # inputs (the masked scores) are fp16 and its reader (the probabilities' Cast, retargeted to fp16)
    # reads fp16, and the CUDA kernel computes it in fp32 and rounds once (paint pass 6, kernel-fp32);
    # the mask fill (float32's lowest) is a mask sentinel, so the mask additions are fp16 as well.
    # Sin, Cos and the decomposed RMSNorm (Pow, ReduceMean, Sqrt) read fp32 values: they stay fp32.
    path = str(DECODERS / f"{name}.onnx")
    result = autocast_onnx.convert(path)
    by_op = precisions_by_op(result)
    assert by_op["MatMul"] == {"fp16"}
    for op in ("Sin", "Cos", "ReduceMean", "Sqrt"):
        assert by_op[op] == {"fp32"}, op
    # the RMSNorm's Pow stays fp32; a Pow of GELU's tanh form (gemma) runs fp16 with its GELU: its
    # overflow saturates in the Tanh (the fast plan, plan/kernel_io.py)
    for entry in result.plan.nodes:
        if entry.op_type == "Pow" and entry.precision != "fp32":
            assert entry.reasons[-1].code == "fast-plan", entry.explain()
    assert by_op["Softmax"] == {"fp16"}
    softmaxes = [e for e in result.plan.nodes if e.op_type == "Softmax"]
    for e in softmaxes:
        last = e.reasons[-1]
        assert last.code == "kernel-fp32", e.explain()
        assert "Softmax kernel computes in fp32 and rounds its outputs once" in last.message
        assert "its inputs are fp16 already and its readers read fp16" in last.message
    assert result.plan.kernels == "cuda"
    assert list(result.plan.mask_sentinels.values()) == [-49152.0]
    assert not [e for e in result.plan.nodes if any(r.code == "data-range" for r in e.reasons)]
    assert result.stats.casts_added < 60
    # --runtime any counts on no kernel: every Softmax stays fp32, with one Cast more in front of each
    # than the precise plan (gemma's fast plan also runs its tanh GELU low, with fewer Casts still)
    kept = autocast_onnx.convert(path, runtime="any")
    precise = autocast_onnx.convert(path, precise=True)
    assert result.stats.casts_added <= precise.stats.casts_added
    by_op = precisions_by_op(kept)
    assert by_op["MatMul"] == {"fp16"}
    for op in ("Softmax", "Sin", "Cos", "Pow", "ReduceMean", "Sqrt"):
        assert by_op[op] == {"fp32"}, op
    assert all(e.reasons[-1].code == "op-category" for e in kept.plan.nodes if e.op_type == "Softmax")
    assert kept.plan.kernels == "any"
    assert kept.stats.casts_added == precise.stats.casts_added + len(softmaxes)


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("name", PLAIN)
def test_check_passes_on_each_decoder(name, tmp_path):
    result = invoke("check", DECODERS / f"{name}.onnx", "--no-speed", "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.output
    assert "lint (converted model): 0 error" in result.output
    assert "greedy continuation: tokens agreeing before the first divergence 16/16, 16/16" in result.output


@pytest.mark.parametrize("name", CACHED)
def test_check_passes_on_each_cached_decoder_with_a_low_precision_cache(name, tmp_path):
    out = tmp_path / "out.onnx"
    result = invoke("check", DECODERS / f"{name}.onnx", "--no-speed", "--low-precision-io", CACHE, "-o", out)
    assert result.exit_code == 0, result.output
    converted = onnx.load(out)
    types = {v.name: v.type.tensor_type.elem_type for v in [*converted.graph.input, *converted.graph.output]}
    assert types["past_key_values.0.key"] == onnx.TensorProto.FLOAT16 and types["logits"] == onnx.TensorProto.FLOAT


def with_infinite_mask(name: str, path: Path) -> Path:
    """The decoder with its mask fill float32-lowest replaced by -inf, as exports through PyTorch's
    scaled-dot-product attention write it (the models the linter wrongly failed)."""
    m = onnx.load(DECODERS / f"{name}.onnx")
    replaced = 0
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.size == 1 and float(a.reshape(-1)[0]) == float(np.finfo(np.float32).min):
            t.CopyFrom(numpy_helper.from_array(np.full(a.shape, -np.inf, np.float32), t.name))
            replaced += 1
    for n in m.graph.node:
        if n.op_type == "Constant":
            for attr in n.attribute:
                if attr.name == "value":
                    a = numpy_helper.to_array(attr.t)
                    if (
                        a.dtype == np.float32
                        and a.size == 1
                        and float(a.reshape(-1)[0]) == float(np.finfo(np.float32).min)
                    ):
                        attr.t.CopyFrom(numpy_helper.from_array(np.full(a.shape, -np.inf, np.float32), attr.t.name))
                        replaced += 1
    assert replaced == 1, replaced
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_an_infinite_mask_converts_and_lints_clean(name, tmp_path):
    # The report: lint said AC203 four times on the converter's own output for an -inf mask.
    # -inf is -inf in fp16: the conversion changes nothing about it, and the lint now agrees.
    src = with_infinite_mask(name, tmp_path / f"{name}_inf.onnx")
    converted = autocast_onnx.convert(str(src)).model
    errors = [d for d in lint(converted, LintOptions()).diagnostics if d.severity == "error"]
    assert errors == []
    result = invoke("check", src, "--no-speed", "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.output
