"""Regenerate rules/default.toml from the shared op reference table.

The table (reference/onnx_op_categories.csv, vendored in the repository) records, for every op of
ai.onnx, ai.onnx.ml, ai.onnx.preview(.training) and com.microsoft, what other
mixed-precision systems do with it and a suggested category. This script turns it
into the default rule profile. OVERRIDES below set an op's category and reason where the
project deliberately departs from the suggestion, or where the reason comes from the op's
kernel source; PINS set the fp32 ports whose reason says more than the table's generic one.
After running it, review the diff of rules/default.toml: the TOML file is the source of truth
that the tool reads (it has been edited by hand since; bring such edits here before
regenerating, or copy only the lines you changed).

    python tools/gen_default_rules.py [path/to/onnx_op_categories.csv]
"""

import csv
import json
import pathlib
import sys

import onnx.defs

ROOT = pathlib.Path(__file__).resolve().parent.parent
CATEGORY_OF = {
    "compute_fp16": "low_precision",
    "follow": "follow",
    "keep_fp32": "keep_fp32",
    "type_agnostic": "clear",
    "non_float": "non_float",
}
OVERRIDES = {
    ("ai.onnx", "Sqrt"): (
        "keep_fp32",
        "departs from TF (infer) and MXNet (neutral): sqrt of a variance sum that "
        "overflowed or flushed in fp16 gives inf/0 and then NaN after the divide; kept fp32 like "
        "Pow and Reciprocal, which surround it in decomposed normalizations",
    ),
    ("ai.onnx", "BatchNormalization"): (
        "keep_fp32",
        "departs from TF (infer) and MXNet (neutral): every "
        "normalization stays fp32; running variance + epsilon can flush in fp16 "
        "and tiny variances blow up 1/sqrt(var)",
    ),
    ("ai.onnx", "ReduceMax"): (
        "keep_fp32",
        "departs from TF (clear): the selection is exact, but every Reduce* op "
        "is kept fp32 so reductions are one uniform rule; move it to [ops.clear] in your "
        "rule file if the casts cost more than they save",
    ),
    ("ai.onnx", "ReduceMin"): (
        "keep_fp32",
        "departs from TF (clear): the selection is exact, but every Reduce* op "
        "is kept fp32 so reductions are one uniform rule; move it to [ops.clear] in your "
        "rule file if the casts cost more than they save",
    ),
    # ONNX Runtime's fused ops, as its transformer optimizer writes them: the category and the
    # reason from the op's schema (onnxruntime/core/graph/contrib_ops/bert_defs.cc) and its CUDA
    # kernel (onnxruntime/contrib_ops/cuda/bert/, registrations in cuda_contrib_kernels.cc).
    # Measured figures: the optimizer's output for examples/models/bert_tiny and gpt2_tiny,
    # validated with emulated fp16 (tests/catalog/test_fused_ops.py builds those models).
    ("com.microsoft", "Attention"): (
        "low_precision",
        "fused QKV projection + attention: ONNX Runtime's CUDA kernel takes T = float16/bfloat16 "
        "for input, weights, bias, past and attention_bias, and reduces its softmax in float "
        "(attention_softmax.cu); mask_index and past_sequence_length are int32 and never cast",
    ),
    ("com.microsoft", "MultiHeadAttention"): (
        "low_precision",
        "attention: ONNX Runtime's CUDA kernel takes T = float16/bfloat16 for query, key, value, "
        "bias, attention_bias and past key/value, and reduces its softmax in float; "
        "key_padding_mask, past_sequence_length and cache_indirection are int32. Output qk has "
        "its own type (QK), which the kernel writes in float from float16 data (registration "
        "MLFloat16_float): pinned fp32",
    ),
    ("com.microsoft", "DecoderMaskedMultiHeadAttention"): (
        "low_precision",
        "attention (one decoding step): ONNX Runtime's CUDA kernel takes T = float16 (and "
        "float) for query, key, value, bias, attention_bias and past key/value; mask_index, "
        "past_sequence_length, beam_width and cache_indirection are int32. Output qk has its "
        "own type (QK), which the kernel writes in float from float16 data: pinned fp32",
    ),
    ("com.microsoft", "GroupQueryAttention"): (
        "low_precision",
        "attention with a KV cache: ONNX Runtime's CUDA kernel exists for T = float16/bfloat16 "
        "only. cos_cache, sin_cache, attention_bias, head_sink and the q/k norm weights are T: "
        "they are converted with the query (a cache left fp32 would not type-check); "
        "past/present key and value are T_CACHE (float16/bfloat16, or int8/fp8/uint8 when "
        "quantized, then left as they are); seqlens_k, total_sequence_length and query_seqlens "
        "are int32, position_ids int64; k_scale and v_scale are float only (pinned)",
    ),
    ("com.microsoft", "RotaryEmbedding"): (
        "follow",
        "elementwise rotation x*cos + rotate(x)*sin: ONNX Runtime's CUDA kernel takes "
        "float/float16/bfloat16. cos_cache and sin_cache have the input's type T (they cannot "
        "stay fp32 beside fp16 data); their values lie in [-1, 1], where fp16 keeps 11 bits, so "
        "compute them from the positions in fp32 (Cos and Sin stay fp32) and convert; "
        "position_ids is int64",
    ),
    ("com.microsoft", "GemmaRotaryEmbedding"): (
        "follow",
        "rotary embedding with Sin/Cos computed inside: the schema and ONNX Runtime's only "
        "kernel (CUDA) take q, k and their rotations as float16 only (T), and emb as float only "
        "(U, pinned: the angles must not be rounded before Sin/Cos)",
    ),
    ("com.microsoft", "SkipLayerNormalization"): (
        "keep_fp32",
        "LayerNorm of input + skip (+ bias), the residual stream: ONNX Runtime's CUDA kernel "
        "takes T = float16/bfloat16 with gamma, beta and bias of the same T (they cannot stay "
        "fp32 beside fp16 data), and accumulates mean and variance in fp32 since onnxruntime "
        "PR #28682 (before it, in T: fp16 sums of squares overflowed, issue #29034); mean and "
        "inv_std_var are float only (pinned). Kept fp32 because in fp16 the residual stream is "
        "stored in fp16: on the optimizer's bert_tiny the max abs error grew 7.2e-5 -> 4.6e-3 "
        "(casts 14 -> 7), on gpt2_tiny 4.3e-4 -> 5.3e-4 (casts 14 -> 7), as LayerNormalization "
        "did (docs/rules-evidence.md); ORT's GPT-2 recipe keeps it fp32 too. Move it to "
        "[ops.low_precision] in your rule file if you measure otherwise",
    ),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (
        "keep_fp32",
        "RMSNorm of input + skip (+ bias), the residual stream: the same CUDA kernel as "
        "SkipLayerNormalization (T = float16/bfloat16, gamma and bias of the same T, fp32 "
        "accumulation since onnxruntime PR #28682; before it fp16 sums of squares overflowed to "
        "all-zero outputs, issue #29034); mean and inv_std_var are float only (pinned). Kept "
        "fp32 like SkipLayerNormalization: the residual stream of deep decoders grows beyond "
        "what fp16 stores well; ORT's T5 recipe keeps it fp32 too",
    ),
    ("com.microsoft", "EmbedLayerNormalization"): (
        "keep_fp32",
        "word + position + segment embeddings and LayerNorm: ONNX Runtime's CUDA kernel takes "
        "T = float16 (no bfloat16) for the tables, gamma and beta, and accumulates in fp32 "
        "since onnxruntime PR #28682 (before it the sums and epsilon were fp16: 1e-12 became "
        "0); the ids, mask and position_ids are int32 and so is mask_index. Kept fp32 because "
        "its output starts the residual stream (LayerNormalization in fp16 cost bert_tiny 41 "
        "times the error, docs/rules-evidence.md); ORT's GPT-2 recipe keeps it fp32 too",
    ),
    ("com.microsoft", "FastGelu"): (
        "follow",
        "tanh-approximated GELU (+ bias): ONNX Runtime's CUDA kernel takes "
        "float/float16/bfloat16 and computes in T (half2 arithmetic); the tanh argument "
        "0.0357x^3 overflows fp16 for |x| > 122, where tanh(+-inf) = +-1 still gives GELU's "
        "limits x and 0. Measured on the optimizer's gpt2_tiny: fp32 adds 4 casts (14 -> 18) "
        "for max abs error 4.3e-4 -> 3.7e-4. ORT's GPT-2 recipe keeps it fp32",
    ),
    ("com.microsoft", "BiasGelu"): (
        "follow",
        "bias + exact (erf) GELU: ONNX Runtime's CUDA kernel takes float/float16/bfloat16, "
        "bias of the same T; elementwise and bounded below like Gelu. Measured on the "
        "optimizer's bert_tiny: fp32 adds 4 casts (14 -> 18) and changes no error",
    ),
    ("com.microsoft", "Gelu"): (
        "follow",
        "exact (erf) GELU: ONNX Runtime's CUDA kernel takes float/float16/bfloat16; elementwise "
        "and bounded below (>= -0.17), like ai.onnx Gelu",
    ),
    ("com.microsoft", "QuickGelu"): (
        "follow",
        "x*sigmoid(alpha*x): ONNX Runtime's CUDA kernel takes float/float16/bfloat16; elementwise, |y| <= |x|",
    ),
    ("com.microsoft", "BiasSplitGelu"): (
        "follow",
        "GEGLU of diffusion models, (X + bias) split in halves, left * Gelu(right): ONNX "
        "Runtime's CUDA kernel takes float/float16 (the schema has no bfloat16) with bias of "
        "the same T; no CPU kernel",
    ),
    ("com.microsoft", "BiasAdd"): (
        "follow",
        "X + bias + skip (diffusion UNet): ONNX Runtime's CUDA kernel takes float/float16 (the "
        "schema has no bfloat16) with bias and skip of the same T; elementwise; no CPU kernel",
    ),
    ("com.microsoft", "MatMulNBits"): (
        "low_precision",
        "GEMM with n-bit weights: ONNX Runtime's CUDA kernel takes A, scales, bias and Y as "
        "T1 = float/float16/bfloat16 (scales and bias are converted with A: they must match "
        "it), and float zero points must match A too (T3); B is packed uint8 and g_idx int32, "
        "never cast",
    ),
    ("ai.onnx", "LayerNormalization"): (
        "keep_fp32",
        "ONNX Runtime's CUDA kernel takes X, Scale and B as T = float16/bfloat16 and "
        "accumulates mean and variance in U = float; Mean and InvStdDev are U (pinned). Kept "
        "fp32 on measurement: in fp16 the residual stream it reads is stored in fp16 and "
        "bert_tiny's max abs error grew 41-fold (docs/rules-evidence.md); torch and MXNet keep "
        "it fp32, and so does ORT's GPT-2 recipe",
    ),
    ("ai.onnx", "SimplifiedLayerNormalization"): (
        "keep_fp32",
        "RMSNorm, ONNX Runtime's contrib op in the default domain: its CUDA kernel takes X (T) "
        "and scale and Y (V) as float16/bfloat16, or one side float, and accumulates in U = "
        "float; inv_std_var is U (pinned). Kept fp32 like LayerNormalization and "
        "RMSNormalization: its input is the residual stream; torch runs rms_norm in fp32 and "
        "ORT's T5 recipe keeps it fp32",
    ),
}
# Ports pinned fp32 with their reason, by port name (the table's fixed_fp32_ports, when it has
# the op, gives the same ports with a generic reason).
PINS = {
    ("ai.onnx", "Resize"): (
        ["roi", "scales"],
        [],
        "roi and scales are coordinates, not activations: fp16 rounding moves sampling positions",
    ),
    ("com.microsoft", "GroupNorm"): (
        ["gamma", "beta"],
        [],
        "input gamma, input beta: the schema admits float but not float16 here, or the value needs fp32 precision",
    ),
    ("com.microsoft", "SkipGroupNorm"): (
        ["gamma", "beta"],
        [],
        "input gamma, input beta: the schema admits float but not float16 here, or the value needs fp32 precision",
    ),
    ("ai.onnx", "LayerNormalization"): (
        [],
        ["Mean", "InvStdDev"],
        "the statistics Mean and InvStdDev have their own type U (float or bfloat16), and ONNX "
        "Runtime's CUDA kernel computes them in float whatever the data type",
    ),
    ("ai.onnx", "SimplifiedLayerNormalization"): (
        [],
        ["inv_std_var"],
        "inv_std_var has its own type U, float or double only: it cannot be float16",
    ),
    ("com.microsoft", "SkipLayerNormalization"): (
        [],
        ["mean", "inv_std_var"],
        "mean and inv_std_var are U = float only: the statistics stay fp32 whatever the data type",
    ),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (
        [],
        ["mean", "inv_std_var"],
        "mean and inv_std_var are U = float only: the statistics stay fp32 whatever the data type",
    ),
    ("com.microsoft", "MultiHeadAttention"): (
        [],
        ["qk"],
        "qk, the scaled Q*K' scores, has its own type QK; ONNX Runtime's CUDA kernel writes it "
        "in float from float16 data, and masked or large scores leave the fp16 range",
    ),
    ("com.microsoft", "DecoderMaskedMultiHeadAttention"): (
        [],
        ["qk"],
        "qk, the scaled Q*K' scores, has its own type QK; ONNX Runtime's CUDA kernel writes it "
        "in float from float16 data, and masked or large scores leave the fp16 range",
    ),
    ("com.microsoft", "GroupQueryAttention"): (
        ["k_scale", "v_scale"],
        [],
        "k_scale and v_scale, the scales of a quantized KV cache, are T_KV_SCALE = float only",
    ),
    ("com.microsoft", "GemmaRotaryEmbedding"): (
        ["emb"],
        [],
        "emb is U = float only: the angles go into Sin/Cos inside the kernel and must not be rounded",
    ),
}
HEADER = """\
# autocast-onnx default rule profile.
#
# Every op of ai.onnx, ai.onnx.ml, ai.onnx.preview(.training) and com.microsoft is listed in exactly
# one category below. Keys are "OpType" for the default ONNX domain and "domain:OpType" otherwise;
# the value says why the op is in that category (what TensorFlow's grappler lists, PyTorch
# autocast, MXNet AMP and the ONNX converters do with it, and why we agree or depart).
#
# Categories:
#   low_precision  run in fp16/bf16 (tensor-core ops: matmul, conv, attention, RNNs)
#   follow         elementwise: run in low precision when fed by low-precision nodes, unless an
#                  fp32 taint reaches them
#   keep_fp32      always fp32 (softmax, normalizations, reductions, exp/log/pow/sqrt, losses,
#                  random ops, ops without an fp16 schema or CUDA kernel)
#   clear          type-agnostic data movement; takes its neighbours' precision
#   non_float      integer/string/quantized ops; never touched
#
# This file was generated by tools/gen_default_rules.py from the shared op reference table and is
# maintained by hand from then on. User rule files (--rules FILE) use the same format; see
# docs/rules-format.md for the precedence.

[settings]
# Category of an op that no rule file names (custom domains, ops newer than this file).
# keep_fp32 is the safe default: an op we know nothing about is never fed low-precision data.
unknown_op = "keep_fp32"

[thresholds]
# A float constant or initializer with at most this many elements that would become all zeros in
# the target type (an epsilon of 1e-12, say) keeps its consumer fp32; if only some of its values
# flush, it is converted and the plan says so.
small_constant_elements = 64
# A larger initializer keeps its consumer fp32 when more than this fraction of its nonzero
# values would flush to zero in the target type; a smaller fraction is converted and reported.
max_flush_fraction = 0.01
# With --calibration-data: a node whose input or output reached more than (largest finite value of
# the target type) / calibration_headroom in magnitude, or whose nonzero values all flush to zero,
# stays fp32. 4 leaves room for inputs larger than the calibration data.
calibration_headroom = 4.0
"""


def key_of(domain: str, op: str) -> str:
    return op if domain in ("", "ai.onnx") else f"{domain}:{op}"


def toml_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def port_indices(domain, op, names, direction, signatures):
    if domain in ("", "ai.onnx") and onnx.defs.has(op):
        schema = onnx.defs.get_schema(op)
        ports = [p.name for p in (schema.inputs if direction == "in" else schema.outputs)]
    else:
        sig = signatures.get(key_of(domain, op))
        if sig is None:
            return None
        ports = [p[0] for p in sig["inputs" if direction == "in" else "outputs"]]
    return [ports.index(n) for n in names if n in ports]


def main() -> None:
    csv_path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "reference/onnx_op_categories.csv"
    rows = list(csv.DictReader(csv_path.open()))
    signatures = json.loads((ROOT / "autocast_onnx/data/ort_signatures.json").read_text())
    by_cat = {c: [] for c in CATEGORY_OF.values()}
    pins = []
    for row in rows:
        domain, op = row["domain"], row["onnx_op"]
        category, reason = CATEGORY_OF[row["suggested_category"]], row["reason"]
        if (domain, op) in OVERRIDES:
            category, reason = OVERRIDES[(domain, op)]
        elif category != "keep_fp32" and category != "non_float" and row["ort_cuda_fp16_kernel"] == "no":
            category = "keep_fp32"
            reason = (
                f"departs from the suggested '{CATEGORY_OF[row['suggested_category']]}': ONNX Runtime's CUDA "
                f"provider has no float16 kernel ({row['ort_cuda_note']}), so low precision would only add "
                f"casts around an fp32 or CPU fallback; was: {row['reason']}"
            )
        by_cat[category].append((key_of(domain, op), reason))
        fixed = [p for p in row["fixed_fp32_ports"].split(";") if p]
        ins = [p[3:] for p in fixed if p.startswith("in:")]
        outs = [p[4:] for p in fixed if p.startswith("out:")]
        names = ", ".join([f"input {n}" for n in ins] + [f"output {n}" for n in outs])
        why = f"{names}: the schema admits float but not float16 here, or the value needs fp32 precision"
        if (domain, op) in PINS:
            ins, outs, why = PINS[(domain, op)]
        in_idx = port_indices(domain, op, ins, "in", signatures) if ins else []
        out_idx = port_indices(domain, op, outs, "out", signatures) if outs else []
        if in_idx or out_idx:
            pins.append((key_of(domain, op), in_idx, out_idx, why))
    lines = [HEADER]
    for category, entries in by_cat.items():
        lines.append(f"\n[ops.{category}]")
        for key, reason in sorted(entries, key=lambda e: e[0].lower()):
            lines.append(f"{toml_str(key) if ':' in key or '.' in key else key} = {toml_str(reason)}")
    lines.append("\n# Ports that stay fp32 whatever the node's precision (indices into the node's inputs/outputs).")
    lines.append("[pins]")
    for key, ins, outs, why in sorted(pins):
        fields = []
        if ins:
            fields.append(f"inputs = {ins}")
        if outs:
            fields.append(f"outputs = {outs}")
        fields.append(f"why = {toml_str(why)}")
        lines.append(f"{toml_str(key) if ':' in key else key} = {{ {', '.join(fields)} }}")
    (ROOT / "rules/default.toml").write_text("\n".join(lines) + "\n")
    print("wrote rules/default.toml: " + ", ".join(f"{c} {len(e)}" for c, e in by_cat.items()) + f", pins {len(pins)}")


if __name__ == "__main__":
    main()
