"""Stage: validate / error attribution (`autocast-onnx diagnose`). Where does a converted model's
error come from, when no tensor leaves the fp16 range?

One pass over the reference (fp32) model R and the emulation E of the converted model C (see
emulate.py), on the same batch. For every node of R that C keeps (matched by name and op type):

  introduced  the error the node makes itself: the node computed as C computes it (inputs
              rounded to fp16 where C feeds them fp16, output rounded where C produces fp16)
              from the *exact* fp32 inputs, against its fp32 output;
              (and again with its inputs left exact: when that is much smaller, the rounding of
              its inputs is what hurts, and its producers belong with it);
  received    the error already in its inputs in E's full run;
  produced    the error of its outputs in E's full run (so produced / received is how much the
              node amplifies what it receives).

Errors are relative L2 errors, ||x - ref|| / ||ref||, over the batch. Per graph output, the
nodes it depends on are ranked by the error they introduce: the node at the top is where
rounding hurts most, and the depth profile (the largest produced error at each graph depth)
shows where the error is born and how it grows. A node with If/Loop/Scan bodies counts as one
unit: its introduced error is estimated as produced minus received.

Memory stays bounded: tensors are captured GROUP at a time (as calibration does), and the
"local" model that recomputes nodes from exact inputs is built for GROUP nodes at a time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ..dtypes import BFLOAT16, FLOAT, FLOAT16, MIXABLE, dtype_name
from ..errors import AutocastError
from ..graph import NONTENSOR, build_index
from ..io import ModelArgument, model_argument
from . import runner
from .emulate import emulation_model, session_as_is
from .reports import JsonReport

GROUP = 96
LOW = (FLOAT16, BFLOAT16)
TINY = 1e-30


@dataclass
class NodeError:
    name: str
    op_type: str
    precision: str  # as the converted model computes it
    depth: int
    introduced: float = 0.0
    exact_inputs: float = 0.0  # the same with the node's inputs left exact (only its own result rounded)
    received: float = 0.0
    produced: float = 0.0
    category: str | None = None
    reason: str | None = None
    outputs: list = field(default_factory=list)  # the graph outputs that depend on this node

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "precision": self.precision,
            "depth": self.depth,
            "introduced": self.introduced,
            "introduced_exact_inputs": self.exact_inputs,
            "received": self.received,
            "produced": self.produced,
            "amplification": (self.produced / self.received) if self.received > 0 else None,
            "category": self.category,
            "reason": self.reason,
            "outputs": self.outputs,
        }


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref|| / ||ref|| in float64; inf when got is not finite where ref is."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    finite = np.isfinite(ref)
    if not np.isfinite(got[finite]).all():
        return float("inf")
    diff = np.where(finite, got - ref, 0.0)
    norm = float(np.linalg.norm(np.where(finite, ref, 0.0)))
    err = float(np.linalg.norm(diff))
    return err / norm if norm > TINY else err


def _capture(
    model: onnx.ModelProto, names: list[str], types: dict, batch: dict, device: str, containers: dict | None = None
) -> dict:
    """name -> array for `names` (tensors of `model`; a list of arrays for a sequence named in
    `containers`, name -> TypeProto), GROUP tensors per session."""
    out: dict[str, np.ndarray] = {}
    feeds = {i.name: batch[i.name] for i in model.graph.input if i.name in batch}
    for start in range(0, len(names), GROUP):
        group = names[start : start + GROUP]
        sess = runner.session(_with_outputs(model, group, types, containers or {}), device)
        # a converted model's low-precision inputs take the batch in their own type
        given = {spec.name for spec in sess.get_inputs() if spec.name in feeds}
        out.update(zip(group, runner.run(sess, {**feeds, **runner.feeds_for_some(sess, feeds, given)})))
        del sess
    return out


def _with_outputs(model: onnx.ModelProto, names: list[str], types: dict, containers: dict) -> bytes:
    """runner.with_outputs, where a name in `containers` (a sequence or optional) keeps its own
    type rather than being declared a tensor."""
    tensors = [n for n in names if n not in containers]
    if len(tensors) == len(names):
        return runner.with_outputs(model, names, types)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(_value_info(n, types, containers) for n in names)
    return probe.SerializeToString()


def _value_info(name: str, types: dict, containers: dict) -> onnx.ValueInfoProto:
    """A graph input or output declaration: a container with its TypeProto, else a tensor."""
    if name in containers:
        return helper.make_value_info(name, containers[name])
    return helper.make_tensor_value_info(name, types[name], None)


def _container_types(model: onnx.ModelProto, index) -> dict:
    """name -> TypeProto of every main-graph value of `model` that is not a tensor (a sequence, an
    optional): as declared, else from ONNX's type inference. One whose type neither gives is left
    out (the nodes that read it are not recomputed)."""
    wanted = {v.name for v in index.main.values.values() if v.dtype == NONTENSOR}
    if not wanted:
        return {}

    def found(graph) -> dict:
        infos = (*graph.input, *graph.value_info, *graph.output)
        return {vi.name: vi.type for vi in infos if vi.name in wanted and vi.type.WhichOneof("value") != "tensor_type"}

    out = found(model.graph)
    if wanted - out.keys():
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except (onnx.shape_inference.InferenceError, ValueError):  # ValueError: over protobuf's 2 GB
            return out
        out = found(inferred.graph) | out
    return out


def _local_model(
    ref: onnx.ModelProto, nodes: list, low_in: dict, low_out: dict, types: dict, opsets, containers=None
) -> tuple:
    """A model that recomputes `nodes` (NodeProtos of R) from graph inputs holding R's exact
    tensors, rounding inputs and outputs where the converted model holds them in low precision.
    A sequence or optional input keeps its type (`containers`: name -> TypeProto).
    Returns (model, {node name: [(R output name, local output name)]}, [input names])."""
    inputs: dict[str, int] = {}
    body: list = []
    results: dict[str, list] = {}
    for k, node in enumerate(nodes):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.input[:]
        del new.output[:]
        before, after, outs = [], [], []
        for port, name in enumerate(node.input):
            if name:
                inputs.setdefault(name, types[name])
            low = low_in.get((node.name, port)) if name else None
            if low is None:
                new.input.append(name)
                continue
            rounded, wide = f"__dx{k}_in{port}_low", f"__dx{k}_in{port}"
            before.append(helper.make_node("Cast", [name], [rounded], to=low))
            before.append(helper.make_node("Cast", [rounded], [wide], to=FLOAT))
            new.input.append(wide)
        for port, name in enumerate(node.output):
            if not name:
                new.output.append("")
                continue
            raw = f"__dx{k}_out{port}"
            new.output.append(raw)
            if types.get(name) not in MIXABLE:
                continue
            low = low_out.get((node.name, port))
            if low is None:
                outs.append((name, raw))
                continue
            rounded, final = f"{raw}_low", f"{raw}_final"
            after.append(helper.make_node("Cast", [raw], [rounded], to=low))
            after.append(helper.make_node("Cast", [rounded], [final], to=FLOAT))
            outs.append((name, final))
        body.extend([*before, new, *after])
        results[node.name] = outs
    graph_inputs = [_value_info(n, types, containers or {}) for n in inputs]
    graph_outputs = [
        helper.make_tensor_value_info(local, FLOAT, None) for outs in results.values() for _, local in outs
    ]
    graph = helper.make_graph(body, "local", graph_inputs, graph_outputs)
    model = helper.make_model(graph, opset_imports=list(opsets), ir_version=ref.ir_version)
    return model, results, list(inputs)


def diagnose(
    reference, converted, *, batch: dict, device: str = "cpu", plan=None, top: int = 10, where: str | None = None
) -> dict:
    """Error attribution of `converted` (a ModelProto, read from the file `where` if given) against
    `reference` (its fp32 source) on one `batch` (input name -> array). `plan` (a PrecisionPlan of
    the reference) adds categories and reasons. Returns the report: per node errors, per output
    rankings and depth profiles. A converted model that ONNX Runtime refuses is refused (as
    validate refuses it): its emulation would load, and attribute errors to a model that cannot run.

    The stages: index both models and build the emulation, find each node's depth and the outputs
    it feeds, capture every float tensor of both full runs, measure each node's received and
    produced error, recompute the low-precision nodes from exact inputs (introduced error), rank."""
    session_as_is(converted, where, device)
    ref_index = build_index(onnx.ModelProto.FromString(reference.SerializeToString()), "<reference>")
    conv_index = build_index(onnx.ModelProto.FromString(converted.SerializeToString()), "<converted>")
    emulated = emulation_model(converted, "<converted>")
    ref_types = {v.name: v.dtype for v in ref_index.main.values.values()}
    containers = _container_types(reference, ref_index)
    emu_types = {v.name: v.dtype for v in build_index(emulated, "<emulated>").main.values.values()}
    outputs = [v.name for v in ref_index.main.outputs if v.dtype in MIXABLE]
    shape = _GraphShape(_depths(ref_index), outputs, _ancestors(ref_index, outputs))
    plan_nodes = {entry.name: entry for entry in plan.nodes if entry.graph == "main"} if plan is not None else {}
    # tensors to compare: every float tensor of R that E also holds as fp32
    float_names = [n for n, t in ref_types.items() if t in MIXABLE and emu_types.get(n) == FLOAT]
    node_tensors = [n for n in float_names if ref_index.main.values[n].kind == "node"]
    ref_values = _capture(reference, node_tensors, ref_types, batch, device)
    ref_values.update(_graph_inputs(ref_index, float_names, batch))
    emu_values = _capture(emulated, node_tensors, emu_types, batch, device)
    tensor_error = {n: relative_error(emu_values[n], ref_values[n]) for n in emu_values}
    conv_nodes = {(n.name, n.op): n for n in conv_index.main.nodes if n.name}
    errors, local = _node_errors(ref_index, conv_nodes, shape, plan_nodes, tensor_error, containers)
    if ref_index.main.nodes and not errors:
        raise AutocastError(
            "no node of the converted model matches a node of the reference by name and op type",
            "diagnose",
            "pass the fp32 model CONVERTED was converted from, as REFERENCE",
        )
    recompute = _Recompute(reference, ref_types, containers, batch, device, ref_values)
    _introduced(recompute, local, errors)
    return _report(errors, outputs, tensor_error, top)


@dataclass(frozen=True)
class _GraphShape:
    """Where each node sits in the reference: its depth, and the float graph outputs it feeds."""

    depth: dict  # node name -> longest path from the inputs
    outputs: list  # the float graph outputs
    ancestors: dict  # graph output -> the names of the nodes it depends on


@dataclass
class _Local:
    """The nodes to recompute from exact inputs, and the ports the converted model runs low."""

    nodes: list = field(default_factory=list)
    low_in: dict = field(default_factory=dict)  # (node name, input port) -> low type
    low_out: dict = field(default_factory=dict)  # (node name, output port) -> low type


@dataclass(frozen=True)
class _Recompute:
    """What recomputing nodes from the reference's exact tensors needs; `values` (tensor name ->
    the reference's value) grows as more tensors are captured."""

    reference: onnx.ModelProto
    types: dict
    containers: dict
    batch: dict
    device: str
    values: dict


def _depths(index) -> dict:
    """node name -> depth (the longest path from the inputs)."""
    depth: dict[str, int] = {}
    for node in index.main.order or index.main.nodes:
        d = 0
        for value in node.inputs:
            if value is not None and value.producer is not None:
                d = max(d, depth.get(value.producer.name, 0) + 1)
        depth[node.name] = d
    return depth


def _ancestors(index, outputs: list) -> dict:
    """graph output -> the names of the nodes it depends on."""
    ancestors: dict[str, set] = {}
    for out in outputs:
        seen: set = set()
        stack = [index.main.values[out].producer]
        while stack:
            node = stack.pop()
            if node is None or node.name in seen:
                continue
            seen.add(node.name)
            stack.extend(v.producer for v in node.inputs if v is not None)
        ancestors[out] = seen
    return ancestors


def _graph_inputs(index, float_names: list, batch: dict) -> dict:
    """The reference's values of the float graph inputs (from the batch) and initializers."""
    values = {}
    for name in float_names:
        if index.main.values[name].kind == "input" and name in batch:
            values[name] = batch[name]
        elif index.main.values[name].kind == "initializer":
            init = index.main.values[name].initializer
            values[name] = onnx.numpy_helper.to_array(init)
    return values


def _node_errors(ref_index, conv_nodes: dict, shape: _GraphShape, plan_nodes: dict, tensor_error: dict, containers):
    """(node name -> NodeError for every reference node the converted model keeps, with its
    received and produced error; the low-precision nodes to recompute from exact inputs)."""
    errors: dict[str, NodeError] = {}
    local = _Local()
    for node in ref_index.main.nodes:
        conv = conv_nodes.get((node.name, node.op))
        if not node.name or conv is None:
            continue
        in_types = [v.dtype if v is not None else None for v in conv.inputs]
        out_types = [v.dtype if v is not None else None for v in conv.outputs]
        low = next((t for t in in_types + out_types if t in LOW), None)
        entry = _node_entry(node, low, shape, plan_nodes.get(node.name), tensor_error)
        errors[node.name] = entry
        if low is None:
            continue  # fp32 from its inputs: it adds no rounding of its own
        if node.subscopes or any(
            v is not None and v.dtype == NONTENSOR and v.name not in containers for v in node.inputs
        ):  # a unit of its own, or it reads a container of unknown type: estimated from its tensors
            entry.introduced = max(0.0, entry.produced - entry.received)
            continue
        for port, t in enumerate(in_types):
            if t in LOW:
                local.low_in[(node.name, port)] = t
        for port, t in enumerate(out_types):
            if t in LOW:
                local.low_out[(node.name, port)] = t
        local.nodes.append(node)
    return errors, local


def _node_entry(node, low, shape: _GraphShape, planned, tensor_error: dict) -> NodeError:
    """One node's NodeError: its precision, depth, received and produced error, the outputs it
    feeds, and its category and reason from the plan."""
    precision = dtype_name(low) if low is not None else "fp32"
    entry = NodeError(node.name, node.op, precision, shape.depth.get(node.name, 0))
    entry.received = max(
        (tensor_error.get(v.name, 0.0) for v in node.inputs if v is not None and v.dtype in MIXABLE), default=0.0
    )
    entry.produced = max(
        (tensor_error.get(v.name, 0.0) for v in node.outputs if v is not None and v.dtype in MIXABLE),
        default=0.0,
    )
    entry.outputs = [o for o in shape.outputs if node.name in shape.ancestors[o]]
    if planned is not None:
        entry.category = planned.category
        entry.reason = planned.reasons[-1].text() if planned.reasons else None
    return entry


def _introduced(recompute: _Recompute, local: _Local, errors: dict) -> None:
    """Fill in the introduced error of the `local` nodes, GROUP at a time: each node recomputed
    twice, as the converted model computes it, and with its inputs left exact (what keeping its
    producers fp32 would give): a large gap means its inputs' rounding hurts."""
    opsets = [helper.make_opsetid(o.domain, o.version) for o in recompute.reference.opset_import]
    for start in range(0, len(local.nodes), GROUP):
        group = local.nodes[start : start + GROUP]
        for inputs_rounded in (True, False):
            low_in = local.low_in if inputs_rounded else {}
            found = _recompute_group(recompute, group, low_in, local.low_out, opsets)
            for name, error in found.items():
                if inputs_rounded:
                    errors[name].introduced = error
                else:
                    errors[name].exact_inputs = error


def _recompute_group(recompute: _Recompute, group: list, low_in: dict, low_out: dict, opsets: list) -> dict:
    """node name -> the largest relative error of its outputs, the nodes of `group` computed from
    the reference's exact tensors with the given ports rounded."""
    r = recompute
    model, results, needed = _local_model(
        r.reference, [n.proto for n in group], low_in, low_out, r.types, opsets, r.containers
    )
    r.values.update({n: r.batch[n] for n in needed if n not in r.values and n in r.batch})
    missing = [n for n in needed if n not in r.values]
    if missing:
        r.values.update(_capture(r.reference, missing, r.types, r.batch, r.device, r.containers))
    sess = runner.session(model.SerializeToString(), r.device, optimize=False)
    # a sequence is fed as its list of arrays
    feeds = {n: v if isinstance(v, list) else np.asarray(v) for n in needed for v in (r.values[n],)}
    got = dict(zip([o.name for o in model.graph.output], runner.run(sess, feeds)))
    out = {}
    for node in group:
        errs = [relative_error(got[local], r.values[ref]) for ref, local in results[node.name] if ref in r.values]
        out[node.name] = max(errs, default=0.0)
    del sess
    return out


def _report(errors: dict, outputs: list, tensor_error: dict, top: int) -> dict:
    """Per output, the nodes it depends on ranked by the error they introduce, and its depth
    profile (the largest produced error at each depth); every node's errors."""
    ranking = {}
    profile = {}
    for out in outputs:
        related = [e for e in errors.values() if out in e.outputs]
        related.sort(key=lambda e: (-e.introduced, e.depth))
        ranking[out] = [e.name for e in related]
        by_depth: dict[int, float] = {}
        for e in related:
            by_depth[e.depth] = max(by_depth.get(e.depth, 0.0), e.produced)
        profile[out] = sorted(by_depth.items())
    return {
        "kind": "diagnose",
        "outputs": {o: {"error": tensor_error.get(o, 0.0), "ranking": ranking[o][:top]} for o in outputs},
        "nodes": [e.to_dict() for e in sorted(errors.values(), key=lambda e: e.depth)],
        "profiles": {o: [[d, v] for d, v in profile[o]] for o in outputs},
        "top": top,
    }


@dataclass(frozen=True)
class DiagnoseReport(JsonReport):
    """What `diagnose` found: per graph output its error and the nodes ranked by the error they
    introduce (`outputs`), every node's errors (`nodes`), the depth profiles; also a read-only
    mapping over the JSON report (`--report-json`), which `text()` and `html()` format as the
    command line does."""

    @property
    def outputs(self) -> dict:
        """output name -> {"error": its relative error, "ranking": the top node names}."""
        return self.data["outputs"]

    @property
    def nodes(self) -> list[dict]:
        return self.data["nodes"]

    def text(self) -> str:
        """The report as the CLI prints it."""
        from ..report.diagnose import diagnose_text

        return diagnose_text(self.data)

    def html(self) -> str:
        """The self-contained HTML page of `--report-html`."""
        from ..report.diagnose import diagnose_html

        return diagnose_html(self.data)

    def __repr__(self) -> str:
        outs = "; ".join(
            f"{name}: error {info['error']:.3g}" + (f", worst {info['ranking'][0]}" if info["ranking"] else "")
            for name, info in self.outputs.items()
        )
        return (
            f"DiagnoseReport({self.data.get('converted', '<converted>')} against "
            f"{self.data.get('reference', '<reference>')}: {outs or 'no float output'}; {len(self.nodes)} node(s))"
        )


def diagnose_files(reference, converted, *, inputs=None, dims=None, ranges=None, seed: int = 0, plan=None,
                   top: int = 10) -> DiagnoseReport:  # fmt: skip
    """`autocast-onnx diagnose`: attribution of CONVERTED's error against REFERENCE on one batch:
    the first batch of `inputs` (an .npz or Polygraphy .json file, or a folder), else one generated from `dims`,
    `ranges` and `seed` as validate does. Each model is a path or an onnx.ModelProto (read, never
    edited); `converted` may also be the ConversionResult convert gave. `plan` (a plan file or
    PrecisionPlan of REFERENCE) gives categories and reasons; without it they come from the default
    rules. Returns a DiagnoseReport."""
    from ..pipeline import plan_model
    from ..plan import PrecisionPlan
    from .inputs import check_batches, describe_inputs, generate, load_batches, plan_inputs

    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise AutocastError(f"--top must be a whole number >= 1, not {top!r}", "--top", "e.g. --top 10")
    reference = model_argument(reference, "reference")
    converted = model_argument(converted, "converted", result=True)
    ref, conv = _checked(reference, "reference"), _checked(converted, "converted")
    specs = describe_inputs(ref)
    if inputs is not None:
        check_batches(inputs, specs)
        batch = load_batches(inputs, specs)[0]
    else:
        batch = generate(plan_inputs(specs, dims or {}, ranges or {}), seed=seed)
    if plan is None:
        plan = plan_model(ref).plan  # the plan only: no conversion
        reasons = "default rules"
    else:
        plan = plan if isinstance(plan, PrecisionPlan) else PrecisionPlan.load(plan)
        reasons = plan.source or "plan"
    report = diagnose(ref, conv, batch=batch, plan=plan, top=top, where=_shown(converted, None))
    report.update(
        reference=_shown(reference, "<reference>"), converted=_shown(converted, "<converted>"), reasons_from=reasons
    )
    return DiagnoseReport(report)


def _checked(model: ModelArgument, name: str) -> onnx.ModelProto:
    """The model diagnose works on, loaded and checked as convert loads one (pipeline.load_argument): a
    path read and checked, a ModelProto checked on a copy (the caller's is never edited); an
    in-memory model's defect is named as `<name>`."""
    from ..pipeline import load_argument

    try:
        return load_argument(model, True).model
    except AutocastError as exc:
        if isinstance(model, onnx.ModelProto) and exc.where == "<model>":
            raise AutocastError(exc.what, f"<{name}>", exc.hint) from None
        raise


def _shown(model: ModelArgument, in_memory: str | None) -> str | None:
    """How the report names a model: its path as given, or `in_memory` for a ModelProto."""
    return in_memory if isinstance(model, onnx.ModelProto) else os.fspath(model)
