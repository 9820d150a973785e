"""Check the kernel tables against ONNX Runtime's CUDA provider itself (issue 30, item 5): convert models at
fp16 and bf16, with and without --runtime cuda, run each converted model once on the CUDA execution provider
with profiling, and compare where each low-precision node ran with what data/kernels_cuda.json predicts.

    python tools/gpu_placement.py [MODEL ...] [--json OUT.json] [--speed]

A node's prediction comes from catalog/kernels.has_kernel for every fp16/bf16 type among its inputs and outputs:
"kernel" (the table has one for each), "none" (the table has none for one of them: the node should land on the
CPU provider), "unknown" (the table cannot tell). A node's placement is the provider named by its profiling
event. The mismatches are printed one per line; the exit code is 1 when a "kernel" node ran on the CPU or a
"none" node ran on CUDA. ONNX Runtime's graph optimizations are off for the placement run, so each event names a
node of the file. With --speed each converted model is also validated on CUDA (accuracy and latency against
the fp32 model, autocast_onnx.validate with device="cuda").

Without the CUDA provider the script says so and exits 2: placement means nothing on the CPU provider alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import autocast_onnx  # noqa: E402
from autocast_onnx.catalog.kernels import has_kernel, runtime_label, split_tie  # noqa: E402
from autocast_onnx.graph import signatures  # noqa: E402
from autocast_onnx.graph.index import GraphIndex  # noqa: E402
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs  # noqa: E402

LOW = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.BFLOAT16: "bf16"}
DEFAULT_MODELS = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples" / "models").glob("*.onnx")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "data" / "decoders").glob("*.onnx")),
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "data" / "evidence").glob("*.onnx")),
]
VARIANTS = [("fp16", "any"), ("fp16", "cuda"), ("bf16", "any"), ("bf16", "cuda")]
# the same at opset 22 (--opset 22: the version converter first), where registrations of older schema versions
# no longer match and bf16 Conv exists; for the example models, whose exports are at 17
OPSET_VARIANTS = [("fp16", "any", 22), ("fp16", "cuda", 22), ("bf16", "cuda", 22)]


def named(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with a name on every node of the main graph (profiling events are keyed by node name)."""
    seen = set()
    for k, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{k}"
        seen.add(node.name)
    return model


def predictions(model: onnx.ModelProto) -> dict[str, tuple[str, str, str]]:
    """{node name: (op, low types, "kernel" | "none" | "unknown")} for each main-graph node with an fp16/bf16
    input or output, as the shipped CUDA table answers."""
    index = GraphIndex(model)
    out = {}
    for node in index.nodes:
        if node.scope is not index.main:
            continue
        types = sorted({v.dtype for v in list(node.inputs) + list(node.outputs) if v is not None and v.dtype in LOW})
        if not types:
            continue
        opset = index.opset(node.domain)
        answers = [has_kernel("cuda", node.domain, node.op, opset, t) if opset else None for t in types]
        verdict = "none" if False in answers else "kernel" if all(a is True for a in answers) else "unknown"
        if verdict == "kernel" and split_tie("cuda", node.domain, node.op, opset, port_types(node, opset)):
            verdict = "none"  # a group of type parameters the kernel binds to one type holds two
        out[node.name] = (node.op, "+".join(LOW[t] for t in types), verdict)
    return out


def port_types(node, opset: int) -> dict[str, int]:
    """{type parameter: element type} of `node`'s typed ports, by its schema at `opset`."""
    sig = signatures.lookup(node.domain, node.op, opset)
    ports = ([None if v is None else v.dtype for v in values] for values in (node.inputs, node.outputs))
    return sig.param_types(*ports) if sig is not None else {}


def placements(model_bytes: bytes, feeds: dict, workdir: str) -> tuple[dict[str, str], Counter]:
    """({node name: provider}, the ops ONNX Runtime added, counted) from one profiled run on CUDA."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(workdir, "place")
    options.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes, options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    sess.run(None, {k: v for k, v in feeds.items() if k in names})
    profile = sess.end_profiling()
    events = json.loads(Path(profile).read_text())
    os.remove(profile)
    where, added = {}, Counter()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        name = event["name"][: -len("_kernel_time")]
        where[name] = event["args"].get("provider", "?")
        if event["args"].get("op_name", "").startswith("Memcpy"):
            added[event["args"]["op_name"]] += 1
    return where, added


def check_variant(
    path: str, precision: str, runtime: str, feeds: dict, workdir: str, speed: bool, opset: int | None = None
) -> dict:
    source = onnx.load(str(ROOT / path))
    extra = {"opset": opset} if opset else {}
    result = autocast_onnx.convert(source, precision=precision, runtime=runtime, device="cpu", **extra)
    converted = named(result.model)
    predicted = predictions(converted)
    placed, added = placements(converted.SerializeToString(), feeds, workdir)
    rows, unplaced = Counter(), Counter()
    wrong = []
    for name, (op, types, verdict) in predicted.items():
        provider = placed.get(name)
        on = "cuda" if provider == "CUDAExecutionProvider" else "cpu" if provider == "CPUExecutionProvider" else "?"
        rows[(verdict, on)] += 1
        if on == "?":
            unplaced[op] += 1
        if (verdict == "kernel" and on == "cpu") or (verdict == "none" and on == "cuda"):
            wrong.append(f"{name} ({op}, {types}): table says {verdict}, ran on {on}")
    record = {
        "model": path,
        "precision": precision,
        "runtime": runtime,
        "low_nodes": len(predicted),
        "counts": {f"{v}/{o}": n for (v, o), n in sorted(rows.items())},
        "memcpy": dict(added),
        "no_event": dict(unplaced),  # nodes with no profiling event (removed by the session before it ran)
        "mismatches": wrong,
    }
    if speed:
        record["cuda"] = validate_on_cuda(source, converted, workdir)
    return record


def validate_on_cuda(source, converted, workdir: str) -> dict:
    report = autocast_onnx.validate(source, converted, device="cuda", speed=True, generate=0).to_dict()
    speed = report.get("speed") or {}
    worst = max((o.get("relative_error") or 0.0 for o in report.get("outputs", [])), default=None)
    return {
        "verdict": "PASS" if report.get("passed") else "FAIL",
        "worst_rel_error": worst,
        "fp32_p50_ms": (speed.get("reference") or {}).get("p50_ms"),
        "converted_p50_ms": (speed.get("converted") or {}).get("p50_ms"),
        "speedup_p50": speed.get("speedup_p50"),
        "outputs": [
            {k: o.get(k) for k in ("name", "relative_error", "cosine", "top1", "passed", "failures")}
            for o in report.get("outputs", [])
        ],
        "generation": report.get("generation"),
    }


UNARY = (
    "Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Elu Erf Exp Floor Gelu HardSigmoid HardSwish Identity "
    "IsInf IsNaN LeakyRelu Log LogSoftmax Mish Neg NonZero Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp "
    "ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Round Selu Shrink Sigmoid Sign Sin "
    "Sinh Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu GlobalAveragePool GlobalMaxPool CumSum "
    "Clip Transpose Flatten Dropout"
).split()
BINARY = "Add Sub Mul Div Pow Max Min Mod PRelu Equal Less Greater LessOrEqual GreaterOrEqual MatMul Where".split()
# ops with more float inputs or required attributes: (float inputs after x with their shapes, attributes)
SPECIAL = {
    "Conv": ([("w", [4, 4, 3, 3])], {}),
    "ConvTranspose": ([("w", [4, 4, 3, 3])], {}),
    "Gemm": ([("w", [8, 8])], {}),
    "BatchNormalization": ([(n, [4]) for n in ("scale", "bias", "mean", "var")], {}),
    "LayerNormalization": ([("scale", [8]), ("bias", [8])], {}),
    "AveragePool": ([], {"kernel_shape": [2, 2]}),
    "MaxPool": ([], {"kernel_shape": [2, 2]}),
    "GridSample": ([("grid", [2, 8, 8, 2])], {}),
    "Einsum": ([("w", [2, 4, 8, 8])], {"equation": "bchw,bcwk->bchk"}),
    "InstanceNormalization": ([("scale", [4]), ("bias", [4])], {}),
    "LRN": ([], {"size": 3}),
}
X_SHAPE = {"Gemm": [8, 8], "Squeeze": [2, 1, 8, 8]}  # the first input's shape where SHAPE does not fit
# data-movement ops whose other inputs are int64 constants: op -> (opset -> (int constants, attributes)); an
# input that became an attribute at some opset is given as one below it
PADS = [0, 0, 1, 1, 0, 0, 1, 1]
SHAPED = {
    "Reshape": lambda v: ([("shape", [2, 4, 64])], {}),
    "Squeeze": lambda v: ([("axes", [1])], {}) if v >= 13 else ([], {"axes": [1]}),
    "Unsqueeze": lambda v: ([("axes", [0])], {}) if v >= 13 else ([], {"axes": [0]}),
    "Slice": lambda v: (
        ([("starts", [0]), ("ends", [4]), ("axes", [2])], {})
        if v >= 10
        else ([], {"starts": [0], "ends": [4], "axes": [2]})
    ),
    "Gather": lambda v: ([("indices", [0, 1])], {"axis": 1}),
    "Expand": lambda v: ([("shape", [2, 4, 8, 8])], {}),
    "Pad": lambda v: ([("pads", PADS)], {}) if v >= 11 else ([], {"pads": PADS}),
    "Tile": lambda v: ([("repeats", [1, 1, 2, 2])], {}),
    "Concat": lambda v: ([], {"axis": 1}),
    "Cast": lambda v: ([], {"to": 1}),
    "Shape": lambda v: ([], {}),
    "ArgMax": lambda v: ([], {}),
    "ArgMin": lambda v: ([], {}),
    "Trilu": lambda v: ([], {}),
    "Resize": lambda v: ([], {"scales": [1.0, 1.0, 2.0, 2.0]}),
}
OPS = UNARY + BINARY + sorted(SPECIAL) + sorted(SHAPED)
SHAPE = [2, 4, 8, 8]


def probe_opsets(op: str, low: int = 7, high: int = 23) -> list[int]:
    """The opsets in [low, high] at which `op`'s schema changes: ONNX Runtime registers kernels by those."""
    versions = {schema.since_version for schema in onnx.defs.get_all_schemas_with_history() if schema.name == op}
    return sorted(v for v in versions if low <= v <= high) or ([high] if versions and min(versions) <= high else [])


def probe_model(op: str, elem: int, opset: int, mixed: bool = False):
    """A model of one `op` node ("probe") on tensors of `elem` at `opset`, fed and read through Casts from and
    to float32 (so any ONNX Runtime build takes its inputs), or None where the schema refuses. `mixed` leaves
    the inputs after the first in float32 (BatchNormalization's parameters as the planner pins them)."""
    from onnx import TensorProto, checker, helper, shape_inference

    extra, attrs = SPECIAL.get(op, ([("z", [4, 1, 1] if op == "PRelu" else SHAPE)] if op in BINARY else [], {}))
    if op == "Concat":
        extra = [("z", SHAPE)]
    constants, shaped_attrs = SHAPED[op](opset) if op in SHAPED else ([], {})
    attrs = {**attrs, **shaped_attrs}
    wanted = [("x", X_SHAPE.get(op, SHAPE)), *extra]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims) for name, dims in wanted]
    low = wanted[:1] if mixed else wanted
    nodes = [helper.make_node("Cast", [name], [name + "_low"], name="in_" + name, to=elem) for name, _ in low]
    names = [name + "_low" if (name, d) in low else name for name, d in wanted]
    if op == "Where":
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, SHAPE))
        names.insert(0, "cond")
    if op == "CumSum":
        inputs.append(helper.make_tensor_value_info("axis", TensorProto.INT64, []))
        names.append("axis")
    attrs = {**attrs, **({"fmod": 1} if op == "Mod" else {})}
    inits = [helper.make_tensor(name, TensorProto.INT64, [len(vals)], vals) for name, vals in constants]
    names += [name for name, _ in constants]
    if op == "Resize":  # roi absent, scales a float32 constant (the port the planner pins fp32)
        scales = attrs.pop("scales")
        names += ["", "scales"] if opset >= 11 else ["scales"]
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [4], scales))
    nodes.append(helper.make_node(op, names, ["p"], name="probe", **attrs))
    graph = helper.make_graph(nodes, "probe", inputs, [helper.make_empty_tensor_value_info("p")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=True).graph.output[0]
    except Exception:
        return None
    out_type = inferred.type.tensor_type.elem_type
    if not out_type:
        return None
    graph = model.graph  # make_model copied the graph
    if out_type == elem:
        graph.node.append(helper.make_node("Cast", ["p"], ["y"], name="out", to=TensorProto.FLOAT))
        out_type = TensorProto.FLOAT
    else:
        graph.node.append(helper.make_node("Identity", ["p"], ["y"], name="out"))
    del graph.output[:]
    graph.output.append(inferred)
    graph.output[0].name = "y"
    graph.output[0].type.tensor_type.elem_type = out_type
    try:
        checker.check_model(model, full_check=True)
    except Exception:
        return None
    return model


def probe_feeds(model) -> dict:
    import numpy as np
    from onnx import TensorProto

    rng = np.random.default_rng(0)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        kind = vi.type.tensor_type.elem_type
        if kind == TensorProto.INT64:
            feeds[vi.name] = np.array(1, np.int64)
        elif kind == TensorProto.BOOL:
            feeds[vi.name] = rng.uniform(size=dims) > 0.5
        else:
            feeds[vi.name] = rng.uniform(0.1, 0.9, dims).astype(np.float32)
    return feeds


def probes(workdir: str) -> list[dict]:
    """Each op of OPS at fp16 and bf16 at each opset where its schema changes (probe_opsets), alone: where its
    node ran against the table's answer for it; and BatchNormalization with fp32 parameters beside low data."""
    from onnx import TensorProto

    records = []
    cases = [(op, elem, opset, False) for op in OPS for elem in LOW for opset in probe_opsets(op)]
    cases += [("BatchNormalization", elem, opset, True) for elem in LOW for opset in (15,)]
    for op, elem, opset, mixed in cases:
        model = probe_model(op, elem, opset, mixed)
        if model is None:
            continue
        try:
            placed, _ = placements(model.SerializeToString(), probe_feeds(model), workdir)
            on = {"CUDAExecutionProvider": "cuda", "CPUExecutionProvider": "cpu"}.get(placed.get("probe"), "?")
        except Exception as exc:
            on = "error: " + str(exc).splitlines()[0][:120]
        answer = has_kernel("cuda", "", op, opset, elem)
        if mixed and answer:
            tie = split_tie("cuda", "", op, opset, {"T": elem, "T1": TensorProto.FLOAT, "T2": TensorProto.FLOAT})
            answer = False if tie else answer
        verdict = {True: "kernel", False: "none", None: "unknown"}[answer]
        agree = (verdict == "kernel" and on == "cuda") or (verdict == "none" and on != "cuda")
        label = LOW[elem] + ("+fp32 params" if mixed else "")
        records.append({"op": op, "type": label, "opset": opset, "table": verdict, "ran_on": on, "agree": agree})
    return records


def observed_table(probed: list[dict], argv) -> dict:
    """What catalog/kernels.py reads as data/kernels_cuda_observed.json: where each one-node probe ran on this
    ONNX Runtime build and GPU (mixed-type probes left out: the kernel table's ties answer those)."""
    import subprocess

    import onnxruntime as ort

    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.strip()
    rows = [
        {"op": r["op"], "type": r["type"], "opset": r["opset"], "ran_on": r["ran_on"].split(":")[0]}
        for r in probed
        if "+" not in r["type"] and r["ran_on"] != "?"
    ]
    return {
        "runtime": "cuda",
        "onnxruntime": ort.__version__,
        "package": "onnxruntime-gpu",
        "device": gpu,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "generated_by": "tools/gpu_placement.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "meaning": "each op alone at fp16/bf16 at each opset where its schema changes (7-23), inputs cast from "
        "float32 in the graph, graph optimizations off: ran_on is the provider ONNX Runtime placed the node on "
        "(error: no provider had a kernel)",
        "probes": rows,
    }


def feeds_of(path: str) -> dict:
    """One generated batch; a decoder with a KV cache gets total_sequence = past_sequence + sequence, as its
    attention mask must span the past and the new tokens."""
    model = onnx.load(str(ROOT / path), load_external_data=False)
    specs = describe_inputs(model)
    symbolic = {d for s in specs for d in s.dims if isinstance(d, str)}
    dims = {"past_sequence": 16, "sequence": 16, "total_sequence": 32} if "total_sequence" in symbolic else {}
    return generate(plan_inputs(specs, {k: v for k, v in dims.items() if k in symbolic}), seed=0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--json", help="write every record here")
    parser.add_argument("--speed", action="store_true", help="also validate each converted model on CUDA")
    parser.add_argument("--probes", action="store_true", help="also place one-node models of common ops")
    parser.add_argument("--record", help="with --probes: write the probes' placements here (the observed table)")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("gpu_placement: ONNX Runtime has no CUDA execution provider here; install onnxruntime-gpu on a GPU")
        return 2
    print(f"onnxruntime {ort.__version__}; table: {runtime_label('cuda')}")
    records, failures = [], 0
    with tempfile.TemporaryDirectory() as workdir:
        for path in args.models:
            feeds = feeds_of(path)
            variants = [(p, r, None) for p, r in VARIANTS]
            variants += OPSET_VARIANTS if path.startswith("examples/") else []
            for precision, runtime, opset in variants:
                start = time.perf_counter()
                try:
                    record = check_variant(path, precision, runtime, feeds, workdir, args.speed, opset)
                except Exception as exc:  # a model ONNX Runtime refuses is reported, and the others go on
                    record = {"model": path, "precision": precision, "runtime": runtime, "error": str(exc)[:300]}
                record["opset"] = opset
                record["seconds"] = round(time.perf_counter() - start, 2)
                records.append(record)
                failures += len(record.get("mismatches", ())) + ("error" in record)
                print(line(record))
                wrong = record.get("mismatches", [])
                for text in wrong[:5]:
                    print("    MISMATCH " + text)
                if len(wrong) > 5:
                    print(f"    ... and {len(wrong) - 5} more (--json has them all)")
        probed = probes(workdir) if args.probes else []
    for r in probed:
        if not r["agree"] or r["table"] == "unknown":
            print(f"probe {r['op']:16s} {r['type']} opset {r['opset']}: table {r['table']}, ran on {r['ran_on']}")
    disagree = sum(not r["agree"] and r["table"] != "unknown" for r in probed)
    if probed:
        print(f"probes: {len(probed)} one-node models, {disagree} disagree with the table")
    failures += disagree
    if args.json:
        Path(args.json).write_text(json.dumps({"conversions": records, "probes": probed}, indent=1))
    if args.record and probed:
        Path(args.record).write_text(json.dumps(observed_table(probed, argv), indent=1) + "\n")
    print(f"{len(records)} conversions checked, {failures} mismatches or errors")
    return 1 if failures else 0


def line(r: dict) -> str:
    head = f"{r['model']:40s} {r['precision']} runtime={r['runtime']:4s}"
    head += f" opset={r['opset']}" if r.get("opset") else ""
    if "error" in r:
        return f"{head} ERROR {r['error']}"
    counts = " ".join(f"{k}={v}" for k, v in r["counts"].items())
    copies = sum(r["memcpy"].values())
    text = f"{head} low={r['low_nodes']:4d} {counts} memcpy={copies}"
    if r["no_event"]:
        text += " no-event " + ",".join(f"{op}:{n}" for op, n in sorted(r["no_event"].items()))
    if "cuda" in r:
        c = r["cuda"]
        text += f" | cuda {c['verdict']} rel={c['worst_rel_error']} speedup={c['speedup_p50']}"
    return text


if __name__ == "__main__":
    sys.exit(main())
