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

What it does not model: the internal order of floating-point sums inside one kernel (cuBLAS
and cuDNN choose their own), fused kernels that keep intermediates in fp32, and kernels that
compute an fp16 elementwise op in fp16 arithmetic rather than fp32 followed by rounding. These
change results in the last bits, not overflow and NaN behaviour.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..dtypes import BFLOAT16, FLOAT, FLOAT16, bf16_bits_to_float
from ..graph import build_index

LOW = (FLOAT16, BFLOAT16)


def emulation_model(model: onnx.ModelProto, where: str = "<converted>") -> onnx.ModelProto:
    """An fp32 model that rounds like the given mixed-precision model would on a GPU."""
    emu = onnx.ModelProto()
    emu.CopyFrom(model)
    index = build_index(emu, where)
    taken = set()
    for scope in index.scopes:
        taken.update(scope.values)
    counter = [0]

    def fresh(base):
        name = base
        while name in taken:
            counter[0] += 1
            name = f"{base}_{counter[0]}"
        taken.add(name)
        return name

    new_nodes: dict[int, list] = {}     # scope id -> nodes to add at the head
    after: dict[int, list] = {}         # node id -> nodes to add after it

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
                    wide = fresh(f"{value.name}__emu_fp32")
                    if low == BFLOAT16:
                        _set_declared(graph.input, value.name, FLOAT)
                        rounded = fresh(f"{value.name}__emu_bf16")
                        new_nodes.setdefault(scope.id, []).extend([
                            helper.make_node("Cast", [value.name], [rounded], to=BFLOAT16),
                            helper.make_node("Cast", [rounded], [wide], to=FLOAT)])
                    else:
                        new_nodes.setdefault(scope.id, []).append(
                            helper.make_node("Cast", [value.name], [wide], to=FLOAT))
                    for consumer, port in value.consumers:
                        consumer.proto.input[port] = wide
                    _retarget_outputs(graph, value.name, wide)
                else:
                    _set_declared(graph.input, value.name, FLOAT)
                continue
            # a node output: produce fp32, round through the low type, continue in fp32
            producer = value.producer
            raw = fresh(f"{value.name}__emu_raw")
            rounded_low = fresh(f"{value.name}__emu_{'fp16' if low == FLOAT16 else 'bf16'}")
            producer.proto.output[value.out_port] = raw
            chain = [helper.make_node("Cast", [raw], [rounded_low], to=low)]
            if is_main and value.graph_outputs and low == BFLOAT16:
                # bf16 model outputs are given back as fp32 holding bf16 values (see inputs)
                chain.append(helper.make_node("Cast", [rounded_low], [value.name], to=FLOAT))
                _set_declared(graph.output, value.name, FLOAT)
            elif is_main and value.graph_outputs:
                # the model output keeps its declared low type; consumers read the fp32 copy
                wide = fresh(f"{value.name}__emu_fp32")
                chain.append(helper.make_node("Cast", [rounded_low], [value.name], to=low))
                chain.append(helper.make_node("Cast", [rounded_low], [wide], to=FLOAT))
                for consumer, port in value.consumers:
                    consumer.proto.input[port] = wide
            else:
                chain.append(helper.make_node("Cast", [rounded_low], [value.name], to=FLOAT))
                if value.graph_outputs:
                    _set_declared(graph.output, value.name, FLOAT)
            after.setdefault(producer.id, []).extend(chain)
            _retype_producer(producer)

    for scope in reversed(index.scopes):
        graph = scope.graph
        ordered = list(new_nodes.get(scope.id, []))
        for node in scope.order:
            ordered.append(node.proto)
            ordered.extend(after.get(node.id, ()))
        del graph.node[:]
        graph.node.extend(ordered)
        del graph.value_info[:]
    return emu


def _retarget_outputs(graph, old, new):
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_reads(attr.g, old, new)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _rename_reads(g, old, new)


def _rename_reads(graph, old, new):
    """Outer-scope reads of a renamed value inside a subgraph (unless the subgraph shadows it)."""
    if any(v.name == old for v in list(graph.input) + list(graph.initializer)) or \
            any(old in n.output for n in graph.node):
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_reads(attr.g, old, new)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    _rename_reads(g, old, new)
    for out in graph.output:
        if out.name == old:
            pass  # a subgraph output that is an outer value: left to the Identity ONNX requires


def _set_declared(infos, name, elem_type):
    for vi in infos:
        if vi.name == name and vi.type.HasField("tensor_type"):
            vi.type.tensor_type.elem_type = elem_type


def _to_fp32(tensor: TensorProto) -> None:
    if tensor.data_type == BFLOAT16:
        bits = np.frombuffer(tensor.raw_data, dtype="<u2") if tensor.HasField("raw_data") else \
            np.asarray(tensor.int32_data, dtype=np.uint16)
        data = bf16_bits_to_float(bits).reshape(tuple(tensor.dims))
    else:
        data = numpy_helper.to_array(tensor).astype(np.float32)
    name = tensor.name
    tensor.CopyFrom(numpy_helper.from_array(data.astype(np.float32), name))


def _retype_producer(node) -> None:
    """Nodes whose output type comes from an attribute keep producing the low type (the
    rounding casts follow); everything else now computes in fp32 from fp32 inputs."""
    return None
