"""The node patterns ONNX Runtime's graph optimizer fuses into one kernel for its CUDA provider,
found in a model with the Casts that sit between their nodes.

A Cast between two nodes of such a pattern splits it: the optimizer's matcher wants each node to
read the previous one's output directly (and, for most, one type across the pattern), so the
pattern runs as separate kernels with the Cast's read and write between them. Each pattern names
the optimizer source that fuses it (onnxruntime/core/optimizer/, registered for the CUDA provider
in graph_transformer_utils.cc, ONNX Runtime 577eac9). LayerNormFusion and
SimplifiedLayerNormFusion match through Casts and are not listed.

`find(index)` returns every instance; the plan's fusion step (paint.py) gives each instance one
precision, lint's AC305 reports the Casts that split one, and the benchmarks count them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import AutocastError
from ..graph import GraphIndex

SOURCE = "onnxruntime/core/optimizer/{}, ONNX Runtime 577eac9"


@dataclass(frozen=True)
class Pattern:
    name: str  # the fused kernel
    chain: tuple[tuple[str, ...], ...]  # op types (any domain), producer first; alternatives per step
    source: str  # the optimizer file
    shared: bool = False  # whether the first node's output may have other readers (SkipLayerNorm's sum)
    scalar: int = -1  # chain position whose other input must be a scalar constant (MatMulScale)

    @property
    def cite(self) -> str:
        return SOURCE.format(self.source)


PATTERNS = (
    Pattern("SkipLayerNormalization", (("Add",), ("LayerNormalization",)), "skip_layer_norm_fusion.cc", shared=True),
    Pattern(
        "SkipSimplifiedLayerNormalization",
        (("Add",), ("SimplifiedLayerNormalization", "RMSNormalization")),
        "skip_layer_norm_fusion.cc",
        shared=True,
    ),
    Pattern("Gelu", (("Div",), ("Erf",), ("Add",), ("Mul",)), "gelu_fusion.cc"),
    Pattern("FastGelu", (("Mul",), ("Tanh",), ("Add",), ("Mul",)), "fast_gelu_fusion.cc"),
    Pattern("BiasGelu", (("Add",), ("Gelu", "FastGelu")), "bias_gelu_fusion.cc"),
    Pattern("BiasSoftmax", (("Add",), ("Softmax",)), "bias_softmax_fusion.cc"),
    Pattern("FusedMatMul", (("MatMul",), ("Mul", "Div")), "matmul_scale_fusion.cc", scalar=1),
    Pattern("Gemm", (("MatMul",), ("Add",)), "matmul_add_fusion.cc"),
    Pattern("Conv+BatchNormalization", (("Conv",), ("BatchNormalization",)), "conv_bn_fusion.cc"),
)


@dataclass(frozen=True)
class Instance:
    pattern: Pattern
    nodes: tuple  # graph Nodes, producer first
    casts: tuple  # the Cast nodes between them, in order

    @property
    def split(self) -> bool:
        return bool(self.casts)

    def text(self) -> str:
        return " -> ".join(f"{n.op} {n.label}" for n in self.nodes)


def _is_cast(node) -> bool:
    return node.op in ("Cast", "CastLike") and node.domain == ""


def _scalar_constant(node, skip) -> bool:
    """Whether `node` (Mul or Div) reads a one-element constant beside the tensor `skip`."""
    from .classify import constant_array, is_constant

    others = [v for v in node.inputs if v is not None and v is not skip]
    if len(others) != 1 or not is_constant(others[0]):
        return False
    tensor = others[0].initializer
    if tensor is not None:
        return math.prod(tensor.dims) == 1
    try:
        array = constant_array(others[0])
    except (AutocastError, ValueError):
        return False
    return array is not None and array.size == 1


def _readers(value, casts: tuple):
    """(reader, the value it reads, casts on the way) of `value`, looking through Casts."""
    for consumer, _port in value.consumers:
        if _is_cast(consumer):
            for out in consumer.outputs:
                if out is not None:
                    yield from _readers(out, (*casts, consumer))
        else:
            yield consumer, value, casts


def _extend(pattern: Pattern, nodes: tuple, casts: tuple):
    step = len(nodes)
    if step == len(pattern.chain):
        yield Instance(pattern, nodes, casts)
        return
    last = nodes[-1]
    outs = [v for v in last.outputs if v is not None]
    if not outs:
        return
    main = outs[0]
    if step > 1 or not pattern.shared:
        direct = [c for c, _ in main.consumers]
        if len(direct) != 1 or main.graph_outputs:
            return  # the intermediate has other readers: the optimizer leaves it unfused
    for reader, via, between in _readers(main, ()):
        if reader.op not in pattern.chain[step]:
            continue
        if pattern.scalar == step and not _scalar_constant(reader, via):
            continue
        yield from _extend(pattern, (*nodes, reader), casts + between)


def find(index: GraphIndex, patterns: tuple = PATTERNS) -> list[Instance]:
    """Every instance of the patterns in the index's graphs, split or whole."""
    found = []
    for pattern in patterns:
        for node in index.nodes:
            if node.op in pattern.chain[0]:
                found.extend(_extend(pattern, (node,), ()))
    return found


def counts(instances: list[Instance]) -> dict:
    """{pattern name: [whole, split]}."""
    out: dict = {}
    for inst in instances:
        row = out.setdefault(inst.pattern.name, [0, 0])
        row[1 if inst.split else 0] += 1
    return dict(sorted(out.items()))
