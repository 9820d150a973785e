"""Models after ONNX Runtime's transformer optimizer: its fused com.microsoft ops (SkipLayerNormalization,
BiasGelu, FastGelu, attention, rotary embedding, RMS normalization, n-bit GEMM, ...) get the category
and the fp32 pins that rules/default.toml gives them from their schemas and CUDA kernels.

Part 1 runs the optimizer (onnxruntime.transformers.optimizer, CPU) on the BERT and GPT-2 examples,
checks that it fused something, converts the result, compares the plan of every fused node with the
rules, and checks the converted model: onnx.checker, an ONNX Runtime session, `validate` with emulated
fp16 within its thresholds, and `lint` without errors.

Part 2 builds one small graph (onnx.helper) per fused op that the optimizer does not write for these
models on CPU, and checks the casts around it: which float inputs become low precision, that integer
inputs and pinned ports are left alone, that pinned outputs stay fp32, and that the result type-checks.
"""

from __future__ import annotations

import collections
from pathlib import Path

import case_helpers as C
import helpers as H
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import autocast_onnx
from autocast_onnx.catalog import load_rules
from autocast_onnx.graph import build_index
from autocast_onnx.rewrite.checks import check_result

MS = "com.microsoft"
MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"
INT32, INT64, UINT8, INT8 = TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.INT8
F16, F32 = H.F16, H.F32

# The fused ops the optimizer must write for each example: the tests below would pass on a model
# without fusions, so their presence is asserted first. (Neither export's attention matches ORT's
# attention fusion: the mask is a Where with float32's lowest value. Part 2 covers attention.)
FUSED = {
    "bert_tiny": ("bert", {"SkipLayerNormalization", "BiasGelu"}),
    "gpt2_tiny": ("gpt2", {"SkipLayerNormalization", "FastGelu"}),
}
# What a node of each category computes in, in these models (their follow ops read fp16 MatMuls)
PRECISION_OF = {"low_precision": "fp16", "follow": "fp16", "keep_fp32": "fp32"}


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of the main graph: declared, or inferred from the op signatures
    (ONNX's own inference knows no com.microsoft op). ONNX Runtime checks the same types for real
    when it loads the model (ort_type_checks)."""
    index = build_index(model, "<test>")
    return {name: value.dtype for name, value in index.main.values.items()}


def ort_type_checks(model: onnx.ModelProto) -> str:
    """Load the model in ONNX Runtime's CPU provider. ONNX Runtime resolves the graph against its
    own schemas (every node's types) before it looks for kernels, so a missing CPU kernel (some
    contrib ops exist for CUDA only) still means the graph type-checked: "no CPU kernel" is
    returned then, "loaded" when the session was created; any other failure is raised."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception classes
        if "NOT_IMPLEMENTED" in str(exc):
            return "no CPU kernel"
        raise
    return "loaded"


def cast_from(model: onnx.ModelProto, tensor: str) -> int | None:
    """The `to` of the Cast that produces `tensor`, or None when no Cast produces it."""
    node = C.producer(model.graph, tensor)
    return C.cast_to(node) if node is not None and node.op_type == "Cast" else None


def fused_node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return H.node_by_name(model, name)


# =========================================================================================
# Part 1: the optimizer's output for the BERT and GPT-2 examples
# =========================================================================================
@pytest.fixture(scope="module")
def optimize(tmp_path_factory):
    """name -> path of the example as the optimizer leaves it, each optimized once per module.
    opt_level 0 runs the optimizer's own fusions (those write the com.microsoft ops); opt_level
    >= 1 first runs ONNX Runtime's graph optimizer, which this onnxruntime imports torch for.
    Symbolic shape inference needs sympy, which onnxruntime no longer installs; these models fuse
    the same without it."""
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    from onnxruntime.transformers.fusion_options import FusionOptions

    folder = tmp_path_factory.mktemp("optimized")
    done: dict[str, Path] = {}

    def optimized_path(name: str) -> Path:
        if name not in done:
            model_type, _ = FUSED[name]
            options = FusionOptions(model_type)
            options.enable_shape_inference = False
            result = optimizer.optimize_model(
                str(MODELS / f"{name}.onnx"),
                model_type=model_type,
                num_heads=4,
                hidden_size=64,
                opt_level=0,
                use_gpu=False,
                optimization_options=options,
            )
            done[name] = folder / f"{name}.opt.onnx"
            result.save_model_to_file(str(done[name]))
        return done[name]

    return optimized_path


@pytest.fixture(scope="module", params=sorted(FUSED))
def optimized(request, optimize):
    """(name, path of the optimized model), for each example."""
    return request.param, optimize(request.param)


@pytest.fixture(scope="module")
def converted(optimized):
    name, path = optimized
    return name, path, autocast_onnx.convert(path, check="full")


def test_the_optimizer_fused_the_examples(optimized):
    name, path = optimized
    model = onnx.load(path)
    fused = collections.Counter(n.op_type for n in model.graph.node if n.domain == MS)
    _, expected = FUSED[name]
    assert expected <= set(fused), f"{name}: the optimizer wrote {dict(fused)}"
    assert any(o.domain == MS for o in model.opset_import)


def test_fused_nodes_get_the_category_precision_and_pins_of_the_rules(converted):
    _name, path, result = converted
    rules = load_rules()
    source = onnx.load(path)
    types = value_types(result.model)
    entries = [e for e in result.plan.nodes if e.domain == MS]
    assert entries
    for entry in entries:
        rule = rules.op_rule(MS, entry.op_type)
        assert rule is not None, f"{entry.op_type} has no rule"
        assert entry.category == rule.category, entry.label
        assert entry.precision == PRECISION_OF[rule.category], entry.label
        node = fused_node(source, entry.name)
        pin = rules.pin(MS, entry.op_type)
        pinned_in = tuple(p for p in (pin.inputs if pin else ()) if p < len(node.input))
        pinned_out = tuple(p for p in (pin.outputs if pin else ()) if p < len(node.output))
        assert tuple(entry.fp32_inputs) == pinned_in and tuple(entry.fp32_outputs) == pinned_out, entry.label
        # the converted node's float tensors: pinned ports fp32, the others in the node's precision
        after = fused_node(result.model, entry.name)
        want = {"fp16": F16, "fp32": F32}[entry.precision]
        for ports, pinned in ((after.input, pinned_in), (after.output, pinned_out)):
            for port, tensor in enumerate(ports):
                if tensor and types[tensor] in (F16, F32):
                    assert types[tensor] == (F32 if port in pinned else want), (entry.label, port, tensor)


def test_converted_model_checks_loads_validates_and_lints(converted):
    _name, path, result = converted
    onnx.checker.check_model(result.model, full_check=True)
    assert ort_type_checks(result.model) == "loaded"
    report = autocast_onnx.validate(path, result.model, numerics="emulate", device="cpu", speed=False, batches=2)
    assert report["numerics"] == "emulate"
    assert report.passed, report.text()
    assert not report.warnings, report.warnings
    lint = autocast_onnx.lint(result.model)
    assert lint.passed and not [d for d in lint.findings if d.severity == "error"], lint.text()


def test_skip_layer_norm_stays_fp32_because_fp16_costs_bert_accuracy(optimize, tmp_path):
    """The measurement behind SkipLayerNormalization's keep_fp32 (rules/default.toml): in fp16 it
    halves the casts, but bert_tiny's residual stream is then stored in fp16 and its error grows
    tens of times (measured 7.2e-5 -> 4.6e-3 max abs)."""
    path = optimize("bert_tiny")
    low = tmp_path / "sln_low.toml"
    low.write_text('[ops.low_precision]\n"com.microsoft:SkipLayerNormalization" = "measuring the default"\n')
    errors, casts = {}, {}
    for variant, rules in (("default", []), ("low", [low])):
        result = autocast_onnx.convert(path, rules=rules, precise=True)  # the fast plan's stream is fp16 anyway
        report = autocast_onnx.validate(path, result.model, speed=False, batches=4, seed=1)
        errors[variant] = max(o.max_abs_error for o in report.outputs)
        casts[variant] = result.stats.casts_added
    assert casts["low"] < casts["default"]
    assert errors["low"] > 10 * errors["default"], errors


# =========================================================================================
# Part 2: one graph per fused op the optimizer does not write here
# =========================================================================================
B, S, HEADS, KV_HEADS, HEAD = 2, 4, 4, 2, 16  # ONNX Runtime's CPU GroupQueryAttention wants HEAD % 16 == 0
E = HEADS * HEAD


def weights(name, shape, seed, scale=0.2):
    return numpy_helper.from_array(H.randn(shape, seed, scale), name)


def contrib_model(nodes, inputs, outputs, initializers=()):
    return H.model(nodes, inputs, outputs, initializers, extra_opsets=[(MS, 1)])


def gqa_model(quantized_cache=False):
    """q_proj (MatMul) -> GroupQueryAttention with rotary caches; prompt step (empty past)."""
    cache_type = INT8 if quantized_cache else F32
    inputs = [
        H.tensor("x", F32, [B, S, E]),
        H.tensor("key", F32, [B, S, KV_HEADS * HEAD]),
        H.tensor("value", F32, [B, S, KV_HEADS * HEAD]),
        H.tensor("past_key", cache_type, [B, KV_HEADS, 0, HEAD]),
        H.tensor("past_value", cache_type, [B, KV_HEADS, 0, HEAD]),
        H.tensor("seqlens_k", INT32, [B]),
        H.tensor("total_sequence_length", INT32, []),
    ]
    ports = [
        "q",
        "key",
        "value",
        "past_key",
        "past_value",
        "seqlens_k",
        "total_sequence_length",
        "cos_cache",
        "sin_cache",
    ]
    attrs = {"num_heads": HEADS, "kv_num_heads": KV_HEADS, "do_rotary": 1}
    initializers = [
        weights("wq", [E, E], 1),
        weights("cos_cache", [16, HEAD // 2], 2, 1.0),
        weights("sin_cache", [16, HEAD // 2], 3, 1.0),
    ]
    if quantized_cache:
        ports += ["", "", "", "k_scale", "v_scale"]
        attrs.update(k_quant_type="PER_TENSOR", v_quant_type="PER_TENSOR", kv_cache_bit_width=8)
        initializers += [numpy_helper.from_array(np.array([0.02], np.float32), n) for n in ("k_scale", "v_scale")]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node(
            "GroupQueryAttention", ports, ["out", "present_key", "present_value"], name="gqa", domain=MS, **attrs
        ),
    ]
    outputs = [
        H.tensor("out", F32, [B, S, E]),
        H.tensor("present_key", cache_type, [B, KV_HEADS, S, HEAD]),
        H.tensor("present_value", cache_type, [B, KV_HEADS, S, HEAD]),
    ]
    return contrib_model(nodes, inputs, outputs, initializers)


def gqa_feeds():
    return {
        "x": H.randn([B, S, E], 4),
        "key": H.randn([B, S, KV_HEADS * HEAD], 5),
        "value": H.randn([B, S, KV_HEADS * HEAD], 6),
        "past_key": np.zeros([B, KV_HEADS, 0, HEAD], np.float32),
        "past_value": np.zeros([B, KV_HEADS, 0, HEAD], np.float32),
        "seqlens_k": np.full([B], S - 1, np.int32),
        "total_sequence_length": np.array(S, np.int32),
    }


def test_group_query_attention_converts_data_and_caches_and_leaves_the_lengths(precision):
    m = gqa_model()
    result, out = H.convert_and_check(m, precision=precision)
    low = C.TARGET[precision]
    assert H.planned(result, "gqa") == precision
    gqa, types = fused_node(out, "gqa"), value_types(out)
    # query, key, value and the past cache in the target type; cos/sin caches (type T, the query's
    # type) converted with them, not pinned
    assert [types[t] for t in gqa.input[:5]] == [low] * 5
    assert C.initializer(out.graph, "cos_cache").data_type == low
    assert C.initializer(out.graph, "sin_cache").data_type == low
    # the int32 lengths go in as they came: graph inputs, no Cast
    assert list(gqa.input[5:7]) == ["seqlens_k", "total_sequence_length"]
    assert {t: C.input_types(out)[t] for t in gqa.input[5:7]} == {"seqlens_k": INT32, "total_sequence_length": INT32}
    # fp32 graph outputs (keep_io_types) behind a Cast
    assert [cast_from(out, o) for o in ("out", "present_key", "present_value")] == [F32] * 3
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":  # ONNX Runtime's CPU provider has GroupQueryAttention in fp16, not bf16
        C.compare_runs(m, out, gqa_feeds(), precision)


def test_group_query_attention_keeps_its_kv_scales_fp32_and_the_int8_cache_as_it_is():
    m = gqa_model(quantized_cache=True)
    result, out = H.convert_and_check(m)
    entry = C.entry(result, "gqa")
    assert entry.precision == "fp16" and tuple(entry.fp32_inputs) == (12, 13)
    gqa = fused_node(out, "gqa")
    # k_scale/v_scale (T_KV_SCALE = float only) stay fp32 initializers read directly
    assert list(gqa.input[12:14]) == ["k_scale", "v_scale"]
    assert [C.initializer(out.graph, n).data_type for n in ("k_scale", "v_scale")] == [F32, F32]
    # the int8 cache is not a float tensor: graph input in, graph output out, no Cast
    assert list(gqa.input[3:5]) == ["past_key", "past_value"]
    assert list(gqa.output[1:]) == ["present_key", "present_value"]
    assert value_types(out)["q"] == F16
    # ONNX Runtime's CPU provider has no kernel for a quantized cache; the types check
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")


def mha_model():
    """q_proj (MatMul) -> MultiHeadAttention with a key padding mask and its qk scores as an output."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node(
            "MultiHeadAttention",
            ["q", "key", "value", "", "key_padding_mask"],
            ["out", "", "", "qk"],
            name="mha",
            domain=MS,
            num_heads=HEADS,
        ),
    ]
    inputs = [
        H.tensor("x", F32, [B, S, E]),
        H.tensor("key", F32, [B, S, E]),
        H.tensor("value", F32, [B, S, E]),
        H.tensor("key_padding_mask", INT32, [B, S]),
    ]
    outputs = [H.tensor("out", F32, [B, S, E]), H.tensor("qk", F32, [B, HEADS, S, S])]
    return contrib_model(nodes, inputs, outputs, [weights("wq", [E, E], 7)])


def mha_feeds():
    mask = np.ones([B, S], np.int32)
    mask[1, S - 1 :] = 0
    return {
        "x": H.randn([B, S, E], 8),
        "key": H.randn([B, S, E], 9),
        "value": H.randn([B, S, E], 10),
        "key_padding_mask": mask,
    }


def test_multi_head_attention_runs_low_with_its_qk_scores_pinned_fp32(precision):
    m = mha_model()
    result, out = H.convert_and_check(m, precision=precision)
    entry = C.entry(result, "mha")
    assert entry.precision == precision and tuple(entry.fp32_outputs) == (3,)
    mha, types = fused_node(out, "mha"), value_types(out)
    assert [types[t] for t in mha.input[:3]] == [C.TARGET[precision]] * 3
    assert mha.input[4] == "key_padding_mask"  # int32, untouched
    # qk (its own type QK) is written in fp32 straight into the fp32 graph output: no Cast
    assert mha.output[3] == "qk" and cast_from(out, "qk") is None and C.output_types(out)["qk"] == F32
    assert cast_from(out, "out") == F32
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        C.compare_runs(m, out, mha_feeds(), precision)


def test_multi_head_attention_with_unpinned_qk_output_loads_in_onnx_runtime(tmp_path):
    """Bug fixed: a node output moved behind the keep_io_types Cast (qk -> qk_fp16) had no type
    declaration, and ONNX Runtime cannot infer MultiHeadAttention's qk type (no input binds QK), so
    the converted model failed to load. The rewrite now declares the renamed tensor."""
    unpin = tmp_path / "unpin.toml"
    unpin.write_text('[pins]\n"com.microsoft:MultiHeadAttention" = { outputs = [], why = "qk in fp16" }\n')
    result, out = H.convert_and_check(mha_model(), rules=[unpin])
    assert C.entry(result, "mha").fp32_outputs == []
    assert ort_type_checks(out) == "loaded"


def masked_mha_model():
    """An additive mask built the way the example exports build theirs, Where(mask, 0, float32's
    lowest), fed to MultiHeadAttention's attention_bias (type T, the query's type)."""
    lowest = numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    axes = numpy_helper.from_array(np.array([1, 2], np.int64), "axes")
    shape = numpy_helper.from_array(np.array([B, 1, S, S], np.int64), "bias_shape")
    nodes = [
        helper.make_node("Cast", ["mask"], ["visible"], name="mask_bool", to=TensorProto.BOOL),
        helper.make_node("Where", ["visible", "zero", "lowest"], ["bias_2d"], name="fill"),
        helper.make_node("Unsqueeze", ["bias_2d", "axes"], ["bias_4d"], name="unsqueeze"),
        helper.make_node("Expand", ["bias_4d", "bias_shape"], ["attention_bias"], name="expand"),
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node(
            "MultiHeadAttention",
            ["q", "key", "value", "", "", "attention_bias"],
            ["out"],
            name="mha",
            domain=MS,
            num_heads=HEADS,
        ),
    ]
    inputs = [H.tensor(n, F32, [B, S, E]) for n in ("x", "key", "value")] + [H.tensor("mask", INT64, [B, S])]
    initializers = [lowest, zero, axes, shape, weights("wq", [E, E], 37)]
    return contrib_model(nodes, inputs, [H.tensor("out", F32, [B, S, E])], initializers)


def test_an_out_of_range_mask_does_not_reach_a_low_precision_attention_as_inf(tmp_path):
    """Bug fixed: the data rule kept Where(mask, 0, float32 lowest) fp32, but the Cast in front of
    the low-precision MultiHeadAttention's attention_bias turned -3.4e38 into -inf, and a fully
    masked row was NaN under emulated fp16. Out-of-range values are now followed through the ops
    that pass them on (hazards.PASS_ON_OPS, as the linter's AC203 does): the attention stays fp32."""
    m = masked_mha_model()
    result, out = H.convert_and_check(m)
    assert H.planned(result, "mha") == "fp32"
    assert any("reads 'lowest' through Expand" in r.message for r in C.entry(result, "mha").reasons)
    mask = np.ones([B, S], np.int64)
    mask[1, :] = 0  # a padding row: every key masked
    batch = tmp_path / "batch.npz"
    np.savez(batch, x=H.randn([B, S, E], 38), key=H.randn([B, S, E], 39), value=H.randn([B, S, E], 40), mask=mask)
    report = autocast_onnx.validate(m, out, inputs=batch, numerics="emulate", device="cpu", speed=False)
    assert not any(o.new_nan for o in report.outputs) and report.passed, report.text()


def test_attention_converts_its_projection_and_leaves_the_mask_index(precision):
    nodes = [
        helper.make_node("Attention", ["x", "w", "b", "mask_index"], ["out"], name="attn", domain=MS, num_heads=HEADS)
    ]
    m = contrib_model(
        nodes,
        [H.tensor("x", F32, [B, S, E]), H.tensor("mask_index", INT32, [B])],
        [H.tensor("out", F32, [B, S, E])],
        [weights("w", [E, 3 * E], 11), weights("b", [3 * E], 12, 0.1)],
    )
    result, out = H.convert_and_check(m, precision=precision)
    low = C.TARGET[precision]
    assert H.planned(result, "attn") == precision
    assert [C.initializer(out.graph, n).data_type for n in ("w", "b")] == [low, low]
    assert cast_from(out, fused_node(out, "attn").input[0]) == low
    assert fused_node(out, "attn").input[3] == "mask_index"
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        feeds = {"x": H.randn([B, S, E], 13), "mask_index": np.array([S, S - 1], np.int32)}
        C.compare_runs(m, out, feeds, precision)


def test_rotary_embedding_follows_the_projection_with_its_caches(precision):
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
        helper.make_node(
            "RotaryEmbedding",
            ["q", "position_ids", "cos_cache", "sin_cache"],
            ["q_rot"],
            name="rope",
            domain=MS,
            num_heads=HEADS,
        ),
        helper.make_node("MatMul", ["q_rot", "wo"], ["y"], name="o_proj"),
    ]
    m = contrib_model(
        nodes,
        [H.tensor("x", F32, [B, S, E]), H.tensor("position_ids", INT64, [B, S])],
        [H.tensor("y", F32, [B, S, E])],
        [
            weights("wq", [E, E], 14),
            weights("wo", [E, E], 15),
            weights("cos_cache", [16, HEAD // 2], 16, 1.0),
            weights("sin_cache", [16, HEAD // 2], 17, 1.0),
        ],
    )
    result, out = H.convert_and_check(m, precision=precision)
    low = C.TARGET[precision]
    assert H.planned(result, "rope") == precision
    rope = fused_node(out, "rope")
    assert value_types(out)[rope.input[0]] == low and value_types(out)[rope.output[0]] == low
    assert [C.initializer(out.graph, n).data_type for n in ("cos_cache", "sin_cache")] == [low, low]
    assert rope.input[1] == "position_ids"  # int64, untouched
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        feeds = {"x": H.randn([B, S, E], 18), "position_ids": np.tile(np.arange(S, dtype=np.int64), (B, 1))}
        C.compare_runs(m, out, feeds, precision)


def rms_between_matmuls(op, domain, extra_inputs, outputs, exposed):
    """fc1 (MatMul) -> an RMS normalization -> fc2 (MatMul); the `exposed` outputs of the
    normalization are graph outputs too."""
    norm_outputs = ["n"] + outputs
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node(op, ["h", *extra_inputs, "gamma"], norm_outputs, name="rms", domain=domain, epsilon=1e-6),
        helper.make_node("MatMul", ["n", "w2"], ["y"], name="fc2"),
    ]
    shapes = {"mean": [B, S, 1], "inv_std_var": [B, S, 1], "sum": [B, S, E]}
    graph_outputs = [H.tensor("y", F32, [B, S, E])] + [H.tensor(o, F32, shapes[o]) for o in exposed]
    return contrib_model(
        nodes,
        [H.tensor("x", F32, [B, S, E])],
        graph_outputs,
        [weights("w1", [E, E], 19), weights("w2", [E, E], 20), weights("gamma", [E], 21, 1.0)],
    )


def check_norm_stays_fp32(m, out, result, exposed, precision):
    assert H.planned(result, "rms") == "fp32"
    low = C.TARGET[precision]
    rms = fused_node(out, "rms")
    # fed from the low-precision fc1 through a Cast to fp32; gamma stays an fp32 initializer
    assert cast_from(out, rms.input[0]) == F32 and C.initializer(out.graph, "gamma").data_type == F32
    # the statistics (U = float, pinned) and the residual sum go to the fp32 graph outputs, no Cast
    for name in exposed:
        assert name in rms.output and cast_from(out, name) is None and C.output_types(out)[name] == F32
    assert cast_from(out, fused_node(out, "fc2").input[0]) == low
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        C.compare_runs(m, out, {"x": H.randn([B, S, E], 22)}, precision)


def test_simplified_layer_normalization_stays_fp32_with_inv_std_var(precision):
    """ONNX Runtime's RMSNorm in the default domain: onnx.checker knows no such op (it rejects the
    input model too), so the converted model is checked with the converter's own final check, which
    moves ONNX Runtime's default-domain ops aside for onnx.checker, and by ONNX Runtime."""
    m = rms_between_matmuls("SimplifiedLayerNormalization", "", [], ["inv_std_var"], ["inv_std_var"])
    result = autocast_onnx.convert(m, precision=precision)
    out = result.model
    check_result(out, full=True)
    assert tuple(C.entry(result, "rms").fp32_outputs) == (1,)
    check_norm_stays_fp32(m, out, result, ["inv_std_var"], precision)


def test_skip_simplified_layer_normalization_stays_fp32_with_its_statistics(precision):
    m = rms_between_matmuls(
        "SkipSimplifiedLayerNormalization", MS, ["x"], ["mean", "inv_std_var", "sum"], ["inv_std_var", "sum"]
    )
    result, out = H.convert_and_check(m, precision=precision)
    assert tuple(C.entry(result, "rms").fp32_outputs) == (1, 2)
    assert fused_node(out, "rms").input[1] == "x"  # the fp32 graph input is the skip, read as it is
    check_norm_stays_fp32(m, out, result, ["inv_std_var", "sum"], precision)


def test_embed_layer_normalization_stays_fp32_and_leaves_ids_and_mask_index(precision):
    nodes = [
        helper.make_node(
            "EmbedLayerNormalization",
            [
                "input_ids",
                "segment_ids",
                "word_embedding",
                "position_embedding",
                "segment_embedding",
                "gamma",
                "beta",
                "mask",
            ],
            ["embedded", "mask_index"],
            name="embed",
            domain=MS,
            epsilon=1e-12,
        ),
        helper.make_node("MatMul", ["embedded", "w"], ["y"], name="fc"),
    ]
    tables = [
        weights("word_embedding", [50, E], 23),
        weights("position_embedding", [16, E], 24),
        weights("segment_embedding", [2, E], 25),
        weights("gamma", [E], 26, 1.0),
        weights("beta", [E], 27, 0.1),
    ]
    m = contrib_model(
        nodes,
        [H.tensor("input_ids", INT32, [B, S]), H.tensor("segment_ids", INT32, [B, S]), H.tensor("mask", INT32, [B, S])],
        [H.tensor("y", F32, [B, S, E]), H.tensor("mask_index", INT32, [B])],
        tables + [weights("w", [E, E], 28)],
    )
    result, out = H.convert_and_check(m, precision=precision)
    assert H.planned(result, "embed") == "fp32" and H.planned(result, "fc") == precision
    embed = fused_node(out, "embed")
    assert [embed.input[i] for i in (0, 1, 7)] == ["input_ids", "segment_ids", "mask"]
    assert {t.name: t.data_type for t in out.graph.initializer if t.name != "w"} == {t.name: F32 for t in tables}
    assert embed.output[1] == "mask_index" and cast_from(out, "mask_index") is None
    assert cast_from(out, fused_node(out, "fc").input[0]) == C.TARGET[precision]
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        rng = np.random.default_rng(29)
        feeds = {
            "input_ids": rng.integers(0, 50, [B, S], dtype=np.int32),
            "segment_ids": (np.arange(S)[None, :] >= S // 2).astype(np.int32).repeat(B, 0),
            "mask": np.ones([B, S], np.int32),
        }
        C.compare_runs(m, out, feeds, precision)


def test_gemma_rotary_embedding_keeps_emb_fp32_beside_fp16_data():
    """GemmaRotaryEmbedding takes q, k (T) as float16 only and emb (U) as float only; the model feeds
    it through the author's Casts. Its only kernel is CUDA's: ONNX Runtime type-checks it on CPU."""
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q32"], name="q_proj"),
        helper.make_node("Cast", ["q32"], ["q"], name="to_fp16", to=F16),
        helper.make_node(
            "GemmaRotaryEmbedding", ["emb", "q", "q", "q", "q"], ["q_embed", "k_embed"], name="rope", domain=MS
        ),
        helper.make_node("Cast", ["q_embed"], ["y"], name="to_fp32", to=F32),
    ]
    m = contrib_model(
        nodes,
        [H.tensor("x", F32, [B, HEADS, S, HEAD]), H.tensor("emb", F32, [B, S, HEAD])],
        [H.tensor("y", F32, [B, HEADS, S, HEAD])],
        [weights("wq", [HEAD, HEAD], 30)],
    )
    assert ort_type_checks(m) == "no CPU kernel"
    result, out = H.convert_and_check(m)
    assert tuple(C.entry(result, "rope").fp32_inputs) == (0,)
    rope, types = fused_node(out, "rope"), value_types(out)
    assert rope.input[0] == "emb" and types["emb"] == F32  # the fp32 graph input, no Cast
    assert [types[t] for t in rope.input[1:]] == [F16] * 4
    assert ort_type_checks(out) == "no CPU kernel"


def nbits_model(float_zero_points):
    K, N, BLOCK = 32, 16, 16
    rng = np.random.default_rng(31)
    packed = numpy_helper.from_array(rng.integers(0, 255, (N, K // BLOCK, BLOCK // 2), dtype=np.uint8), "B_packed")
    scales = weights("scales", [N * (K // BLOCK)], 32, 0.05)
    if float_zero_points:
        zero_points = numpy_helper.from_array(np.full([N * (K // BLOCK)], 8.0, np.float32), "zero_points")
    else:
        zero_points = numpy_helper.from_array(
            rng.integers(0, 255, (N * (K // BLOCK) // 2,), dtype=np.uint8), "zero_points"
        )
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["A", "B_packed", "scales", "zero_points"],
            ["Y"],
            name="gemm",
            domain=MS,
            K=K,
            N=N,
            bits=4,
            block_size=BLOCK,
        )
    ]
    m = contrib_model(nodes, [H.tensor("A", F32, [B, K])], [H.tensor("Y", F32, [B, N])], [packed, scales, zero_points])
    return m, {"A": H.randn([B, K], 33)}


@pytest.mark.parametrize("float_zero_points", [False, True], ids=["uint8_zero_points", "float_zero_points"])
def test_matmul_nbits_converts_activation_and_scales_not_packed_weights(precision, float_zero_points):
    m, feeds = nbits_model(float_zero_points)
    result, out = H.convert_and_check(m, precision=precision)
    low = C.TARGET[precision]
    assert H.planned(result, "gemm") == precision
    assert cast_from(out, fused_node(out, "gemm").input[0]) == low
    assert C.initializer(out.graph, "scales").data_type == low  # T1: must match A
    assert C.initializer(out.graph, "B_packed").data_type == UINT8
    # float zero points are T3 and must match A too; packed ones are uint8 and stay so
    assert C.initializer(out.graph, "zero_points").data_type == (low if float_zero_points else UINT8)
    assert ort_type_checks(out) in ("loaded", "no CPU kernel")
    if precision == "fp16":
        C.compare_runs(m, out, feeds, precision)


# op -> (extra inputs after the MatMul output, output shape, schema has bfloat16, CPU kernel)
ELEMENTWISE = {
    "BiasGelu": (["bias"], [B, S, E], True, True),
    "FastGelu": (["bias"], [B, S, E], True, True),
    "Gelu": ([], [B, S, E], True, True),
    "QuickGelu": ([], [B, S, E], True, True),
    "BiasSplitGelu": (["bias"], [B, S, E // 2], False, False),
    "BiasAdd": (["bias", "x"], [B, S, E], False, False),
}


@pytest.mark.parametrize("op", sorted(ELEMENTWISE))
def test_elementwise_fused_op_follows_its_matmul(op, precision):
    extra, shape, has_bf16, cpu_kernel = ELEMENTWISE[op]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node(op, ["h", *extra], ["y"], name="act", domain=MS),
    ]
    initializers = [weights("w", [E, E], 34)] + ([weights("bias", [E], 35, 0.1)] if "bias" in extra else [])
    m = contrib_model(nodes, [H.tensor("x", F32, [B, S, E])], [H.tensor("y", F32, shape)], initializers)
    result, out = H.convert_and_check(m, precision=precision)
    low = C.TARGET[precision]
    act = fused_node(out, "act")
    if precision == "fp16" or has_bf16:
        assert H.planned(result, "act") == precision
        assert value_types(out)[act.input[0]] == low and cast_from(out, "y") == F32
        if "bias" in extra:
            assert C.initializer(out.graph, "bias").data_type == low
    else:  # the schema has no bfloat16: the node stays fp32 and says why
        assert H.planned(result, "act") == "fp32" and "schema" in C.reason_codes(result, "act")
        assert cast_from(out, act.input[0]) == F32
    loaded = ort_type_checks(out)  # the CPU provider has no bf16 kernels at all
    assert loaded == ("loaded" if cpu_kernel and precision == "fp16" else "no CPU kernel")
    if precision == "fp16" and cpu_kernel:
        C.compare_runs(m, out, {"x": H.randn([B, S, E], 36)}, precision)
