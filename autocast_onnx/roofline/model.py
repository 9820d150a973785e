"""The roofline estimate of one model's main graph (see the package's text)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ..dtypes import BFLOAT16, FLOAT, FLOAT16, ITEMSIZE
from ..graph.domains import normalize_domain
from ..graph.shapes import MAC_OPS, macs_of
from .gpus import GPU, table

# ops ONNX Runtime runs without a kernel of their own (a view of the same buffer, a value folded at load)
FREE_OPS = frozenset({"Constant", "Shape", "Size", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout"})
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
KIND_OF_TYPE = {FLOAT16: "fp16", BFLOAT16: "bf16"}


@dataclass
class KernelCost:
    """One kernel: the graph nodes it runs (indices into graph.node), what it moves and computes."""

    nodes: tuple[int, ...]  # positions in the node list priced
    op: str  # the op type, or "A+B" for a fused group
    bytes: int | None  # None: a tensor of unknown size
    flops: int
    kind: str | None  # the compute kind of a product (fp16, bf16, tf32, fp32); None for the others
    seconds: float
    bound: str  # "memory", "compute" or "launch"


@dataclass
class Estimate:
    gpu: GPU
    tf32: bool
    kernels: list[KernelCost] = field(default_factory=list)
    unpriced: int = 0  # kernels with a tensor of unknown size, priced at their launch alone

    @property
    def seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def seconds_of(self, op: str) -> float:
        return sum(k.seconds for k in self.kernels if k.op == op)

    def seconds_of_nodes(self, ids: Iterable[int]) -> float:
        """The time of the kernels that run any of these nodes (positions in the node list)."""
        wanted = set(ids)
        return sum(k.seconds for k in self.kernels if wanted.intersection(k.nodes))

    def to_dict(self) -> dict:
        return {
            "gpu": self.gpu.key,
            "seconds": self.seconds,
            "kernels": len(self.kernels),
            "cast_seconds": self.seconds_of("Cast"),
            "unpriced_kernels": self.unpriced,
            "tf32": self.tf32,
        }


def estimate(
    nodes, graph_outputs, gpu: GPU, shapes: Mapping, fused: Iterable[Iterable[str]] = (), tf32: bool = True
) -> Estimate:
    """The roofline estimate of a graph on `gpu`: `nodes` its NodeProtos (or anything with op_type,
    domain, input, output and attribute) in order, `graph_outputs` the names of its outputs,
    `shapes` tensor name -> (elem type, dims or None) (graph/shapes.tensor_shapes, initializers
    included), `fused` the groups the runtime runs as one kernel, each named by its nodes' first
    outputs, `tf32` whether fp32 products run as TF32 (ONNX Runtime's CUDA default)."""
    nodes = list(nodes)
    position = {node.output[0]: i for i, node in enumerate(nodes) if node.output and node.output[0]}
    group_of: dict[int, tuple[int, ...]] = {}
    for group in fused:
        together = tuple(sorted({position[name] for name in group if name in position}))
        if len(together) > 1:
            for i in together:
                group_of[i] = together
    outputs = set(graph_outputs)
    readers: dict[str, set] = {}
    if group_of:
        for i, node in enumerate(nodes):
            for name in node.input:
                if name:
                    readers.setdefault(name, set()).add(i)
    pricing = _Pricing(gpu, shapes, tf32)
    out = Estimate(gpu, tf32)
    done: set = set()
    for i, node in enumerate(nodes):
        if i in done:
            continue
        members: tuple[int, ...] | None = group_of.get(i) if group_of else None
        if members is None:
            if node.op_type in FREE_OPS and normalize_domain(node.domain) == "":
                continue
            cost = pricing.kernel([node], (i,), [*node.input, *node.output])
        else:
            done.update(members)
            group = [nodes[j] for j in members]
            cost = pricing.kernel(group, members, _moved(group, members, readers, outputs))
        out.unpriced += cost.bytes is None
        out.kernels.append(cost)
    return out


def _moved(group: list, members: tuple, readers: dict, outputs: set) -> list:
    """The tensors a fused group reads from and writes to memory: its inputs made outside it, and
    its outputs read outside it or given by the graph (the others stay on chip)."""
    made = {name for node in group for name in node.output if name}
    inside = set(members)
    moved = [n for node in group for n in node.input if n not in made]
    moved += [n for node in group for n in node.output if n in outputs or not readers.get(n, set()) <= inside]
    return moved


class _Pricing:
    """Prices kernels, each tensor's size worked out once."""

    def __init__(self, gpu: GPU, shapes: Mapping, tf32: bool):
        t = table()
        self.gpu, self.shapes, self.tf32, self.launch = gpu, shapes, tf32, t.launch_s
        self.bandwidth = gpu.bandwidth * 1e12 * t.bandwidth_efficiency
        self.efficiency = t.compute_efficiency
        self.sizes: dict = {}

    def size(self, name: str) -> int | None:
        sizes = self.sizes
        if name in sizes:
            return sizes[name]
        got = sizes[name] = _bytes(self.shapes, name)
        return got

    def kernel(self, group: list, members: tuple, moved: list) -> KernelCost:
        total: int | None = 0
        for name in dict.fromkeys(moved):
            if not name:
                continue
            size = self.size(name)
            if size is None:
                total = None
                break
            total += size  # type: ignore[operator]
        flops, kind = 0, None
        for node in group:
            f, k = _flops(node, self.shapes, self.tf32)
            flops += f
            kind = kind or k
        compute = flops / (self.gpu.peak(kind) * self.efficiency) if kind and flops else 0.0
        memory = (total or 0) / self.bandwidth
        busy = max(compute, memory)
        bound = "launch" if total is None or busy < self.launch else "compute" if compute > memory else "memory"
        op = group[0].op_type if len(group) == 1 else "+".join(dict.fromkeys(n.op_type for n in group))
        # launches are asynchronous: the GPU runs one kernel while the next is dispatched, so a kernel takes
        # its own time or the dispatch's, whichever is longer
        return KernelCost(members, op, total, flops, kind, max(busy, self.launch), bound)


def _bytes(shapes: Mapping, name: str) -> int | None:
    got = shapes.get(name)
    if got is None:
        return None
    elem, dims = got
    size = ITEMSIZE.get(elem)
    if dims is None or size is None:
        return None
    return math.prod(dims) * size


def _flops(node, shapes: Mapping, tf32: bool) -> tuple[int, str | None]:
    """FLOPs of a product (2 per multiply-accumulate) and the kind of its peak; (0, None) otherwise."""
    if node.op_type not in MAC_OPS and node.op_type not in ATTENTION_OPS:
        return 0, None
    if node.op_type in MAC_OPS and normalize_domain(node.domain) == "":
        macs = macs_of(node, shapes)
    elif node.op_type in ATTENTION_OPS and node.domain == "com.microsoft":
        macs = _attention_macs(node, shapes)
    else:
        return 0, None
    if not macs:
        return 0, None
    elem = shapes.get(node.input[0], (None, None))[0] if node.input else None
    kind = (KIND_OF_TYPE.get(elem) if elem is not None else None) or (
        "tf32" if tf32 and elem == FLOAT else "fp32" if elem == FLOAT else "fp16"
    )
    return 2 * macs, kind


def _attention_macs(node, shapes: Mapping) -> int | None:
    """QK' and PV of a fused attention ([batch, sequence, hidden] query; the key's sequence where it
    is given), plus the QKV projection of com.microsoft Attention (weights [hidden, 3 * hidden])."""
    q = shapes.get(node.input[0], (None, None))[1] if node.input else None
    if q is None or len(q) != 3:
        return None
    batch, seq, hidden = q
    kv = seq
    if node.op_type != "Attention" and len(node.input) > 1 and node.input[1]:
        k = shapes.get(node.input[1], (None, None))[1]
        if k is not None and len(k) == 3:
            kv = k[1]
    macs = 2 * batch * seq * kv * hidden
    if node.op_type == "Attention" and len(node.input) > 1:
        w = shapes.get(node.input[1], (None, None))[1]
        if w is None or len(w) != 2:
            return None
        macs += batch * seq * w[0] * w[1]
    return macs
