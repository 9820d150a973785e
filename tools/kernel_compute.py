"""Write autocast_onnx/data/compute_<runtime>.json: how each runtime's kernels compute at fp16 and bf16.

For each op and low-precision type, the table says whether the kernel, given low-precision inputs and writing
low-precision outputs, converts its inputs to float, computes in float and rounds each output once
("compute": "float", "rounds": "once": it computes exactly what an fp32 node between two Casts computes from the
same low-precision inputs), or keeps some intermediate in the low type ("rounds": "per-step"), or does its
arithmetic in the low type itself ("compute": "native"). Each row says exactly what its kernel does, in "note".

How a kernel computes cannot be read off a registration the way tools/kernel_tables.py reads which kernels exist:
it is in the arithmetic of the kernel's C++ and CUDA source. So the rows below are transcribed by hand from that
source, and the script holds every row to it: each row cites the files and line ranges it rests on with a short
quotation (or the words) of the code there, and `--git-dir` checks, at the recorded commit, that every cited
file exists, that the lines exist, and that the quoted text is at those lines (spaces collapsed). A row whose
source moved or changed fails the run, so the table cannot drift silently. The table also records the git
blob id of each cited file.

Rows follow one rule for what they state first: the kernel's behaviour on its general path, with the op's
default attributes and every optional input present, under the default session and provider options. Where
other attribute values, an absent optional input, particular sizes or options take another path, the row lists
that path under "conditions", with its own compute, rounds and source.

Runtimes:
  * ONNX Runtime's CUDA provider (compute_cuda.json): the commit of data/kernels_cuda.json (tools/kernel_tables.py),
    so the two tables describe the same kernels; every (op, type) of a row must be registered there.
  * ONNX Runtime's DirectML provider (compute_dml.json): the provider hands the arithmetic to DirectML.dll, whose
    source is not public. What the provider's source does say is recorded once (it lets DirectML compute in half
    precision for an operator with an fp16 tensor and no fp32 one); per op the table says that nothing is known.
  * TensorRT (compute_tensorrt.json), read from the onnx-tensorrt parser of data/kernels_tensorrt.json: the parser
    asks TensorRT for a compute precision on one layer of the table's ops (LayerNormalization, from its
    stash_type); the arithmetic is TensorRT's own. Per op the table says what the parser asks, or that nothing is
    known.

Run by hand (ONNX Runtime's tree: the fork gedoensmax/onnxruntime holds commit 577eac9 of microsoft/onnxruntime
and commit 7e59947 of the DirectML table; fetch both trees with the stored-snapshot tool or `git clone`):
    python tools/kernel_compute.py --git-dir /work/.mirror/gedoensmax+onnxruntime/repo \
        --trt-git-dir /work/.mirror/onnx+onnx-tensorrt/repo
(`--out DIR` writes the tables into DIR instead of autocast_onnx/data/.) Without the trees (CI, tests):
    python tools/kernel_compute.py --check
checks that the shipped tables are what the rows below write (with the commits, dates and blob ids they record),
that their structure holds, and that every op and type they list has a kernel in the matching kernel table.
tests/catalog/test_kernel_compute.py runs the check, and with the ONNX Runtime tree present regenerates the tables.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "autocast_onnx" / "data"
TYPES = ("bfloat16", "float16")
COMPUTE = ("float", "native")
ROUNDS = ("once", "per-step")
ORT_REPO = "microsoft/onnxruntime"
TRT_REPO = "onnx/onnx-tensorrt"
CU = "onnxruntime/core/providers/cuda/"
CO = "onnxruntime/contrib_ops/cuda/"
DML = "onnxruntime/core/providers/dml/DmlExecutionProvider/src/"

LEGEND = {
    "compute": {
        "float": "the kernel's arithmetic is in float (fp32), from the low-precision inputs converted exactly",
        "native": "some of the kernel's arithmetic is in the low type itself (half or bfloat16 operations)",
        "null": "nothing known from the sources (the arithmetic is in a library whose source is not at hand)",
    },
    "rounds": {
        "once": "each output is rounded to the low type once, from its float (or correctly rounded) value",
        "per-step": "intermediates are rounded to the low type inside the kernel, or its constants are",
        "unknown": "the sources set the compute precision but not where results are rounded",
    },
    "float/once": "with low-precision inputs and outputs the kernel computes exactly what an fp32 node between "
    "two Casts computes from the same inputs (up to the order of float sums and the float math library)",
    "rows": "the general path with default attributes, every optional input present and default options; "
    "'conditions' lists other paths (other attribute values, absent inputs, sizes, options)",
}


@dataclass(frozen=True)
class Cite:
    """Lines `first`..`last` of `path` hold `quote` (spaces collapsed)."""

    path: str
    first: int
    last: int
    quote: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.first}-{self.last}" if self.last != self.first else f"{self.path}:{self.first}"


@dataclass(frozen=True)
class Cond:
    when: str
    compute: str
    rounds: str
    note: str
    cites: tuple[Cite, ...]


@dataclass(frozen=True)
class Row:
    domain: str
    op: str
    types: tuple[str, ...]
    compute: str | None
    rounds: str | None
    note: str
    cites: tuple[Cite, ...]
    conditions: tuple[Cond, ...] = ()


def c(path: str, first: int, last: int, quote: str) -> Cite:
    return Cite(path, first, last, quote)


# --- ONNX Runtime CUDA: shared evidence -----------------------------------------------------------------------
ACC_HALF = c(CU + "shared_inc/accumulation_type.h", 15, 18, "struct AccumulationType<half> { using type = float;")
ACC_BF16 = c(CU + "shared_inc/accumulation_type.h", 27, 30, "struct AccumulationType<BFloat16> { using type = float;")
BF16_OPS = c(CU + "cu_inc/common.cuh", 109, 111, "BFloat16 operator+(const BFloat16& a, const BFloat16& b) {")
BF16_MUL = c(CU + "cu_inc/common.cuh", 117, 119, "return static_cast<float>(a) * static_cast<float>(b);")
HALF_OPS = c(CU + "cu_inc/common.cuh", 19, 22, "float16 arithmetic is supported after sm5.3 with intrinsics")
UNARY = CU + "math/unary_elementwise_ops_impl.h"
ACT = CU + "activation/activations_impl.cu"
COMMON = CU + "cu_inc/common.cuh"
BIN = CU + "math/binary_elementwise_ops_impl.h"
SM = CU + "math/softmax.cc"
WARP = CU + "math/softmax_warpwise_impl.cuh"
BLOCK = CU + "math/softmax_blockwise_impl.cuh"
LN = CU + "nn/layer_norm_impl.cu"
SLN = CO + "bert/skip_layer_norm.cc"
SLN_IMPL = CO + "bert/skip_layer_norm_impl.cu"
LN_CUH = CO + "bert/layer_norm.cuh"
RED = CU + "reduction/reduction_ops.cc"
RED_H = CU + "reduction/reduction_ops.h"
RED_F = CU + "reduction/reduction_functions.cu"
GEMM_H = CU + "shared_inc/fpgeneric.h"
CCOMMON = CU + "cuda_common.h"
GELU_APPROX = CU + "tensor/gelu_approximate_impl.cu"
GN = CO + "diffusion/group_norm_impl_kernel.cuh"

SOFTMAX_PATHS = (
    c(SM, 31, 39, "AccumulationType_t<CudaT_ACCUM>, is_log_softmax>"),
    c(SM, 23, 23, "typedef typename ToCudaType<T>::MappedType CudaT_ACCUM;"),
    ACC_HALF,
    ACC_BF16,
    c(WARP, 102, 113, "acc_t elements[WARP_BATCH][WARP_ITERATIONS];"),
)
SOFTMAX_LEAN = c(SM, 29, 31, "use_softmax_warp_forward_resource_efficient = 1024 < D && D <= 2048")
SOFTMAX_LEAN_ROW = c(WARP, 179, 180, "input_t(&elements)[WARP_ITERATIONS][WARP_SIZE]")
LEAN_NOTE = (
    "softmax_warp_forward_resource_efficient keeps the row in T (shared memory): x - max is a T subtraction "
    "(rounded) before the float exp"
)

MATMUL_CUBLAS = (
    c(GEMM_H, 84, 86, "half_options->GetMathMode()"),
    c(GEMM_H, 98, 112, "The alpha and beta shall have same precision as compute type."),
    c(CCOMMON, 153, 159, "return pedantic_ ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;"),
    c(CCOMMON, 188, 190, "bool compute_16f_{false};"),
    c(GEMM_H, 167, 170, "CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);"),
)
CUBLAS_CONDS = (
    Cond(
        "ORT_CUDA_GEMM_OPTIONS has bit 0 set (fp16 only)",
        "native",
        "per-step",
        "compute type CUBLAS_COMPUTE_16F: the products are accumulated in half",
        (c(CCOMMON, 174, 175, "compute_16f_ = (value & 0x01) > 0;"),),
    ),
    Cond(
        "cuBLAS picks a split-K algorithm",
        "float",
        "per-step",
        "the math mode is CUBLAS_DEFAULT_MATH unless ORT_CUDA_GEMM_OPTIONS has bit 1 set, which sets "
        "CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION: under the default, cuBLAS may reduce split-K partial "
        "sums in the output type",
        (c(CCOMMON, 146, 151, "CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION : CUBLAS_DEFAULT_MATH"),),
    ),
)

HALF_NATIVE = (
    "half operations (cuda_fp16.h's operators: each operation rounds once; for +, - and * that is the same as the "
    "float operation rounded to half, since float has more than 2x11+2 bits)"
)


def _unary(op: str, types: tuple[str, ...], fn: str, cites: tuple[Cite, ...]) -> Row:
    return Row(
        "",
        op,
        types,
        "float",
        "once",
        f"{fn} of the input converted to float, converted to T once",
        cites,
    )


def _softmax_rows() -> list[Row]:
    blockwise = c(BLOCK, 316, 322, "return static_cast<OutT>(std::exp((AccumT)input - max_input) / sum);")
    log_block = c(BLOCK, 303, 309, "return static_cast<OutT>((AccumT)input - max_input - logsum);")
    return [
        Row(
            "",
            "Softmax",
            TYPES,
            "float",
            "once",
            "each row is read from T into float (AccumulationType<half> and <BFloat16> are float), max and the sum of "
            "exp(x - max) are float reductions, and each output exp(x - max) / sum is computed in float and converted "
            "to T once (warp kernel for rows of at most 1024, block kernel above; opset 1-12 and 13+ share the helper)",
            (
                *SOFTMAX_PATHS,
                c(WARP, 136, 136, "elements[i][it] = std::exp((float)(elements[i][it] - max_value[i]));"),
                c(WARP, 156, 156, "dst[i * element_count + it * WARP_SIZE] = elements[i][it] / sum[i];"),
                blockwise,
            ),
            (
                Cond(
                    "1024 < D <= 2048 and N >= 8192 (D: the softmax axis's size, N: the number of rows)",
                    "float",
                    "per-step",
                    LEAN_NOTE + ", exp(x - max) is stored back in T (rounded), and the output is that value times the "
                    "float reciprocal of the sum, rounded again",
                    (SOFTMAX_LEAN, SOFTMAX_LEAN_ROW, c(WARP, 210, 211, "elements[it][local_idx] = tmp;")),
                ),
            ),
        ),
        Row(
            "",
            "LogSoftmax",
            ("float16",),
            "float",
            "once",
            "as Softmax: float max and sum of exp; each output x - max - log(sum) is computed in float and converted "
            "to T once",
            (
                *SOFTMAX_PATHS[:3],
                SOFTMAX_PATHS[4],
                c(WARP, 148, 148, "if (is_log_softmax) sum[i] = max_value[i] + std::log((float)(sum[i]));"),
                c(WARP, 154, 154, "dst[i * element_count + it * WARP_SIZE] = elements[i][it] - sum[i];"),
                log_block,
            ),
            (
                Cond(
                    "1024 < D <= 2048 and N >= 8192 (D: the softmax axis's size, N: the number of rows)",
                    "float",
                    "per-step",
                    LEAN_NOTE + " that feeds the sum; the output (float)x - (max + log(sum)) still rounds once",
                    (
                        SOFTMAX_LEAN,
                        SOFTMAX_LEAN_ROW,
                        c(WARP, 207, 208, "sum += std::exp((float)(elements[it][local_idx] - max_value));"),
                    ),
                ),
            ),
        ),
        Row(
            "com.microsoft",
            "BiasSoftmax",
            ("float16",),
            "float",
            "once",
            "input + bias is added in float (acc_t) and the softmax is Softmax's warp kernel: float max and sum, each "
            "output converted to T once",
            (
                c(
                    CO + "math/bias_softmax_impl.cu",
                    77,
                    79,
                    "(acc_t)input[i * element_count + it * WARP_SIZE] + (acc_t)input_bias",
                ),
                c(
                    CO + "math/bias_softmax_impl.cu",
                    118,
                    118,
                    "output[i * element_count + it * WARP_SIZE] = elements[i][it] / sum[i];",
                ),
            ),
            (
                Cond(
                    "the softmax axis has more than 1024 elements",
                    "native",
                    "per-step",
                    "an Add kernel in T (input + bias rounded to T), then cuDNN's softmax of the rounded sum",
                    (
                        c(
                            CO + "math/bias_softmax_impl.cu",
                            185,
                            186,
                            "For large element count we fall back to explicit Add kernel",
                        ),
                    ),
                ),
            ),
        ),
    ]


LN_CC = CU + "nn/layer_norm.cc"
LN_CONTRIB = CO + "layer_norm.cc"
LN_FLOAT = (
    c(LN, 109, 109, "U curr = static_cast<U>(lvals[l + k]);"),
    c(LN, 221, 221, "float2 curr = __half22float2(*((__half2*)(lvals + l + k)));"),
    c(LN, 356, 356, "U c_inv_std_dev = rsqrt(sigma2 + epsilon);"),
    c(LN, 375, 376, "U gamma_i = (gamma != nullptr) ? (U)gamma[index] : (U)1;"),
)
SLN_NOTE = (
    "without the provider option enable_skip_layer_norm_strict_mode (off by default) the kernel works in T: "
    "input + bias + skip is summed in T (the optional sum output is that T value), {stats} in T (block reductions "
    "of half2 / bfloat162 additions), 1/sqrt in T (hrsqrt), epsilon is converted to T, and the output {expr} is "
    "computed in T: every step rounds. (rules/default.toml "
    "cites onnxruntime PR #28682 for float statistics in later versions; this row is the source at the table's "
    "commit)"
)
SLN_CITES = (
    c(SLN, 92, 93, "if (strict_) { HostApplyLayerNorm<CudaT, float, CudaT, Simplified>("),
    c(SLN_IMPL, 103, 113, "const T rldval = reverse_ld * val;"),
    c(SLN_IMPL, 204, 206, "maybe2half<T>(epsilon)"),
    c(LN_CUH, 79, 85, "const half2 res = AddHalf2(a2, b2);"),
    c(LN_CUH, 47, 51, "return hrsqrt(x);"),
)


def _sln_strict(expr: str) -> Cond:
    return Cond(
        "the provider option enable_skip_layer_norm_strict_mode is set",
        "float",
        "once",
        f"LayerNormalization's kernel (HostApplyLayerNorm with U = float): the sum, the statistics and {expr} in "
        "float, each output (and the sum output) converted to T once",
        (
            c(SLN, 92, 93, "HostApplyLayerNorm<CudaT, float, CudaT, Simplified>("),
            c(LN, 364, 372, "curr += static_cast<U>(skip_vals[i]);"),
        ),
    )


def _norm_rows() -> list[Row]:
    return [
        Row(
            "",
            "LayerNormalization",
            TYPES,
            "float",
            "once",
            "mean and variance (Welford) in U = float from the inputs converted to float, rsqrtf, then "
            "gamma * inv_std * (x - mean) + beta in float with gamma and beta converted to float, each output "
            "converted "
            "to T once. stash_type is not read (the statistics are float whatever it says); Mean and InvStdDev are "
            "float. Opset 1-16 (registered by the contrib file) and 17 share the kernel",
            (
                c(LN_CC, 13, 23, "REGISTER_KERNEL_TYPED(MLFloat16, float) REGISTER_KERNEL_TYPED(BFloat16, float)"),
                c(LN_CC, 26, 31, 'ORT_ENFORCE(op_kernel_info.GetAttr("axis", &axis_).IsOK());'),
                c(LN_CONTRIB, 13, 20, "ONNX_OPERATOR_VERSIONED_TYPED_KERNEL_EX(LayerNormalization, kOnnxDomain, 1, 16"),
                *LN_FLOAT,
                c(LN, 381, 381, "ovals[i] = static_cast<V>(gamma_i * c_inv_std_dev * (curr - mu) + beta_i);"),
            ),
        ),
        Row(
            "",
            "SimplifiedLayerNormalization",
            TYPES,
            "float",
            "once",
            "LayerNormalization's kernel without the mean: the sum of squares in float, rsqrtf, gamma * inv_std * x in "
            "float, each output converted to T once",
            (
                c(LN_CONTRIB, 21, 26, "SimplifiedLayerNormalization, kOnnxDomain, 1"),
                c(LN, 42, 43, "sigma2 = sigma2 + curr * curr;"),
                *LN_FLOAT,
                c(LN, 379, 379, "ovals[i] = static_cast<V>(gamma_i * c_inv_std_dev * curr);"),
            ),
        ),
        Row(
            "com.microsoft",
            "SkipLayerNormalization",
            ("float16",),
            "native",
            "per-step",
            SLN_NOTE.format(
                stats="the mean and the mean of squares are accumulated, the variance is E[x^2] - mean^2",
                expr="gamma * (x - mean) * rsigma + beta",
            ),
            (*SLN_CITES, c(LN_CUH, 115, 127, "output[idx] = g * (val - mu) * rsigma + b;")),
            (_sln_strict("gamma * (x - mean) * inv_std + beta"),),
        ),
        Row(
            "com.microsoft",
            "SkipSimplifiedLayerNormalization",
            TYPES,
            "native",
            "per-step",
            SLN_NOTE.format(stats="the mean of squares is accumulated", expr="gamma * x * rsigma"),
            (
                *SLN_CITES,
                c(LN_CUH, 92, 98, "const nv_bfloat162 res = AddHalf2(a2, b2);"),
                c(LN_CUH, 141, 150, "output[idx] = g * val * rsigma;"),
            ),
            (_sln_strict("gamma * x * inv_std"),),
        ),
        Row(
            "",
            "BatchNormalization",
            ("float16",),
            "float",
            "once",
            "cuDNN's inference kernel with T data and scale, B, mean and var converted to float (cuDNN's own "
            "arithmetic "
            "is not in these sources; ONNX Runtime gives it the float parameters cuDNN takes for half data), each "
            "output written to T once",
            (
                c(
                    CU + "nn/batch_norm.cc",
                    93,
                    125,
                    "For half data type, the alpha, beta, scale, B, mean, var need to be float type",
                ),
            ),
        ),
        Row(
            "",
            "InstanceNormalization",
            ("float16",),
            "native",
            "per-step",
            "with N > 1, cuDNN computes each instance's mean and variance in float; the normalisation then runs in T: "
            "the mean, the variance, the correction (HW - 1)/HW and epsilon are each converted to T, and x - mean, "
            "variance * correction + epsilon, the square root (float sqrt rounded to T), scale * (...), the division "
            "and "
            "+ B each round in T",
            (
                c(
                    CU + "nn/instance_norm.cc",
                    240,
                    243,
                    "stats_desc needs to be of 'float' type even for float16 input",
                ),
                c(CU + "nn/instance_norm.cc", 291, 291, "InstanceNormImpl<CudaT, float>("),
                c(
                    CU + "nn/instance_norm_impl.cu",
                    29,
                    29,
                    "output_data[id] = scale[c] * (input_data[id] - (T1)mean[nc]) / _Sqrt(",
                ),
            ),
            (
                Cond(
                    "N == 1 (one instance)",
                    "float",
                    "once",
                    "cuDNN's spatial batch normalisation in training mode with scale and B converted to float computes "
                    "the statistics and the output (cuDNN's own arithmetic, with the float parameters it takes for "
                    "half data); each output written to T once",
                    (
                        c(
                            CU + "nn/instance_norm.cc",
                            188,
                            221,
                            "For half input data type, alpha, beta, scale, bias need to be float type.",
                        ),
                    ),
                ),
            ),
        ),
        Row(
            "com.microsoft",
            "GroupNorm",
            ("float16",),
            "float",
            "once",
            "sums and sums of squares in float from the inputs converted to float, gamma and beta float (the kernel "
            "refuses others), (x - mean) * inv_std * gamma + beta (and the optional SiLU) in float, each output "
            "converted to T once",
            (
                c(CO + "diffusion/group_norm.cc", 123, 125, "GroupNorm only supports gamma and beta in float type"),
                c(GN, 58, 68, "const float val = static_cast<float>(input_v.val[i]);"),
                c(GN, 324, 346, "*reinterpret_cast<__half2*>(&dst[offset]) = __float22half2_rn(f2);"),
            ),
        ),
        Row(
            "com.microsoft",
            "SkipGroupNorm",
            ("float16",),
            "native",
            "per-step",
            "input + bias + skip is added in T (two half additions, stored as the sum output); the statistics and the "
            "normalisation of that rounded sum are GroupNorm's, in float, each output converted to T once",
            (
                c(GN, 117, 131, "h2 = h2 + b; h2 = h2 + s;"),
                c(GN, 444, 444, "const T* input = (skip != nullptr) ? skip_workspace : src;"),
            ),
        ),
    ]


RED_FNS = CU + "reduction/reduction_functions.cc"
RED_FLOAT_DESC = c(
    RED, 430, 435, "reduce_desc.Set(cudnn_reduce_op, CudnnTensor::GetDataType<float>(), ReduceTensorIndices)"
)
RED_BF16 = c(RED, 420, 426, "Reducesum with BFP16 is not supported by cudnn, so convert input to fp32 then call cudnn")
RED_FAST = (
    c(RED, 689, 689, "const bool fast_reduction = fast_reduction_ && !ctx->GetUseDeterministicCompute();"),
    c(RED_FNS, 95, 97, "cudnn_reduce_op != CUDNN_REDUCE_TENSOR_ADD && cudnn_reduce_op != CUDNN_REDUCE_TENSOR_AVG"),
    c(RED_FNS, 143, 149, "if (!axes_from_beginning && !axes_to_end) {"),
    c(RED_F, 486, 489, "using TBuf = AccumulationType_t<TIn>;"),
    c(RED_F, 287, 291, "using TBuf = AccumulationType_t<TIn>;"),
)
FAST_WHEN = "the reduced axes are one block at the start or at the end of the shape (after dropping 1s) and "
FAST_WHEN += "deterministic compute is off: the fast matrix reduction"
CUDNN_NOTE = (
    "cuDNN's reduction with the float compute type ONNX Runtime sets for half data (bfloat16 data is converted "
)
CUDNN_NOTE += "to float first and the float result converted back); cuDNN's own arithmetic is not in these sources"


def _reduce(op: str, types: tuple[str, ...], what: str, op_line: int, op_text: str) -> Row:
    return Row(
        "",
        op,
        types,
        "float",
        "once",
        f"{what}: {CUDNN_NOTE}; each output written to T once",
        (c(RED_H, op_line, op_line, op_text), RED_FLOAT_DESC),
    )


def _reduction_rows() -> list[Row]:
    return [
        Row(
            "",
            "ReduceSum",
            TYPES,
            "float",
            "once",
            "the fast matrix reduction (axes in one block at the start or the end, deterministic compute off) sums in "
            "AccumulationType = float and writes T once; otherwise " + CUDNN_NOTE + "; each output written to T once",
            (c(RED_H, 190, 190, "fast_reduction_ = true;"), *RED_FAST, RED_FLOAT_DESC, RED_BF16),
        ),
        Row(
            "",
            "ReduceMean",
            ("float16",),
            "float",
            "per-step",
            "on the fast matrix reduction (axes in one block at the start or the end, deterministic compute off: a "
            "mean over the last axis takes it) the sum is accumulated in float and written to T (rounded), then "
            "divided "
            "in T by the count converted to T (rounded again; a count above 2048 is itself rounded)",
            (
                c(RED_H, 158, 158, "fast_reduction_ = true;"),
                *RED_FAST,
                c(RED, 400, 406, "CudaT denominator = ToCudaType<T>::FromFloat(denominator_float);"),
                c(RED_F, 462, 466, "return a / v_;"),
            ),
            (
                Cond(
                    "the fast matrix reduction does not apply (other axes, or deterministic compute)",
                    "float",
                    "once",
                    "cuDNN's AVG reduction with the float compute type; each output written to T once",
                    (RED_FLOAT_DESC,),
                ),
            ),
        ),
        Row(
            "",
            "ReduceSumSquare",
            ("float16",),
            "native",
            "per-step",
            "x * x is computed in T first (Impl_Mul: each square rounded to T, inf above 255.9), then summed in float "
            "(fast reduction or cuDNN) and written to T once",
            (
                c(RED_H, 215, 216, "ReduceKernel<true>::calculate_sqt_ = true;"),
                c(
                    RED,
                    369,
                    377,
                    "Impl_Mul<CudaT>(stream, static_cast<int32_t>(SimpleBroadcast::NoBroadcast), nullptr,",
                ),
                c(RED, 457, 466, "Impl_Mul<CudaT>(stream,"),
            ),
        ),
        Row(
            "",
            "ReduceLogSum",
            ("float16",),
            "float",
            "per-step",
            "the sum is accumulated in float and written to T (rounded), then Log runs on that T value (float log "
            "rounded to T again)",
            (
                c(RED_H, 202, 203, "ReduceKernel<true>::calculate_log_ = true;"),
                c(RED, 397, 399, "Impl_Log<CudaT>(stream, reinterpret_cast<const CudaT*>(output.Data<T>()),"),
                c(RED, 612, 616, "Impl_Log<CudaT>(stream,"),
            ),
        ),
        Row(
            "",
            "ReduceLogSumExp",
            ("float16",),
            "native",
            "per-step",
            "a chain of T kernels: max (exact), x - max in T, exp in T (float exp rounded), sum in float written to T, "
            "log in T, + max in T: each step rounds",
            (
                c(RED_H, 228, 228, "ReduceKernel<true>::log_sum_exp_ = true;"),
                c(RED, 502, 502, "Impl_Sub<CudaT>(stream,"),
                c(RED, 512, 512, "Impl_Exp<CudaT>(stream,"),
                c(RED, 531, 531, "Impl_Log<CudaT>(stream, reinterpret_cast<CudaT*>(log_sum_result),"),
                c(
                    RED,
                    537,
                    537,
                    "Impl_Add<CudaT>(stream, static_cast<int32_t>(SimpleBroadcast::NoBroadcast), nullptr,",
                ),
            ),
        ),
        _reduce("ReduceL1", ("float16",), "sum of |x|", 130, "return ComputeImpl<T>(ctx, CUDNN_REDUCE_TENSOR_NORM1);"),
        _reduce("ReduceL2", ("float16",), "sqrt of the sum of squares", 140, "CUDNN_REDUCE_TENSOR_NORM2"),
        _reduce("ReduceProd", ("float16",), "product", 182, "return ComputeImpl<T>(ctx, CUDNN_REDUCE_TENSOR_MUL);"),
        _reduce("ReduceMax", ("float16",), "maximum (exact in any type)", 150, "CUDNN_REDUCE_TENSOR_MAX"),
        _reduce("ReduceMin", ("float16",), "minimum (exact in any type)", 172, "CUDNN_REDUCE_TENSOR_MIN"),
    ]


CONV_NOTE = (
    "cuDNN with the float compute type ONNX Runtime sets for half data (cuDNN's own arithmetic is not in these "
    "sources): the convolution's result is written to Y in T (rounded), then the bias B is added by cudnnAddTensor "
    "into Y (rounded again)"
)


def _conv(op: str, path: str, first: int, add_line: int, fuse_line: int) -> Row:
    return Row(
        "",
        op,
        ("float16",),
        "float",
        "per-step",
        CONV_NOTE,
        (
            c(path, first, first + 2, "set_compute_data_type(cudnn_frontend::DataType_t::FLOAT);"),
            c(path, add_line - 1, add_line, "cudnnAddTensor(cudnn_handle, &alpha, s_.b_tensor, s_.b_data,"),
        ),
        (
            Cond(
                "no bias input B",
                "float",
                "once",
                "the convolution alone: float compute, each output written to T once",
                (c(path, first, first + 2, "set_compute_data_type(cudnn_frontend::DataType_t::FLOAT);"),),
            ),
            Cond(
                "the provider option fuse_conv_bias is set",
                "float",
                "per-step",
                "convolution and bias add in one cuDNN graph whose intermediate data type is T",
                (
                    c(
                        path,
                        fuse_line,
                        fuse_line,
                        "const auto fuse_bias = cuda_ep->IsFuseConvBias() || is_fused_node_;",
                    ),
                    c(path, first - 1, first - 1, "set_io_data_type(data_type).set_intermediate_data_type(data_type);"),
                ),
            ),
        ),
    )


def _gemm_rows() -> list[Row]:
    matmul = CU + "math/matmul.cc"
    gemm = CU + "math/gemm.cc"
    fused = CO + "math/fused_matmul.cc"
    alpha_cond = Cond(
        "alpha is not a value T holds exactly",
        "float",
        "per-step",
        "alpha is converted to T before the call (then to float for cuBLAS): the product is scaled by the rounded "
        "alpha",
        (c(matmul, 309, 309, "const CudaT alpha = ToCudaType<T>::FromFloat(alpha_);"),),
    )
    return [
        Row(
            "",
            "MatMul",
            TYPES,
            "float",
            "once",
            "cuBLAS GEMM on T operands with compute type CUBLAS_COMPUTE_32F (the default of ORT_CUDA_GEMM_OPTIONS): "
            "products accumulated in float, each output written to T once; alpha is 1",
            (c(matmul, 309, 331, "const CudaT alpha = ToCudaType<T>::FromFloat(alpha_);"), *MATMUL_CUBLAS),
            CUBLAS_CONDS,
        ),
        Row(
            "com.microsoft",
            "FusedMatMul",
            TYPES,
            "float",
            "once",
            "MatMul's kernel (cuBLAS, CUBLAS_COMPUTE_32F) with the node's alpha",
            (c(fused, 27, 30, "REGISTER_KERNEL_TYPED(FusedMatMul, MLFloat16)"), *MATMUL_CUBLAS),
            (alpha_cond, *CUBLAS_CONDS),
        ),
        Row(
            "com.microsoft",
            "TransposeMatMul",
            TYPES,
            "float",
            "once",
            "MatMul's kernel (cuBLAS, CUBLAS_COMPUTE_32F) with the node's alpha",
            (c(fused, 21, 25, "REGISTER_KERNEL_TYPED(TransposeMatMul, MLFloat16)"), *MATMUL_CUBLAS),
            (alpha_cond, *CUBLAS_CONDS),
        ),
        Row(
            "",
            "Gemm",
            TYPES,
            "float",
            "once",
            "C is first broadcast into Y in T (a copy, or 1 * C * ones, which is exact), then one cuBLAS GEMM with "
            "compute type CUBLAS_COMPUTE_32F computes alpha * A * B + beta * Y in float and writes T once",
            (
                c(gemm, 96, 137, "broadcast bias if needed and is present"),
                c(
                    gemm,
                    150,
                    166,
                    "Gemm, note that CUDA assumes col-major, so Y(N,M) = alpha * op(W) x op(X) + beta * Y",
                ),
                *MATMUL_CUBLAS,
            ),
            (
                Cond(
                    "alpha or beta is not a value T holds exactly",
                    "float",
                    "per-step",
                    "alpha and beta are converted to T before the call: the kernel scales by the rounded values",
                    (c(gemm, 150, 151, "CudaT alpha = ToCudaType<T>::FromFloat(alpha_);"),),
                ),
                *CUBLAS_CONDS,
            ),
        ),
        _conv("Conv", CU + "nn/conv.cc", 123, 492, 435),
        _conv("ConvTranspose", CU + "nn/conv_transpose.cc", 116, 485, 428),
    ]


def _exact(op: str, types: tuple[str, ...], what: str, cites: tuple[Cite, ...]) -> Row:
    return Row(
        "", op, types, "native", "once", f"{what}: the result is one of the T inputs (or its negation), exact", cites
    )


def _unary_rows() -> list[Row]:
    return [
        _unary(
            "Exp",
            TYPES,
            "expf",
            (
                c(UNARY, 28, 28, "UNARY_OP_NAME_EXPR(Exp, _Exp(a))"),
                c(COMMON, 298, 298, "half _Exp(half a) { return half(expf((float)a)); }"),
                c(COMMON, 463, 463, "BFloat16 _Exp(BFloat16 a) { return expf(static_cast<float>(a)); }"),
            ),
        ),
        _unary(
            "Log",
            ("float16",),
            "logf",
            (
                c(UNARY, 29, 29, "UNARY_OP_NAME_EXPR(Log, _Log(a))"),
                c(COMMON, 310, 310, "half _Log(half a) { return half(logf((float)a)); }"),
            ),
        ),
        _unary(
            "Sqrt",
            TYPES,
            "sqrtf",
            (
                c(UNARY, 27, 27, "UNARY_OP_NAME_EXPR(Sqrt, _Sqrt(a))"),
                c(COMMON, 217, 217, "half _Sqrt(half a) { return half(sqrtf((float)a)); }"),
                c(COMMON, 460, 460, "BFloat16 _Sqrt(BFloat16 a) { return sqrtf(static_cast<float>(a)); }"),
            ),
        ),
        _unary(
            "Erf",
            TYPES,
            "erff",
            (
                c(UNARY, 30, 30, "UNARY_OP_NAME_EXPR(Erf, _Erf(a))"),
                c(COMMON, 229, 229, "half _Erf(half a) { return half(erff((float)a)); }"),
                c(COMMON, 232, 232, "BFloat16 _Erf(BFloat16 a) { return BFloat16(erff((float)a)); }"),
            ),
        ),
        _unary(
            "Tanh",
            TYPES,
            "tanhf",
            (
                c(ACT, 82, 87, "return _Tanh(a);"),
                c(COMMON, 322, 322, "half _Tanh(half a) { return half(tanhf((float)a)); }"),
                c(COMMON, 469, 469, "BFloat16 _Tanh(BFloat16 a) { return tanhf(static_cast<float>(a)); }"),
            ),
        ),
        _unary(
            "Sin",
            ("float16",),
            "sinf",
            (c(UNARY, 33, 33, "UNARY_OP_NAME_EXPR(Sin, _Sin(a))"), c(COMMON, 280, 283, "return half(sinf((float)a));")),
        ),
        _unary(
            "Cos",
            ("float16",),
            "cosf",
            (c(UNARY, 34, 34, "UNARY_OP_NAME_EXPR(Cos, _Cos(a))"), c(COMMON, 262, 265, "return half(cosf((float)a));")),
        ),
        _unary(
            "Floor",
            ("float16",),
            "floorf (exact)",
            (
                c(UNARY, 25, 25, "UNARY_OP_NAME_EXPR(Floor, _Floor(a))"),
                c(COMMON, 205, 205, "half _Floor(half a) { return half(floorf((float)a)); }"),
            ),
        ),
        _unary(
            "Ceil",
            ("float16",),
            "ceilf (exact)",
            (
                c(UNARY, 24, 24, "UNARY_OP_NAME_EXPR(Ceil, _Ceil(a))"),
                c(COMMON, 193, 193, "half _Ceil(half a) { return half(ceilf((float)a)); }"),
            ),
        ),
        _unary(
            "Round",
            ("float16",),
            "rintf (exact)",
            (
                c(UNARY, 32, 32, "UNARY_OP_NAME_EXPR(Round, _Round(a))"),
                c(COMMON, 244, 247, "return half(rintf((float)a));"),
            ),
        ),
        Row(
            "",
            "Sigmoid",
            ("float16",),
            "float",
            "once",
            "a specialisation for half: x converted to float, 1 / (1 + exp(-x)) (or 1 - 1 / (1 + exp(x)) for x <= 0) "
            "in float, converted to half once",
            (c(ACT, 54, 63, "float res = af > 0.0f ? 1.0f / (1.0f + _Exp(-af)) : 1.0f - 1.0f / (1.0f + _Exp(af));"),),
        ),
        Row(
            "",
            "Sigmoid",
            ("bfloat16",),
            "native",
            "per-step",
            "the generic functor in BFloat16 arithmetic (each BFloat16 operation is a float operation rounded to "
            "bfloat16): exp rounded, 1 + exp rounded, 1 / (...) rounded (and 1 - that rounded for x <= 0)",
            (
                c(ACT, 47, 52, "return a > T(0) ? (T)1 / ((T)1. + _Exp(-a)) : (T)1 - (T)1 / ((T)1 + _Exp(a));"),
                BF16_OPS,
                c(COMMON, 463, 463, "BFloat16 _Exp(BFloat16 a)"),
            ),
        ),
        Row(
            "",
            "Reciprocal",
            ("float16",),
            "native",
            "once",
            "T(1) / x as one half division (cuda_fp16.h's operator/, outside these sources): one rounding",
            (c(UNARY, 26, 26, "UNARY_OP_NAME_EXPR(Reciprocal, T(1) / a)"), HALF_OPS),
        ),
        _exact(
            "Neg",
            TYPES,
            "-x",
            (
                c(UNARY, 23, 23, "UNARY_OP_NAME_EXPR(Neg, -a)"),
                c(COMMON, 125, 125, "BFloat16 operator-(const BFloat16& a) { return -static_cast<float>(a); }"),
            ),
        ),
        _exact(
            "Abs",
            TYPES,
            "x > 0 ? x : -x",
            (
                c(UNARY, 22, 22, "UNARY_OP_NAME_EXPR(Abs, _Abs(a))"),
                c(COMMON, 430, 430, "T _Abs(T a) { return a > (T)0 ? a : -a; }"),
            ),
        ),
        _exact("Relu", TYPES, "max(x, 0)", (c(ACT, 33, 38, "return _Max(a, (T)0);"),)),
        Row(
            "",
            "ThresholdedRelu",
            ("float16",),
            "native",
            "once",
            "x > alpha ? x : 0 with alpha converted to T for the comparison: the result is x or 0, exact (the default "
            "alpha 1.0 is exact in T)",
            (c(ACT, 89, 94, "return a > (T)alpha ? a : (T)0;"),),
            (
                Cond(
                    "alpha is not a value T holds exactly",
                    "native",
                    "per-step",
                    "the threshold is rounded to T: an x equal to alpha rounded up passes fp32's comparison, not "
                    "this one",
                    (c(ACT, 89, 94, "return a > (T)alpha ? a : (T)0;"),),
                ),
            ),
        ),
        _exact(
            "Clip",
            ("float16",),
            "a select between x, min and max",
            (
                c(
                    CU + "math/clip_impl.cu",
                    14,
                    14,
                    "output[id] = (input[id] < min_val) ? min_val : ((input[id] > max_val) ? max_val : input[id]);",
                ),
            ),
        ),
    ]


def _activation_rows() -> list[Row]:
    half = ("float16",)
    return [
        Row(
            "",
            "LeakyRelu",
            half,
            "native",
            "per-step",
            "x > 0 ? x : (T)alpha * x: alpha is converted to T first (the default 0.01 becomes 0.010002136), then one "
            "half product of x and the rounded alpha",
            (c(ACT, 26, 31, "return a > (T)0 ? a : (T)alpha * a;"), HALF_OPS),
            (
                Cond(
                    "alpha is a value T holds exactly (0.5, 0.25, 0.125, ...)",
                    "native",
                    "once",
                    "one half product: the same as the float product rounded to half",
                    (c(ACT, 26, 31, "return a > (T)0 ? a : (T)alpha * a;"),),
                ),
            ),
        ),
        Row(
            "",
            "Elu",
            half,
            "native",
            "per-step",
            "x > 0 ? x : (T)alpha * (exp(x) - 1): exp (float, rounded to T), - 1 and * alpha in T, each rounding",
            (c(ACT, 12, 17, "return a > (T)0 ? a : (T)alpha * (_Exp(a) - (T)1);"), HALF_OPS),
        ),
        Row(
            "",
            "Selu",
            half,
            "native",
            "per-step",
            "x > 0 ? gamma * x : gamma * alpha * (exp(x) - 1) in T, alpha and gamma converted to T, each operation "
            "rounding",
            (c(ACT, 40, 45, "return a > (T)0 ? (T)gamma * a : (T)gamma * (T)alpha * (_Exp(a) - (T)1);"), HALF_OPS),
        ),
        Row(
            "",
            "Softplus",
            half,
            "native",
            "per-step",
            "x > 0 ? x + log(exp(-x) + 1) : log(exp(x) + 1): exp and log in float rounded to T, the additions in T",
            (c(ACT, 65, 73, "return a + _Log(_Exp(-a) + (T)1);"), HALF_OPS),
        ),
        Row(
            "",
            "Softsign",
            half,
            "native",
            "per-step",
            "x / (1 + |x|): 1 + |x| rounded in T, then a half division",
            (c(ACT, 75, 80, "return a / ((T)1. + _Abs(a));"), HALF_OPS),
        ),
        Row(
            "",
            "HardSigmoid",
            half,
            "native",
            "per-step",
            "max(min(alpha * x + beta, 1), 0) in T: alpha and beta converted to T, the product and the sum each "
            "rounding",
            (c(ACT, 19, 24, "return _Max(_Min((T)alpha * a + (T)beta, (T)1), (T)0);"), HALF_OPS),
        ),
    ]


def _binary(op: str, line: int, expr: str, half_note: str) -> list[Row]:
    cite = c(BIN, line, line, f"BINARY_OP_NAME_EXPR({op}, {expr})")
    return [
        Row("", op, ("float16",), "native", "once", half_note, (cite, HALF_OPS)),
        Row(
            "",
            op,
            ("bfloat16",),
            "float",
            "once",
            "ONNX Runtime's BFloat16 operator: both inputs converted to float, one float operation, converted to "
            "bfloat16 once",
            (cite, BF16_OPS, BF16_MUL),
        ),
    ]


def _binary_rows() -> list[Row]:
    one = "one half operation per element: " + HALF_NATIVE
    div = (
        "one half division per element (cuda_fp16.h's operator/, outside these sources: it may compute through an "
        "approximate float reciprocal, so a quotient can differ from the float quotient rounded to half in the last "
        "bit)"
    )
    return [
        *_binary("Add", 19, "(a + b)", one),
        *_binary("Sub", 20, "(a - b)", one),
        *_binary("Mul", 21, "(a * b)", one),
        *_binary("Div", 22, "(a / b)", div),
        Row(
            "",
            "Pow",
            ("float16",),
            "float",
            "once",
            "powf of both converted to float for a half exponent; pow in double for a float, double or integer "
            "exponent; converted to half once (Pow-7: the half/half form)",
            (
                c(COMMON, 333, 346, "half _Pow(half a, half b) { return half(powf((float)a, (float)b)); }"),
                c(COMMON, 334, 336, "return static_cast<T>(pow(static_cast<double>(a), static_cast<double>(b)));"),
                c(
                    CU + "math/binary_elementwise_ops.cc",
                    394,
                    394,
                    "ImplT1_Pow<typename ToCudaType<T>::MappedType, typename ToCudaType<MLFloat16>::MappedType>(",
                ),
            ),
        ),
        Row(
            "",
            "PRelu",
            ("float16",),
            "native",
            "once",
            "x > 0 ? x : x * slope: one half product",
            (c(BIN, 27, 27, "BINARY_OP_NAME_EXPR(PRelu, (a > (T)0 ? a : a * b))"), HALF_OPS),
        ),
        _exact(
            "Max",
            TYPES,
            "the larger input (__hmax_nan)",
            (c(BIN, 28, 28, "BINARY_OP_NAME_EXPR(Max, _Max(a, b))"), c(COMMON, 407, 411, "return __hmax_nan(a, b);")),
        ),
        _exact(
            "Min",
            TYPES,
            "the smaller input (__hmin_nan)",
            (c(BIN, 29, 29, "BINARY_OP_NAME_EXPR(Min, _Min(a, b))"), c(COMMON, 376, 380, "return __hmin_nan(a, b);")),
        ),
        Row(
            "",
            "Sum",
            TYPES,
            "native",
            "per-step",
            "with three or more inputs, a chain of Adds in T (half additions; BFloat16 operator+ for bfloat16): the "
            "running sum is rounded to T after each input",
            (
                c(
                    CU + "math/variadic_elementwise_ops_impl.cu",
                    49,
                    49,
                    "DEFINE_TRAITS(variadic_elementwise_ops::Sum, Add)",
                ),
                c(
                    CU + "cu_inc/variadic_elementwise_impl.cuh",
                    45,
                    56,
                    "output_value = func(output_value, inputs_buffer[element_count][input_batch_idx]);",
                ),
            ),
            (
                Cond(
                    "two inputs",
                    "native",
                    "once",
                    "one Add (see Add: half addition, or BFloat16 operator+)",
                    (c(CU + "math/variadic_elementwise_ops.cc", 200, 202, "if (input_count == 2) {"),),
                ),
            ),
        ),
    ]


FAST_GELU_NOTE = (
    "x * (a + a * tanh(x * (c * x * x + b))) with every operation in T, left to right: (x + bias), c * x, * x, + b, "
    "x * (...), tanh (float tanhf rounded to T), a * tanh, a + ..., x * cdf each round to T (half or half2 "
    "operations; BFloat16 operators for bfloat16), and the constants b = sqrt(2/pi) and c = 0.044715 * sqrt(2/pi) are "
    "converted to T first (0.7978515625 and 0.035675049 in half, 0.796875 and 0.035644531 in bfloat16). Near "
    "x = -3.5 the cancellation in a + a * tanh leaves few correct bits: fp16 outputs there differ from the float "
    "formula rounded once by up to thousands of ulps (up to 2e-3 absolute)"
)
FAST_GELU_CITES = (
    c(GELU_APPROX, 39, 50, "const T cdf = a + a * _Tanh(in * (c * in * in + b));"),
    c(GELU_APPROX, 52, 62, "const half2 cdf = a + a * _Tanh(in * (c * in * in + b));"),
    c(GELU_APPROX, 93, 95, "const half2 B2 = __floats2half2_rn(B, B);"),
    c(GELU_APPROX, 118, 119, "FastGeluKernel<BFloat16, blockSize>"),
    c(COMMON, 322, 322, "half _Tanh(half a) { return half(tanhf((float)a)); }"),
    BF16_OPS,
)
ERF_GELU_HALF = c(COMMON, 479, 485, "return a * kHalf * (kOne + _Erf(kAlpha * a));")
ERF_GELU_BF16 = c(COMMON, 474, 477, "return a * _Normcdf(a);")


def _gelu_rows() -> list[Row]:
    gelu = CU + "tensor/gelu_impl.cu"
    gelu_cc = CU + "tensor/gelu.cc"
    bias_gelu = CO + "math/bias_gelu_impl.cu"
    none_half = (
        "x converted to float, x * normcdf(x) in float (normcdff), converted to half once: a specialisation for half "
        "(the half _Gelu of common.cuh is not used here)"
    )
    tanh = Cond(
        "approximate = 'tanh'",
        "native",
        "per-step",
        "FastGelu's kernel without bias: " + FAST_GELU_NOTE,
        (
            c(gelu_cc, 47, 55, 'if (approximation_algorithm_ == "tanh") { return LaunchFastGeluKernel<CudaT>'),
            FAST_GELU_CITES[0],
        ),
    )
    bf16_gelu = (
        "the generic functor on BFloat16: normcdff of x in float rounded to bfloat16, then x * that in BFloat16 "
        "arithmetic (rounded again): two roundings"
    )
    return [
        Row(
            "",
            "Gelu",
            ("float16",),
            "float",
            "once",
            none_half,
            (
                c(gelu, 19, 24, "return static_cast<half>(_Gelu(static_cast<float>(a)));"),
                c(gelu_cc, 56, 60, 'approximation_algorithm_ == "none"'),
            ),
            (tanh,),
        ),
        Row(
            "com.microsoft",
            "Gelu",
            ("float16",),
            "float",
            "once",
            none_half + "; the same kernel as ai.onnx Gelu",
            (
                c(gelu_cc, 70, 80, "onnxruntime::cuda::Gelu<T>);"),
                c(gelu, 19, 24, "return static_cast<half>(_Gelu(static_cast<float>(a)));"),
            ),
        ),
        Row(
            "com.microsoft",
            "Gelu",
            ("bfloat16",),
            "native",
            "per-step",
            bf16_gelu,
            (
                c(gelu, 12, 17, "return _Gelu(a);"),
                ERF_GELU_BF16,
                c(COMMON, 472, 472, "BFloat16 _Normcdf(BFloat16 a) { return normcdff(static_cast<float>(a)); }"),
                BF16_OPS,
            ),
        ),
        Row("com.microsoft", "FastGelu", TYPES, "native", "per-step", FAST_GELU_NOTE, FAST_GELU_CITES),
        Row(
            "com.microsoft",
            "BiasGelu",
            ("float16",),
            "native",
            "per-step",
            "x + bias in half (rounded), then common.cuh's half _Gelu: x * 0.5 * (1 + erf(x * sqrt(1/2))) with the "
            "constant sqrt(1/2) converted to half (0.70703125), the product kAlpha * x, erf (float erff rounded to "
            "half), "
            "1 + erf, x * 0.5 and the final product each rounding in half",
            (
                c(bias_gelu, 55, 55, "Y[input_idx] = _Gelu(reg_X[element_idx] + reg_B[element_idx]);"),
                c(bias_gelu, 86, 86, "reg_Y[element_idx] = _Gelu(reg_X[element_idx] + reg_B[element_idx]);"),
                ERF_GELU_HALF,
                HALF_OPS,
            ),
        ),
        Row(
            "com.microsoft",
            "BiasGelu",
            ("bfloat16",),
            "native",
            "per-step",
            "x + bias in BFloat16 arithmetic (rounded), then " + bf16_gelu,
            (
                c(bias_gelu, 55, 55, "Y[input_idx] = _Gelu(reg_X[element_idx] + reg_B[element_idx]);"),
                ERF_GELU_BF16,
                BF16_OPS,
            ),
        ),
        Row(
            "com.microsoft",
            "QuickGelu",
            TYPES,
            "native",
            "per-step",
            "x * sigmoid(alpha * x) in T: alpha converted to T (the default 1.702 becomes 1.7021484 in half, 1.703125 "
            "in bfloat16), alpha * x, exp (float, rounded to T), 1 + exp, 1 / (...), (1 - that for negative arguments) "
            "and the final product each round to T",
            (
                c(
                    CO + "activation/activations_impl.cu",
                    39,
                    48,
                    "T sigmoid = v >= zero ? one / (one + _Exp(-v)) : one - one / (one + _Exp(v));",
                ),
                HALF_OPS,
                BF16_OPS,
            ),
        ),
        Row(
            "com.microsoft",
            "BiasSplitGelu",
            ("float16",),
            "native",
            "per-step",
            "input + bias is added in half for both halves (rounded), then Gelu of the right half and the product "
            "with the left in float, converted to half once",
            (
                c(
                    CO + "diffusion/bias_split_gelu_impl.cu",
                    40,
                    46,
                    "auto value_left = (float)(input[index_input] + bias[index_bias]);",
                ),
            ),
        ),
        Row(
            "com.microsoft",
            "BiasAdd",
            ("float16",),
            "native",
            "per-step",
            "input + bias + residual in half, left to right: two roundings",
            (
                c(
                    CO + "diffusion/bias_add_impl.cu",
                    39,
                    39,
                    "output[base_offset] = input[base_offset] + bias[bias_offset] + residual[base_offset];",
                ),
                HALF_OPS,
            ),
        ),
    ]


def _attention_rows() -> list[Row]:
    impl = CO + "bert/attention_impl.cu"
    flash = CO + "bert/flash_attention/flash_fwd_kernel.h"
    note = (
        "Q*K' and P*V are GEMMs accumulated in float and the softmax is computed in float, but results are rounded "
        "to T between them: the unfused kernel writes the scaled scores Q*K' to a T buffer (rounded), the softmax "
        "output P to another (rounded), then P*V is written to T; the flash-attention kernel keeps the scores in "
        "float and rounds P to T before P*V (convert_type<Element>(acc_s)). The memory-efficient, TensorRT-fused "
        "(prebuilt cubins) and cuDNN kernels, which ONNX Runtime may pick instead, are not read here"
    )
    projection = (
        ". Attention first projects its input with one GEMM written to a T buffer (rounded); the bias is added "
        "in a later kernel"
    )
    cites = (
        c(
            impl,
            719,
            725,
            "&zero, data.scratch, total_sequence_length, sequence_length * total_sequence_length, batches,",
        ),
        c(impl, 737, 737, "Apply softmax and store result R to scratch2: BxNxSxT"),
        c(impl, 779, 784, "scratch2, total_sequence_length, sequence_length * total_sequence_length,"),
        c(flash, 302, 303, "Tensor rP = flash::convert_type<Element>(acc_s);"),
        c(CO + "bert/attention_softmax.cu", 128, 129, "output[index] = T(val);"),
    )
    return [
        Row(
            "com.microsoft",
            "Attention",
            ("float16",),
            "float",
            "per-step",
            note + projection,
            (
                *cites,
                c(
                    CO + "bert/attention.cc",
                    242,
                    253,
                    "&zero, reinterpret_cast<CudaT*>(gemm_buffer.get()), n, device_prop",
                ),
            ),
        ),
        Row("com.microsoft", "MultiHeadAttention", ("float16",), "float", "per-step", note, cites),
    ]


def cuda_rows() -> list[Row]:
    """Every row of the CUDA table, in the order the file lists them."""
    return [
        *_softmax_rows(),
        *_norm_rows(),
        *_reduction_rows(),
        *_gemm_rows(),
        *_unary_rows(),
        *_activation_rows(),
        *_binary_rows(),
        *_gelu_rows(),
        *_attention_rows(),
    ]


# --- DirectML and TensorRT: what their sources say --------------------------------------------------------------
DML_CITES = (
    c(DML + "Operators/DmlOperator.cpp", 480, 509, "bool DmlOperator::AllowHalfPrecisionComputation() const"),
    c(DML + "Operators/DmlOperator.cpp", 511, 517, "flags |= DML_EXECUTION_FLAG_ALLOW_HALF_PRECISION_COMPUTATION;"),
    c(DML + "DmlGraphFusionHelper.cpp", 568, 588, "DML_EXECUTION_FLAGS executionFlags = DML_EXECUTION_FLAG_NONE;"),
)
DML_NOTE = (
    "nothing known: the provider hands the arithmetic to DirectML.dll and the GPU driver, whose source is not "
    "public. The provider compiles an operator whose tensors include an fp16 one and no fp32 one with "
    "DML_EXECUTION_FLAG_ALLOW_HALF_PRECISION_COMPUTATION (DirectML may then compute in half precision), and a fused "
    "partition of the graph without it; neither says how a given operator computes"
)
TRT_IMPORTERS = "onnxOpImporters.cpp"
TRT_LN = (
    c(TRT_IMPORTERS, 2781, 2782, 'convertDtype(attrs.get<int32_t>("stash_type", 1), &computeType);'),
    c(TRT_IMPORTERS, 2798, 2800, "layer->setComputePrecision(computeType);"),
)
TRT_NOTE = (
    "nothing known: the onnx-tensorrt parser builds TensorRT layers without asking for a compute precision, and "
    "TensorRT's kernels (its choice at build time) are not public"
)


def trt_rows(supported: dict[str, list[str]]) -> list[Row]:
    """The TensorRT rows: LayerNormalization's compute precision, which the parser sets, and nothing known for the
    other ONNX-domain ops of the CUDA table that TensorRT supports at a low type (`supported`: op -> low types)."""
    rows = []
    for op in sorted({r.op for r in cuda_rows() if r.domain == ""} & set(supported)):
        if op == "LayerNormalization":
            rows.append(
                Row(
                    "",
                    op,
                    tuple(supported[op]),
                    "float",
                    "unknown",
                    "the parser builds an INormalizationLayer and sets its compute precision to stash_type's type, "
                    "float unless the node says otherwise; where TensorRT rounds inside the layer is TensorRT's",
                    TRT_LN,
                    (
                        Cond(
                            "stash_type names fp16 or bf16",
                            "native",
                            "unknown",
                            "the compute precision is that type",
                            TRT_LN,
                        ),
                    ),
                )
            )
        else:
            rows.append(Row("", op, tuple(supported[op]), None, None, TRT_NOTE, ()))
    return rows


def dml_rows(registered: dict[tuple[str, str], list[str]]) -> list[Row]:
    """One row per (domain, op) of the CUDA table that DirectML registers at a low type: nothing known."""
    keys = sorted({(r.domain, r.op) for r in cuda_rows()} & set(registered))
    return [Row(d, op, tuple(registered[(d, op)]), None, None, DML_NOTE, DML_CITES[:2]) for d, op in keys]


# --- building, checking ------------------------------------------------------------------------------------------
def collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _evidence(cites: tuple[Cite, ...]) -> list[dict]:
    return [{"source": cite.where, "quote": cite.quote} for cite in cites]


def row_json(row: Row) -> dict:
    out: dict = {"domain": row.domain, "op": row.op, "types": list(row.types), "compute": row.compute}
    out["rounds"] = row.rounds
    out["source"] = row.cites[0].where if row.cites else None
    out["note"] = row.note
    out["evidence"] = _evidence(row.cites)
    out["conditions"] = [
        {
            "when": k.when,
            "compute": k.compute,
            "rounds": k.rounds,
            "note": k.note,
            "source": k.cites[0].where,
            "evidence": _evidence(k.cites),
        }
        for k in row.conditions
    ]
    return out


def cited_paths(rows: list[Row], extra: tuple[Cite, ...] = ()) -> list[str]:
    cites = [
        *extra,
        *(k for r in rows for k in r.cites),
        *(k for r in rows for cond in r.conditions for k in cond.cites),
    ]
    return sorted({k.path for k in cites})


def table(runtime: str, meta: dict, rows: list[Row], provider: dict | None = None) -> dict:
    """The JSON of one runtime's table from its rows and `meta` (repo, version, commit, date, files, kernels_table)."""
    out = {"runtime": runtime, **{k: meta[k] for k in ("version", "repo", "commit", "date", "kernels_table")}}
    out["generated_by"] = "tools/kernel_compute.py"
    out["legend"] = LEGEND
    if provider is not None:
        out["provider"] = provider
    out["files"] = meta["files"]
    out["ops"] = [row_json(r) for r in rows]
    return out


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def verify(git_dir: str, commit: str, cites: list[Cite]) -> dict[str, str]:
    """Check every cite against the tree at `commit`: the file exists, the lines exist, the quote is there.
    Returns path -> git blob id of every cited file; exits with every problem found."""
    texts: dict[str, list[str] | None] = {}
    problems = []
    for cite in cites:
        if cite.path not in texts:
            try:
                texts[cite.path] = git(git_dir, "show", f"{commit}:{cite.path}").splitlines()
            except subprocess.CalledProcessError:
                texts[cite.path] = None
        lines = texts[cite.path]
        if lines is None:
            problems.append(f"{cite.where}: no such file at {commit[:9]}")
            continue
        if not 1 <= cite.first <= cite.last <= len(lines):
            problems.append(f"{cite.where}: the file has {len(lines)} lines")
            continue
        if collapse(cite.quote) not in collapse(" ".join(lines[cite.first - 1 : cite.last])):
            found = [i + 1 for i, line in enumerate(lines) if collapse(cite.quote)[:40] in collapse(line)]
            problems.append(f"{cite.where}: {cite.quote!r} is not there (its start is on lines {found[:5]})")
    if problems:
        raise SystemExit("citations that do not hold:\n  " + "\n  ".join(problems))
    return {path: git(git_dir, "rev-parse", f"{commit}:{path}").strip() for path in sorted(texts)}


def _all_cites(rows: list[Row], extra: tuple[Cite, ...] = ()) -> list[Cite]:
    return [
        *extra,
        *(k for r in rows for k in r.cites),
        *(k for r in rows for cond in r.conditions for k in cond.cites),
    ]


def _meta(git_dir: str, commit: str, repo: str, version: str, kernels_table: str, cites: list[Cite]) -> dict:
    commit = git(git_dir, "rev-parse", f"{commit}^{{commit}}").strip()
    date = git(git_dir, "show", "-s", "--format=%cI", commit).strip()
    files = verify(git_dir, commit, cites)
    return {
        "repo": repo,
        "version": version,
        "commit": commit,
        "date": date,
        "files": files,
        "kernels_table": kernels_table,
    }


def kernel_table(name: str) -> dict:
    return json.loads((DATA / f"kernels_{name}.json").read_text(encoding="utf-8"))


def registered_low(name: str) -> dict[tuple[str, str], list[str]]:
    """(domain, op) -> the low types some registration of the kernel table `name` (cuda, dml) lists."""
    found: dict[tuple[str, str], set[str]] = {}
    for row in kernel_table(name)["kernels"]:
        low = set(row["types"]) & set(TYPES)
        if low:
            found.setdefault((row["domain"], row["op"]), set()).update(low)
    return {k: sorted(v) for k, v in found.items()}


def trt_supported() -> dict[str, list[str]]:
    """op -> the low types the TensorRT operator matrix lists for a supported op."""
    out = {}
    for row in kernel_table("tensorrt")["ops"]:
        low = sorted(set(row["types"]) & set(TYPES))
        if row["supported"] and low:
            out[row["op"]] = low
    return out


def build(runtime: str, meta: dict) -> dict:
    """The table of `runtime` ("cuda", "dml", "tensorrt") for `meta`."""
    if runtime == "cuda":
        return table("onnxruntime-cuda", meta, cuda_rows())
    if runtime == "dml":
        provider = {"note": DML_NOTE, "evidence": _evidence(DML_CITES)}
        return table("onnxruntime-directml", meta, dml_rows(registered_low("dml")), provider)
    return table("tensorrt", meta, trt_rows(trt_supported()))


def sources(runtime: str) -> tuple[str, str, str, list[Cite]]:
    """(repo, commit, version, cites) of `runtime`'s table: the commit and version of its kernel table."""
    kt = kernel_table(runtime)
    if runtime == "cuda":
        return ORT_REPO, kt["source"]["commit"], kt["onnxruntime"], _all_cites(cuda_rows())
    if runtime == "dml":
        return (
            ORT_REPO,
            kt["source"]["commit"],
            kt["onnxruntime"],
            _all_cites(dml_rows(registered_low("dml")), DML_CITES),
        )
    return TRT_REPO, kt["source"]["commit"], kt["tensorrt"], _all_cites(trt_rows(trt_supported()))


RUNTIMES = ("cuda", "dml", "tensorrt")


def structure(name: str, shipped: dict) -> list[str]:
    """Problems with the shape of a table: classes, types, one row per (domain, op, type), cited files recorded."""
    problems = []
    seen: set[tuple[str, str, str]] = set()
    for row in shipped["ops"]:
        where = f"{name}: {row['domain'] or 'ai.onnx'}:{row['op']}"
        if row["compute"] not in (*COMPUTE, None) or row["rounds"] not in (*ROUNDS, "unknown", None):
            problems.append(f"{where}: compute {row['compute']!r}, rounds {row['rounds']!r}")
        if (row["compute"] is None) != (row["rounds"] is None):
            problems.append(f"{where}: compute and rounds are known together or not at all")
        if not row["types"] or not set(row["types"]) <= set(TYPES) or row["types"] != sorted(row["types"]):
            problems.append(f"{where}: types {row['types']}")
        for t in row["types"]:
            if (row["domain"], row["op"], t) in seen:
                problems.append(f"{where}: {t} listed twice")
            seen.add((row["domain"], row["op"], t))
        for ev in row["evidence"] + [e for k in row["conditions"] for e in k["evidence"]]:
            if ev["source"].rsplit(":", 1)[0] not in shipped["files"]:
                problems.append(f"{where}: {ev['source']} cites a file the table does not record")
        if row["compute"] is not None and not row["evidence"]:
            problems.append(f"{where}: a known row without evidence")
    return problems


def consistency(runtime: str, shipped: dict) -> list[str]:
    """Problems between a compute table and the kernel table of its runtime: same commit, every (op, type) has a
    kernel there."""
    kt = kernel_table(runtime)
    problems = []
    if shipped["commit"] != kt["source"]["commit"]:
        problems.append(f"compute_{runtime}.json: commit {shipped['commit']} is not kernels_{runtime}.json's")
    have: dict = trt_supported() if runtime == "tensorrt" else registered_low(runtime)
    for row in shipped["ops"]:
        key = row["op"] if runtime == "tensorrt" else (row["domain"], row["op"])
        missing = set(row["types"]) - set(have.get(key, ()))
        if missing:
            problems.append(f"compute_{runtime}.json: {key} {sorted(missing)} has no kernel in kernels_{runtime}.json")
    return problems


def check() -> list[str]:
    """Every problem with the shipped tables (none: they are what the rows write, well formed, consistent)."""
    problems = []
    for runtime in RUNTIMES:
        path = DATA / f"compute_{runtime}.json"
        if not path.exists():
            problems.append(f"{path.name}: missing (run the script with --git-dir)")
            continue
        shipped = json.loads(path.read_text(encoding="utf-8"))
        meta = {k: shipped.get(k) for k in ("repo", "version", "commit", "date", "files", "kernels_table")}
        expected = build(runtime, meta)
        if expected != shipped:
            differ = [e["op"] for e, s in zip(expected["ops"], shipped["ops"]) if e != s]
            problems.append(f"{path.name}: not what the rows write (ops differing: {differ[:5]}; rerun with --git-dir)")
        if set(cited_paths_of(expected)) != set(shipped["files"]):
            problems.append(f"{path.name}: the recorded files are not the cited ones")
        problems += structure(path.name, shipped)
        problems += consistency(runtime, shipped)
    return problems


def cited_paths_of(tab: dict) -> list[str]:
    evidence = [e for r in tab["ops"] for e in r["evidence"] + [x for k in r["conditions"] for x in k["evidence"]]]
    evidence += tab.get("provider", {}).get("evidence", [])
    return sorted({e["source"].rsplit(":", 1)[0] for e in evidence})


def write(ort_git_dir: str, trt_git_dir: str, out: pathlib.Path = DATA) -> None:
    """Write the three tables into `out` from the trees, after checking every citation against them."""
    for runtime in RUNTIMES:
        repo, commit, version, cites = sources(runtime)
        git_dir = trt_git_dir if runtime == "tensorrt" else ort_git_dir
        if runtime == "cuda":
            number = git(git_dir, "show", f"{commit}:VERSION_NUMBER").strip()
            if number != version:
                raise SystemExit(f"VERSION_NUMBER at {commit[:9]} is {number}, kernels_cuda.json says {version}")
        meta = _meta(git_dir, commit, repo, version, f"kernels_{runtime}.json", cites)
        tab = build(runtime, meta)
        path = out / f"compute_{runtime}.json"
        path.write_text(json.dumps(tab, indent=1) + "\n", encoding="utf-8")
        known = sum(r["compute"] is not None for r in tab["ops"])
        print(
            f"{path.name}: {len(tab['ops'])} rows ({known} known), {len(meta['files'])} files at {meta['commit'][:9]}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--git-dir", help="git directory of an ONNX Runtime tree holding the kernel tables' commits")
    ap.add_argument(
        "--trt-git-dir", help="git directory of an onnx-tensorrt tree holding kernels_tensorrt.json's commit"
    )
    ap.add_argument("--check", action="store_true", help="check the shipped tables without the sources")
    ap.add_argument(
        "--out", type=pathlib.Path, default=DATA, help="folder to write the tables into (default: the package's)"
    )
    args = ap.parse_args()
    if args.git_dir or args.trt_git_dir:
        if not (args.git_dir and args.trt_git_dir):
            ap.error("--git-dir and --trt-git-dir go together")
        write(args.git_dir, args.trt_git_dir, args.out)
        if args.out.resolve() != DATA.resolve():
            return 0
    elif not args.check:
        ap.error("give --git-dir and --trt-git-dir, or --check")
    problems = check()
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print("compute tables: consistent with the rows and the kernel tables")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
