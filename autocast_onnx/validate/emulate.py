"""Stage: validate / emulation. Rewrites a mixed-precision model into an fp32 model that
computes what a GPU computes, so ONNX Runtime's CPU provider can show it.

The CPU provider has few fp16 kernels: it runs most fp16 nodes in fp32 behind casts it adds
itself, so fp16 overflow, underflow and rounding mostly vanish. The emulation model instead:

  * computes every node in fp32 - for MatMul/Gemm/Conv this is the fp32 accumulation of
    fp16 (or bf16) products that tensor-core kernels do: the product of two fp16 numbers is
    exact in fp32;
  * rounds every tensor the converted model holds in fp16/bf16 to that type right after it is
    produced (Cast to the low type and back): values beyond the range become +-inf, values
    below half the smallest subnormal become 0, the rest lose their low mantissa bits;
  * converts fp16/bf16 initializers to fp32 exactly, and keeps the model's inputs and outputs
    with their declared types.

That is exactly what a kernel computes that converts its inputs to float, computes in float and
rounds each output once: the "float"/"once" rows of the design runtime's compute table
(catalog/compute.py, data/compute_cuda.json: ONNX Runtime's CUDA provider, read from its source),
such as Softmax, LayerNormalization, ReduceSum, Exp, Tanh, fp16 Sigmoid and MatMul. A kernel that
does a single correctly rounded low-precision operation (Add, Mul, Relu, Max: "native"/"once")
computes the same numbers too.

Kernels that chain several low-precision operations, each rounding ("per-step"), are rewritten
first into those steps as standard ONNX ops at the low type (emulate_steps.py), so each step is
rounded as on the GPU: FastGelu, Gelu with approximate='tanh', fp16 BiasGelu, QuickGelu, bf16
Sigmoid, Elu, Selu, Softplus, Softsign, HardSigmoid, Sum of three or more inputs, BiasAdd, and
LeakyRelu and ThresholdedRelu, whose alpha the kernel rounds. These differ from a single rounding
by far more than the last bit (FastGelu near x = -3.5: thousands of fp16 ulps, up to 2e-3
absolute; bf16 Sigmoid for negative x: up to 5e-3 absolute).

What it still does not model, with the compute table's row for each (docs/validate.md, "What
emulation does not model"):

  * the order of floating-point sums inside one kernel (cuBLAS, cuDNN and the reductions choose
    their own), and the float math library (CUDA's expf/tanhf/erff against the CPU's: an ulp of
    float, which moves a low-precision rounding once in thousands of values);
  * kernels that round inside in ways the rewrite does not reproduce: SkipLayerNormalization and
    SkipSimplifiedLayerNormalization (statistics accumulated in the low type by block reductions,
    unless the provider's strict mode is on), InstanceNormalization with a batch above 1
    (normalised in fp16 after float statistics), ReduceMean on its fast path (the sum rounded to
    fp16, then divided in fp16), ReduceSumSquare, ReduceLogSum and ReduceLogSumExp (fp16
    intermediates), Conv/ConvTranspose with a bias (the convolution rounded before the bias add:
    one extra rounding, at most an ulp), Gemm, FusedMatMul and TransposeMatMul (alpha and beta
    rounded to the low type first: exact for 1 and 0), attention kernels (scores and
    probabilities rounded to fp16 between their GEMMs), Softmax on rows of 1025 to 2048 in
    batches of 8192 rows or more, SkipGroupNorm, BiasSplitGelu, and the bf16 erf-Gelus (normcdf
    rounded to bf16 before the product: one extra rounding) - their emulation rounds once;
  * fused kernels that keep intermediates in fp32 between what are separate nodes in the graph.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from ..dtypes import BFLOAT16, FLOAT, FLOAT16, bf16_bits_to_float
from ..errors import AutocastError
from ..graph import build_index
from ..rewrite.edit import Names, cast_node, write_nodes
from .emulate_steps import decompose

LOW = (FLOAT16, BFLOAT16)


def emulation_model(model: onnx.ModelProto, where: str = "<converted>") -> onnx.ModelProto:
    """An fp32 model that rounds like the given mixed-precision model would on a GPU. Built with
    the rewrite's editing helpers (rewrite/edit.py): only `rewrite/` knows how to edit a graph."""
    emu = onnx.ModelProto()
    emu.CopyFrom(model)
    decompose(emu, where)  # kernels that round inside themselves: their steps, at the low type (emulate_steps.py)
    index = build_index(emu, where)
    names = Names(index)
    head: dict[int, list] = {}  # scope id -> nodes to add at the head
    after: dict[int, list] = {}  # node id -> nodes to add after it

    def cast(src: str, dst: str, to: int) -> bytes:
        return cast_node(src, dst, names.fresh_node(dst), to)

    for scope in index.scopes:
        graph = scope.graph
        is_main = scope is index.main
        for value in list(scope.values.values()):
            low = value.dtype
            if low not in LOW:
                continue
            if value.kind == "initializer":
                _to_fp32(value.initializer)
                continue
            if value.kind == "input":
                if value.initializer is not None:
                    _to_fp32(value.initializer)
                if is_main:
                    # fp16 feeds stay fp16 and everything inside sees them as fp32 (exact). bf16
                    # feeds are declared fp32 (ONNX Runtime's Python API takes no bf16 arrays) and
                    # rounded to bf16 first, as feeding them as bf16 would.
                    wide = names.fresh(f"{value.name}__emu_fp32")
                    if low == BFLOAT16:
                        _set_declared(graph.input, value.name, FLOAT)
                        rounded = names.fresh(f"{value.name}__emu_bf16")
                        head.setdefault(scope.id, []).extend(
                            [cast(value.name, rounded, BFLOAT16), cast(rounded, wide, FLOAT)]
                        )
                    else:
                        head.setdefault(scope.id, []).append(cast(value.name, wide, FLOAT))
                    # consumers include the nodes of subgraphs that read the input from outside
                    for consumer, port in value.consumers:
                        consumer.proto.input[port] = wide
                else:
                    _set_declared(graph.input, value.name, FLOAT)
                continue
            # a node output: produce fp32, round through the low type, continue in fp32
            producer = value.producer
            raw = names.fresh(f"{value.name}__emu_raw")
            rounded_low = names.fresh(f"{value.name}__emu_{'fp16' if low == FLOAT16 else 'bf16'}")
            producer.proto.output[value.out_port] = raw
            chain = [cast(raw, rounded_low, low)]
            if is_main and value.graph_outputs and low == BFLOAT16:
                # bf16 model outputs are given back as fp32 holding bf16 values (see inputs)
                chain.append(cast(rounded_low, value.name, FLOAT))
                _set_declared(graph.output, value.name, FLOAT)
            elif is_main and value.graph_outputs:
                # the model output keeps its declared low type; consumers read the fp32 copy
                wide = names.fresh(f"{value.name}__emu_fp32")
                chain.append(cast(rounded_low, value.name, low))
                chain.append(cast(rounded_low, wide, FLOAT))
                for consumer, port in value.consumers:
                    consumer.proto.input[port] = wide
            else:
                chain.append(cast(rounded_low, value.name, FLOAT))
                if value.graph_outputs:
                    _set_declared(graph.output, value.name, FLOAT)
            after.setdefault(producer.id, []).extend(chain)

    # Every tensor the model names is fp32 in the emulation (the
    # rounded copies carry new names), so declared low types become fp32 rather than being dropped:
    # ops without shape inference (onnxruntime-training's MaxPoolGrad) need the declared types.
    for scope in index.scopes:
        outputs = {vi.name for vi in scope.graph.output}
        kept = []
        for vi in scope.graph.value_info:
            if vi.name in outputs:
                continue
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in LOW:
                vi.type.tensor_type.elem_type = FLOAT
            kept.append(vi)
        del scope.graph.value_info[:]
        scope.graph.value_info.extend(kept)
    write_nodes(index, head, after, skip_unchanged=False)
    return emu


def session_as_is(model: onnx.ModelProto, path: str | None, device: str, label: str = "the converted model"):
    """An ONNX Runtime session of the mixed-precision model itself, beside its emulation: the
    emulation is an fp32 rewrite, which loads even where the model does not (a tensor whose type
    disagrees with its op's schema), and the tool's promise is a model that loads. A model that
    ONNX Runtime refuses is refused as a plain comparison refuses it (AutocastError, exit 2). A
    model that resolves but has no kernel for some node on `device` (NOT_IMPLEMENTED: bf16 on the
    CPU provider, which lacks bf16 MatMul and Gemm) is no refusal: (None, a note why) comes back.
    Returns (session or None, note or None)."""
    from . import runner

    try:
        return runner.session(path if path else model.SerializeToString(), device, label=label, where=path), None
    except AutocastError as exc:
        if _NO_KERNEL not in exc.what:
            raise
        return None, f"the converted model does not load on {device} as it is ({exc.what})"


_NO_KERNEL = "NOT_IMPLEMENTED"  # ONNX Runtime's status for a node without a kernel, raised after the graph resolved


def _set_declared(infos, name, elem_type):
    for vi in infos:
        if vi.name == name and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = elem_type


def _to_fp32(tensor: TensorProto) -> None:
    if tensor.data_type == BFLOAT16:
        bits = (
            np.frombuffer(tensor.raw_data, dtype="<u2")
            if tensor.HasField("raw_data")
            else np.asarray(tensor.int32_data, dtype=np.uint16)
        )
        data = bf16_bits_to_float(bits).reshape(tuple(tensor.dims))
    else:
        data = numpy_helper.to_array(tensor).astype(np.float32)
    name = tensor.name
    tensor.CopyFrom(numpy_helper.from_array(data.astype(np.float32), name))


def low_precision_tensors(model: onnx.ModelProto, where: str = "<model>") -> int:
    """How many tensors of the model are fp16/bf16 (0: its emulation computes what it computes)."""
    index = build_index(model, where)
    return sum(1 for scope in index.scopes for value in scope.values.values() if value.dtype in LOW)


def emulate_file(in_path, out_path=None) -> dict:
    """`autocast-onnx emulate`: write the emulation model of the mixed-precision model at
    `in_path` (default: NAME.emu.onnx beside it), or of both models of an onnxruntime-training
    artifacts folder (default: FOLDER.emu; the other files are copied), so that ONNX Runtime's CPU
    provider, onnxruntime-training included, computes with the rounding of fp16/bf16. Returns
    what was written: {"output": path, "files": {name: low-precision tensors emulated}}."""
    from pathlib import Path

    from ..graph.sanity import load_checked
    from ..io import check_outputs, load_model, save_model
    from ..training.artifacts import ArtifactsResult, is_artifacts_dir, process_folder

    in_path = Path(in_path)

    def one(source: Path, target: Path) -> dict:
        loaded = load_checked(source)
        emulated = low_precision_tensors(loaded.model, str(source))
        save_model(emulation_model(loaded.model, str(source)), target, external_data=loaded.external_data or None)
        return {"action": "emulated", "low_precision_tensors": emulated}

    if is_artifacts_dir(in_path):
        out_dir = Path(out_path) if out_path is not None else in_path.with_name(in_path.name + ".emu")
        result = ArtifactsResult(out_dir=out_dir)
        process_folder(in_path, out_dir, one, result, lambda results: {"emulation": True})
        return {"output": str(out_dir), "files": dict(result.manifest["files"])}
    if in_path.is_dir():
        load_model(in_path)  # says it is a folder, not a model
    out = (
        Path(out_path) if out_path is not None else in_path.with_name(f"{in_path.stem}.emu{in_path.suffix or '.onnx'}")
    )
    check_outputs([("-o", out)], [in_path], models=["-o"], model_inputs=[in_path])
    return {"output": str(out), "files": {in_path.name: one(in_path, out)}}
