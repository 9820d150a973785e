"""Stage: report. The estimated GPU latency of a model before and after its conversion, and of each
fp32 island, from the roofline model (autocast_onnx/roofline), without a GPU.

The fp32 model is priced as the graph was read (its nodes as the index holds them, before the
rewrite), the conversion as written (the converted nodes, each tensor at its new type). ONNX
Runtime's CUDA fusions (plan/fusions.py) count as one kernel in the fp32 model, and in the
conversion where the plan leaves the pattern whole (no Cast splits it). What it ignores is said
with every figure (assumptions())."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .. import roofline
from ..graph.shapes import LIMIT_NODES
from ..plan import fusions


def assumptions() -> str:
    """What every estimate assumes and ignores, with the table's constants."""
    t = roofline.table()
    return (
        f"a roofline estimate (each kernel max(FLOPs/peak, bytes/bandwidth) at {t.compute_efficiency:g} of the "
        f"tensor-core peak and {t.bandwidth_efficiency:g} of the bandwidth, and at least {t.launch_s * 1e6:g} us, the "
        "dispatch of one kernel, fitted on recorded H200 figures; fp32 products as TF32); it ignores caches, kernel "
        "choice, the attention fusions and layout transposes the runtime adds, and CPU fallbacks"
    )


@dataclass(frozen=True)
class _NodeView:
    """A main-graph node as the index read it: what the roofline model reads of a NodeProto."""

    op_type: str
    domain: str
    input: tuple
    output: tuple
    attribute: object


@dataclass(frozen=True)
class SpeedSource:
    """What pricing needs of the model as read, kept by the conversion (for at most LIMIT_NODES nodes)."""

    nodes: tuple  # _NodeView per main-graph node, in order
    outputs: tuple  # the main graph's output names
    groups: tuple  # (first outputs of a fusion's nodes, whether the plan leaves it whole)
    written: dict  # node id (the plan's) -> the names of its outputs, main-graph nodes


def speed_source(index, precisions) -> SpeedSource:
    """The SpeedSource of an index about to be rewritten by a plan with these node precisions."""
    main = index.main
    views = tuple(
        _NodeView(
            n.op,
            n.domain,
            tuple(v.name if v is not None else "" for v in n.inputs),
            tuple(v.name if v is not None else "" for v in n.outputs),
            n.proto.attribute,
        )
        for n in main.nodes
    )
    groups = []
    for instance in fusions.find(index):
        if any(n.scope is not main for n in instance.nodes) or instance.split:
            continue
        names = tuple(n.outputs[0].name for n in instance.nodes if n.outputs and n.outputs[0] is not None)
        whole = len({str(precisions[n.id]) for n in instance.nodes}) == 1
        groups.append((names, whole))
    written = {n.id: tuple(v.name for v in n.outputs if v is not None) for n in main.nodes}
    return SpeedSource(views, tuple(v.name for v in main.outputs if v is not None), tuple(groups), written)


class _Converted(Mapping):
    """tensor name -> (elem type, dims) of the converted main graph: the types it declares (value_info,
    inputs, outputs, initializers, Cast targets) over the dims of the model as read."""

    def __init__(self, graph, before: Mapping):
        self.before = before
        self.types: dict = {}
        self.dims: dict = {}
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
        for t in graph.initializer:
            self.types[t.name], self.dims[t.name] = t.data_type, tuple(t.dims)
        for node in graph.node:
            if node.op_type == "Cast" and node.input and node.output:
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                self.types[node.output[0]] = to
                self.dims[node.output[0]] = self._dims(node.input[0])

    def _dims(self, name: str):
        if name in self.dims:
            return self.dims[name]
        return self.before.get(name, (None, None))[1]

    def __getitem__(self, name: str) -> tuple:
        return self.get(name, (None, None))

    def get(self, name, default=None):
        elem = self.types.get(name)
        dims = self.dims.get(name)
        if elem is None or dims is None:
            known = self.before.get(name)
            if known is None:
                return default if elem is None else (elem, dims)
            elem = known[0] if elem is None else elem
            dims = known[1] if dims is None else dims
        return elem, dims

    def __iter__(self):
        return iter(set(self.types) | set(self.before))

    def __len__(self) -> int:
        return len(set(self.types) | set(self.before))


def _estimates(result, gpu_name: str | None):
    """(SpeedSource, fp32 Estimate, converted Estimate) of a ConversionResult, or None without shapes."""
    source_of, shapes = getattr(result, "speed_source_of", None), result.shapes
    if source_of is None or shapes is None:
        return None
    source = source_of()
    gpu = roofline.gpu(gpu_name)
    before = roofline.estimate(source.nodes, source.outputs, gpu, shapes, [g for g, _ in source.groups])
    graph = result._model.graph  # the graph's structure only: no held payload is read
    after = roofline.estimate(
        graph.node, [o.name for o in graph.output], gpu, _Converted(graph, shapes), [g for g, w in source.groups if w]
    )
    return source, before, after


def island_costs(result, gpu_name: str | None = None) -> dict:
    """{island number: {"us": 41.2, "cast_us": 9.8, "share": 0.07}}: the estimated time of each fp32 island's
    kernels in the conversion and of the Casts at its edges, and their share of the converted model's time;
    empty without shapes."""
    got = _estimates(result, gpu_name)
    if got is None:
        return {}
    source, _, after = got
    graph = result._model.graph
    position = {node.output[0]: i for i, node in enumerate(graph.node) if node.output}
    cast_reading: dict[str, list[int]] = {}  # tensor -> the Casts that read it (one scan of the graph)
    for j, node in enumerate(graph.node):
        if node.op_type == "Cast" and node.input and node.output:
            cast_reading.setdefault(node.input[0], []).append(j)
    total = after.seconds
    out = {}
    for island in result.plan.islands:
        names = {name for i in island.nodes for name in source.written.get(i, ())}
        own = {position[name] for name in names if name in position}
        read = {name for j in own for name in graph.node[j].input}
        casts = {j for name in names for j in cast_reading.get(name, ())}  # Casts of its outputs
        casts |= {position[n] for n in read if n in position and graph.node[position[n]].op_type == "Cast"}
        us = after.seconds_of_nodes(own | casts) * 1e6
        cast_us = after.seconds_of_nodes(casts) * 1e6
        out[island.number] = {"us": us, "cast_us": cast_us, "share": us / (total * 1e6) if total else 0.0}
    return out


def speed(result, gpu_name: str | None = None) -> dict:
    """{"computed": True, "gpu": "H100", "fp32_ms": 4.1, "converted_ms": 2.2, "speedup": 1.86, "cast_ms": 0.07,
    ...}: the estimate for `result` (a ConversionResult), or {"computed": False, "why": ...}."""
    got = _estimates(result, gpu_name)
    if got is None:
        return {"computed": False, "why": f"over {LIMIT_NODES:,} nodes: no shapes were inferred"}
    _, before, after = got
    gpu = before.gpu
    fp32, converted = before.seconds, after.seconds
    return {
        "computed": True,
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "fp32_ms": fp32 * 1e3,
        "converted_ms": converted * 1e3,
        "speedup": fp32 / converted if converted else None,
        "cast_ms": after.seconds_of("Cast") * 1e3,
        "kernels": {"fp32": len(before.kernels), "converted": len(after.kernels)},
        "unpriced_kernels": {"fp32": before.unpriced, "converted": after.unpriced},
        "open_dims": dict(getattr(result.shapes, "open_dims", {})),
        "assumptions": assumptions(),
    }


def speed_line(s: dict) -> str:
    """'estimated on H100 (NVIDIA H100 SXM5 80 GB) at batch=3, sequence=16: fp32 0.42 ms, converted 0.43 ms (0.98x);
    Casts 2% of it; ...'."""
    if not s["computed"]:
        return f"estimated GPU latency: not computed ({s['why']})"
    at = ", ".join(f"{k}={v}" for k, v in s["open_dims"].items())
    share = s["cast_ms"] / s["converted_ms"] if s["converted_ms"] else 0.0
    unpriced = sum(s["unpriced_kernels"].values())
    note = f"; {unpriced} kernel(s) of unknown size priced at their launch" if unpriced else ""
    speedup = f"{s['speedup']:.2f}x" if s["speedup"] else "-"
    return (
        f"estimated on {s['gpu']} ({s['gpu_name']}){' at ' + at if at else ''}: fp32 {s['fp32_ms']:.3g} ms, "
        f"converted {s['converted_ms']:.3g} ms ({speedup}); Casts {share:.0%} of it "
        f"({s['kernels']['fp32']} -> {s['kernels']['converted']} kernels){note}; an estimate, not a measurement: "
        f"{s['assumptions']} (--gpu picks another GPU)"
    )
