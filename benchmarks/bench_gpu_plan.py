"""Evidence for a GPU plan without a GPU (issue 37, item 9): real-size models, each conversion's
nodes, casts, bytes moved per inference, CUDA fallbacks, ONNX Runtime fusions and emulated error.

Models (random init from the architecture's configuration; nothing is downloaded), exported with
torch.onnx.export's TorchScript exporter (dynamo=False: it writes opset 17 directly, keeps
BatchNormalization with training=TrainingMode.PRESERVE on a model in eval mode, and writes the
graphs ONNX Runtime's transformer fusions are written for), opset 17, fp32, batch and sequence fixed
at export (--batch, default 8):

  bert      BertModel, bert-base (768 x 12 layers), sequence 128, last_hidden_state + pooler_output
  gpt2      GPT2LMHeadModel, GPT-2 small (768 x 12), sequence 128, prefill without KV cache, logits
  vit       ViTForImageClassification, ViT-B/16 at 224 x 224, 1000 labels
  whisper   WhisperEncoder, whisper-base (512 x 6), 80 x 3000 log-mel
  resnet50  ResNetForImageClassification, ResNet-50 ([3, 4, 6, 3] bottlenecks), BatchNormalization unfolded
  convnext  ConvNextForImageClassification, ConvNeXt-T ([3, 3, 9, 3], 96..768)

Biases, norm scales and BatchNormalization statistics get small seeded noise (an exporter folds
identical all-zero/all-one initializers into one), and ConvNeXt's layer scale (1e-6 at init) is set
to 0.1 so that its blocks count in the output. `--small` builds small configurations of the same
architectures (seconds; for a quick look and the test).

Conversions, one table row each:

  fp32                       the exported model
  autocast                   autocast_onnx.convert(path), this tool's default
  autocast any               autocast_onnx.convert(path, runtime="any")
  autocast precise           autocast_onnx.convert(path, precise=True), the fp32 residual stream
  onnxconverter-common       onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True), 1.16
  ort float16                onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=True)
  ort-opt fp32               onnxruntime.transformers.optimizer.optimize_model(model_type=bert, gpt2, vit, and
                             bart for Whisper as ONNX Runtime's Whisper export does; num_heads, hidden_size,
                             opt_level=0), saved with save_model_to_file; the transformer models only
  ort-opt -> autocast        that fused fp32 model through autocast_onnx.convert
  ort-opt -> autocast precise  the same with precise=True
  ort-opt --float16          the optimizer's own fp16 path: .convert_float_to_float16(keep_io_types=True)

opt_level=0 runs the optimizer's fusions without an ONNX Runtime session first: with the default
(opt_level 1, a CPU session at the basic level before the fusions) BERT-base's attention is no longer
fused (Gelu 12, SkipLayerNormalization 24, no Attention, where opt_level 0 fuses 12 Attention), and
the small BERT comes out as a model ONNX Runtime 1.32 refuses to load ("Attempt to replace the
existing tensor").

Columns: nodes and Cast nodes of the main graph; MB moved per inference at the batch (bytes_moved():
every node's input and output tensors at their element types and inferred shapes, Constant nodes
left out; shapes from ONNX Runtime's symbolic shape inference, which knows the com.microsoft ops
of the fused models, then ONNX's), the share of tensor slots it could not shape (left out of the
sum), and the MB the Casts move (a weight counts whole at every node that takes it, a Gather's
embedding table too, though the kernel reads only the rows it gathers); nodes ONNX Runtime's CUDA
provider would place on the CPU (lint --runtime cuda, AC404 findings on the converted model; '-'
for fp32, which has every kernel); ORT fusions: for the transformer
models, optimize_model(converted, model_type, opt_level=0).get_fused_operator_statistics() (the
Python fusions alone: a CPU session at opt_level >= 1 would add its own casts around fp16 nodes),
for the CNNs the BatchNormalization nodes left in ONNX Runtime's optimized graph (CPU provider,
ORT_ENABLE_EXTENDED, optimized_model_filepath; Conv+BatchNormalization fusion is a level-1 rule
every provider gets) out of those exported; and the largest relative error over the outputs from
autocast_onnx.validate(fp32, converted, inputs=..., device="cpu", numerics="emulate", speed=False,
generate=0) on one batch generated once per model (validate's generator, seed 0, which fully masks
the last row of an attention mask) and replayed for every conversion. The rows below ort-opt fp32
are measured against ort-opt fp32, so that they show the precision's error and not the fusions':
the fused Attention adds -10000 where the exported graph adds the fp32 minimum, which changes
BERT's pooler output on the fully masked row by 7e-2 (the ort-opt fp32 row shows it).

Set up (once; the CPU build of torch first, from the local wheel), then run from the repository root:

    python3 -m venv .venv-bench && .venv-bench/bin/pip install torch==2.13.0
    .venv-bench/bin/pip install -e . onnxruntime transformers onnxconverter-common==1.16.0 onnxscript
    .venv-bench/bin/python benchmarks/bench_gpu_plan.py [--models bert,gpt2,...] [--batch 8]
        [--cache DIR] [--json OUT] [--small]

Each model is built, converted and measured in a process of its own, one after the other (a failure
or a crash of one is printed in its row and the others go on); the exported fp32 models and their
inputs are cached in benchmarks/.gpu_plan_cache/ (gitignored; --cache to move it; 1.3 GB for the six
at batch 8). A full run of the six at batch 8 took 40 minutes on 2 cores with an empty cache (the
exports about 3 of them), see the report of issue 37; --small about 2 minutes.

The functions above the line `# ---- the heavy part` need only onnx and numpy (tests/tools/test_bench_gpu_plan.py
runs them without torch).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".gpu_plan_cache"
MODELS = ["bert", "gpt2", "vit", "whisper", "resnet50", "convnext"]
CONVERSIONS = [
    "fp32",
    "autocast",
    "autocast any",
    "autocast precise",
    "onnxconverter-common",
    "ort float16",
    "ort-opt fp32",
    "ort-opt -> autocast",
    "ort-opt -> autocast precise",
    "ort-opt --float16",
]

# Bytes per element of each ONNX element type; STRING (and UNDEFINED) have no fixed size and are
# left out like an unshaped tensor. The 4-bit types pack two elements in a byte.
ELEM_BYTES: dict[int, float] = {
    TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2, TensorProto.DOUBLE: 8,
    TensorProto.INT64: 8, TensorProto.INT32: 4, TensorProto.INT16: 2, TensorProto.INT8: 1,
    TensorProto.UINT64: 8, TensorProto.UINT32: 4, TensorProto.UINT16: 2, TensorProto.UINT8: 1,
    TensorProto.BOOL: 1, TensorProto.COMPLEX64: 8, TensorProto.COMPLEX128: 16,
    TensorProto.FLOAT8E4M3FN: 1, TensorProto.FLOAT8E4M3FNUZ: 1, TensorProto.FLOAT8E5M2: 1,
    TensorProto.FLOAT8E5M2FNUZ: 1, TensorProto.INT4: 0.5, TensorProto.UINT4: 0.5,
}  # fmt: skip
INLINE_ELEMENTS = 1024  # initializers up to this size stay in the copy that is shape-inferred


@dataclass
class BytesMoved:
    """What bytes_moved() counted: `total` bytes over every counted (node, tensor) slot, `casts` the
    part Cast nodes move, `slots` the slots looked at and `unshaped` those left out (no static shape
    or no sized element type); `by_op` bytes per op type; `cast_sites` one entry per Cast node."""

    total: int = 0
    casts: int = 0
    slots: int = 0
    unshaped: int = 0
    by_op: dict = field(default_factory=dict)
    cast_sites: list = field(default_factory=list)

    @property
    def unshaped_share(self) -> float:
        return self.unshaped / self.slots if self.slots else 0.0


def onnx_inference(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX's shape inference with data propagation (Shape -> Gather -> Reshape chains resolve)."""
    return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)


def bytes_moved(model: onnx.ModelProto, batch: int = 8, dims: dict | None = None, infer=onnx_inference) -> BytesMoved:
    """The bytes the nodes of `model`'s main graph read and write in one inference at `batch`.

    For every node but Constant (ONNX Runtime makes those initializers; no kernel runs), each
    input and each output tensor (an initializer too: a weight is read) adds its element count
    times its element type's size (ELEM_BYTES): a tensor read by three nodes counts three times,
    as it is read three times. Shapes come from `infer` (ONNX shape inference by default) on a copy
    of the model whose symbolic dimensions are fixed: the first dimension of every graph input
    that is not a number is `batch`, and so is every value's dimension of that name; `dims` sets
    other names ({"sequence": 128}). The copy is light: initializers over INLINE_ELEMENTS
    elements become graph inputs of their type and shape (their values do not shape anything), its
    nodes are put in topological order, as ONNX Runtime orders them on load, since the inference
    walks them in file order, and the types the model declares for values and outputs are dropped,
    so that every type counted is one the nodes produce. A slot whose tensor has no full static shape after that,
    or an element type of no fixed size, is left out and counted in `unshaped`."""
    light = _light_copy(model)
    _fix_dims(light.graph, batch, dims or {})
    inferred = infer(light)
    types = _value_types(inferred.graph)
    producers = {o: n for n in model.graph.node for o in n.output if o}
    consumers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n.op_type)
    out = BytesMoved()
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            continue
        moved = 0
        for name in [*node.input, *node.output]:
            if not name:
                continue
            out.slots += 1
            size = tensor_bytes(types.get(name))
            if size is None:
                out.unshaped += 1
                continue
            moved += size
        out.total += moved
        out.by_op[node.op_type] = out.by_op.get(node.op_type, 0) + moved
        if node.op_type == "Cast":
            out.casts += moved
            out.cast_sites.append(_cast_site(node, types, moved, producers, consumers))
    return out


def tensor_bytes(typed) -> int | None:
    """Bytes of a tensor given as (element type, shape), shape a tuple of ints (None where unknown);
    None when the shape is not fully static or the type has no fixed size."""
    if typed is None:
        return None
    elem, shape = typed
    if shape is None or elem not in ELEM_BYTES or any(d is None for d in shape):
        return None
    return math.ceil(math.prod(shape) * ELEM_BYTES[elem])


def _cast_site(node, types, moved: int, producers: dict, consumers: dict) -> dict:
    src = types.get(node.input[0]) if node.input else None
    dst = types.get(node.output[0]) if node.output else None
    producer = producers.get(node.input[0]) if node.input else None
    return {
        "name": node.name or node.output[0],
        "input": node.input[0] if node.input else "",
        "from": _type_name(src[0]) if src else "?",
        "to": _type_name(dst[0]) if dst else "?",
        "shape": list(src[1]) if src and src[1] is not None else None,
        "bytes": moved,
        "producer": producer.op_type if producer is not None else "graph input/initializer",
        "consumers": sorted(set(consumers.get(node.output[0], []))) if node.output else [],
    }


def _type_name(elem: int) -> str:
    try:
        return TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return str(elem)


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` without the payloads of its large initializers (graph inputs of their type and shape
    instead), nodes in topological order, and without its declared value_info and output types (a
    converter may declare types its nodes do not produce: the types counted are those inferred from
    the inputs, the initializers and the nodes); the original is not changed."""
    src = model.graph
    graph = onnx.GraphProto(name=src.name)
    graph.node.extend(topological_order(src))
    graph.input.extend(src.input)
    graph.output.extend(helper.make_empty_tensor_value_info(o.name) for o in src.output)
    declared = {vi.name for vi in src.input}
    for t in src.initializer:
        if t.data_location != TensorProto.EXTERNAL and math.prod(t.dims) <= INLINE_ELEMENTS:
            graph.initializer.append(t)
        elif t.name not in declared:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    light = onnx.ModelProto(ir_version=model.ir_version, graph=graph)
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    return light


def topological_order(graph: onnx.GraphProto) -> list:
    """The graph's nodes ordered so that each comes after the producers of its inputs (Kahn's
    algorithm, ties in file order); a node in a cycle or with an input nobody produces keeps its
    place at the end. Inputs a subgraph reads from outside count as the node's inputs."""
    nodes = list(graph.node)
    produced = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    needs = [{produced[x] for x in _node_reads(n) if x in produced and produced[x] != i} for i, n in enumerate(nodes)]
    users: dict[int, list[int]] = {}
    for i, deps in enumerate(needs):
        for d in deps:
            users.setdefault(d, []).append(i)
    waiting = [len(d) for d in needs]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, []):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    seen = set(order)
    order += [i for i in range(len(nodes)) if i not in seen]
    return [nodes[i] for i in order]


def _node_reads(node) -> list[str]:
    names = [x for x in node.input if x]
    for attr in node.attribute:
        for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
            for inner in g.node:
                names += _node_reads(inner)
    return names


def _fix_dims(graph: onnx.GraphProto, batch: int, dims: dict) -> None:
    """Set symbolic dimensions in place: the first dimension of each graph input that is not a
    number to `batch` (and its name everywhere), names in `dims` to their values."""
    initialized = {t.name for t in graph.initializer}
    names = dict(dims)
    real = [vi for vi in graph.input if vi.name not in initialized and vi.type.HasField("tensor_type")]
    for vi in real:
        shape = vi.type.tensor_type.shape
        if len(shape.dim) and not shape.dim[0].HasField("dim_value"):
            if shape.dim[0].dim_param:
                names.setdefault(shape.dim[0].dim_param, batch)
            shape.dim[0].dim_value = batch
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if not vi.type.HasField("tensor_type"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.dim_param in names:
                d.dim_value = int(names[d.dim_param])


def _value_types(graph: onnx.GraphProto) -> dict:
    """name -> (element type, shape tuple with None for unknown dims, or None without a shape)."""
    types: dict = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if not vi.type.HasField("tensor_type"):
            continue
        t = vi.type.tensor_type
        shape = None
        if t.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        if t.elem_type or vi.name not in types:
            types[vi.name] = (t.elem_type, shape)
    for t in graph.initializer:
        types[t.name] = (t.data_type, tuple(t.dims))
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and node.output:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    types[node.output[0]] = (a.t.data_type, tuple(a.t.dims))
    return types


# ---- the table ----------------------------------------------------------------------------------

COLUMNS = ["conversion", "nodes", "Casts", "MB moved", "unshaped", "Cast MB", "CUDA->CPU", "ORT fusions", "rel error"]
ABBREV = {
    "EmbedLayerNormalization": "EmbLN", "SkipLayerNormalization": "SkipLN", "LayerNormalization": "LN",
    "SimplifiedLayerNormalization": "RMSN", "SkipSimplifiedLayerNormalization": "SkipRMSN",
    "MultiHeadAttention": "MHA", "GroupQueryAttention": "GQA", "Attention": "Attn", "BiasGelu": "BiasGelu",
    "FastGelu": "FastGelu", "Gelu": "Gelu", "QuickGelu": "QuickGelu", "BiasSplitGelu": "BiasSplitGelu",
    "GemmFastGelu": "GemmFastGelu", "RotaryEmbedding": "Rotary", "BiasAdd": "BiasAdd",
}  # fmt: skip


def fusion_text(row: dict) -> str:
    """The fusions column: 'Attn 12, SkipLN 24, ...' (nonzero counts) from `fusions`, or 'BN k/N'
    from `bn_left`/`bn_exported`, or '-'."""
    if row.get("fusions") is not None:
        parts = [f"{ABBREV.get(k, k)} {v}" for k, v in sorted(row["fusions"].items(), key=lambda kv: -kv[1]) if v]
        return ", ".join(parts) or "none"
    if row.get("bn_left") is not None:
        return f"BN {row['bn_left']}/{row.get('bn_exported', '?')}"
    return row.get("fusions_error", "-")


def _mb(value) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def _cells(row: dict) -> list[str]:
    if not row.get("ok"):
        return [row["conversion"], f"failed: {row.get('error', '?')}"] + [""] * (len(COLUMNS) - 2)
    err = row.get("rel_error")
    err_text = row.get("error_note") or ("-" if err is None else f"{err:.2e}")
    cpu = row.get("cpu_nodes")
    share = row.get("unshaped_share")
    return [
        row["conversion"],
        f"{row['nodes']:,}",
        f"{row['casts']:,}",
        _mb(row.get("bytes")),
        "-" if share is None else f"{100 * share:.1f}%",
        _mb(row.get("cast_bytes")),
        "-" if cpu is None else str(cpu),
        fusion_text(row),
        err_text,
    ]


def _cost(res: dict) -> str:
    """' (N s, peak P GiB)': the model's time and the largest peak memory of its processes."""
    if res.get("seconds") is None:
        return ""
    peaks = [res.get("peak_rss_mb") or 0] + [r.get("measure_peak_rss_mb") or 0 for r in res.get("rows", [])]
    return f" ({res['seconds']:.0f} s, peak {max(peaks) / 1024:.1f} GiB)"


def table(results: list[dict]) -> str:
    """One markdown table per model: a row per conversion (COLUMNS); a model that failed as a whole
    gets one line with its error."""
    lines = []
    for res in results:
        lines.append(f"### {res['model']}" + (f" - {res['info']}" if res.get("info") else "") + _cost(res))
        if res.get("error"):
            lines += [f"failed: {res['error']}", ""]
            continue
        lines.append("| " + " | ".join(COLUMNS) + " |")
        lines.append("|---|" + "---:|" * 6 + "---|---:|")
        for row in res["rows"]:
            lines.append("| " + " | ".join(_cells(row)) + " |")
        lines.append("")
    return "\n".join(lines)


def _row(res: dict, conversion: str) -> dict | None:
    for row in res.get("rows", []):
        if row["conversion"] == conversion and row.get("ok"):
            return row
    return None


def _ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    if a is None or b is None or a.get(key) is None or not b.get(key):
        return None
    return a[key] / b[key]


GOALS = [
    # (ours, the peer's, goal on the bytes ratio)
    ("autocast", "ort float16", 1.10),
    ("autocast precise", "ort float16", 1.10),
    ("ort-opt -> autocast", "ort-opt --float16", 1.05),
    ("ort-opt -> autocast precise", "ort-opt --float16", 1.05),
]


def ratios(results: list[dict]) -> list[dict]:
    """The issue's goals, per model and pair: bytes ours / the peer's (goal <= its limit) and the
    emulated error of ours against the peer's (goal: not higher)."""
    out = []
    for res in results:
        for ours, peer, limit in GOALS:
            a, b = _row(res, ours), _row(res, peer)
            if a is None and b is None:
                continue
            r = _ratio(a, b, "bytes")
            ea, eb = (a or {}).get("rel_error"), (b or {}).get("rel_error")
            out.append({
                "model": res["model"], "ours": ours, "peer": peer, "bytes_ratio": r, "goal": limit,
                "bytes_ok": None if r is None else r <= limit, "error": ea, "peer_error": eb,
                "error_ok": None if ea is None or eb is None else ea <= eb,
            })  # fmt: skip
    return out


def ratio_table(rows: list[dict]) -> str:
    yes = {True: "yes", False: "NO", None: "-"}
    lines = [
        "| model | ours | peer | bytes ours/peer | goal | met | error ours | error peer | ours <= peer |",
        "|---|---|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        ratio = "-" if r["bytes_ratio"] is None else f"{r['bytes_ratio']:.3f}"
        ea = "-" if r["error"] is None else f"{r['error']:.2e}"
        eb = "-" if r["peer_error"] is None else f"{r['peer_error']:.2e}"
        lines.append(
            f"| {r['model']} | {r['ours']} | {r['peer']} | {ratio} | <= {r['goal']:.2f} | {yes[r['bytes_ok']]} "
            f"| {ea} | {eb} | {yes[r['error_ok']]} |"
        )
    return "\n".join(lines)


def top_casts(sites: list[dict], n: int = 5) -> list[dict]:
    return sorted(sites, key=lambda s: -s["bytes"])[:n]


def cast_text(model: str, conversion: str, sites: list[dict], n: int = 5) -> str:
    lines = [f"top {n} Cast sites by bytes, {model}, {conversion} ({len(sites)} Casts):"]
    for s in top_casts(sites, n):
        shape = "x".join(str(d) for d in s["shape"]) if s["shape"] else "?"
        lines.append(
            f"  {s['bytes'] / 1e6:8.1f} MB  {s['from']}->{s['to']} [{shape}]  {s['producer']} -> "
            f"{', '.join(s['consumers']) or '(graph output)'}  {s['name']}"
        )
    return "\n".join(lines)


def op_diff_text(model: str, ours: dict, peer: dict, a: str = "autocast", b: str = "ort float16", n: int = 5) -> str:
    """Op types whose nodes move the most more bytes in `ours` than in `peer` (by_op of each)."""
    keys = set(ours) | set(peer)
    diff = sorted(((ours.get(k, 0) - peer.get(k, 0), k) for k in keys), reverse=True)[:n]
    parts = [f"{k} {d / 1e6:+,.1f} MB" for d, k in diff if d > 0]
    return f"  {model}: bytes by op, {a} - {b}: " + (", ".join(parts) or "none higher")


# ---- the heavy part (torch, transformers, the peers: .venv-bench) ---------------------------------


@dataclass
class Spec:
    """One model: how to build it and which optimizer type fuses it."""

    name: str
    info: str
    model_type: str | None = None  # onnxruntime.transformers.optimizer model_type
    heads: int = 0
    hidden: int = 0


def _perturb(model, seed: int = 1234) -> None:
    """Small seeded noise on biases, norm scales and BatchNormalization statistics (the exporter
    folds identical initializers into one, and all-zero biases are not a model); ConvNeXt's layer
    scale to 0.1."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_scale_parameter"):
                p.fill_(0.1)
            elif p.ndim == 1 and name.endswith("weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def _builders(small: bool) -> dict:
    """name -> (Spec, build(batch) -> (module, example args, input names, output names, CNN?))."""
    import torch
    import transformers as tf

    eager = {"attn_implementation": "eager"}
    seq = 32 if small else 128

    def ids(batch, vocab):
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(1, vocab, (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq // 2 :] = 0  # padding in the example, so that no mask code is traced away
        return x, mask

    class Wrap(torch.nn.Module):
        def __init__(self, inner, names, outs):
            super().__init__()
            self.inner, self.names, self.outs = inner, names, outs

        def forward(self, *args):
            out = self.inner(**dict(zip(self.names, args)))
            return tuple(getattr(out, o) for o in self.outs)

    def bert(batch):
        cfg = (tf.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=128, **eager) if small else tf.BertConfig(**eager))  # fmt: skip
        x, mask = ids(batch, cfg.vocab_size)
        names = ["input_ids", "attention_mask", "token_type_ids"]
        outs = ["last_hidden_state", "pooler_output"]
        return Wrap(tf.BertModel(cfg), names, outs), (x, mask, torch.zeros_like(x)), names, outs, False

    def gpt2(batch):
        cfg = (tf.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, use_cache=False, **eager)
               if small else tf.GPT2Config(use_cache=False, **eager))  # fmt: skip
        x, mask = ids(batch, cfg.vocab_size)
        names = ["input_ids", "attention_mask"]
        return Wrap(tf.GPT2LMHeadModel(cfg), names, ["logits"]), (x, mask), names, ["logits"], False

    def image(cls, cfg, size):
        def build(batch):
            gen = torch.Generator().manual_seed(0)
            x = torch.randn(batch, 3, size, size, generator=gen)
            names = ["pixel_values"]
            return Wrap(cls(cfg), names, ["logits"]), (x,), names, ["logits"], cls is not tf.ViTForImageClassification

        return build

    def whisper(batch):
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = (tf.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                                max_source_positions=100, **eager) if small else
               tf.WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8, encoder_ffn_dim=2048,
                                num_mel_bins=80, max_source_positions=1500, **eager))  # fmt: skip
        frames = 2 * cfg.max_source_positions
        x = torch.randn(batch, cfg.num_mel_bins, frames, generator=torch.Generator().manual_seed(0))
        names, outs = ["input_features"], ["last_hidden_state"]
        return Wrap(WhisperEncoder(cfg), names, outs), (x,), names, outs, False

    px = 64 if small else 224
    vit = (tf.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, num_labels=10, **eager) if small else
           tf.ViTConfig(num_labels=1000, **eager))  # fmt: skip
    resnet = (tf.ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1],
                              num_labels=10) if small else tf.ResNetConfig(num_labels=1000))  # fmt: skip
    convnext = (tf.ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], num_labels=10)
                if small else tf.ConvNextConfig(num_labels=1000))  # fmt: skip
    h, nh = (64, 4) if small else (768, 12)
    size = "small config" if small else None
    return {
        "bert": (Spec("bert", size or f"BERT-base, seq {seq}", "bert", nh, h), bert),
        "gpt2": (Spec("gpt2", size or f"GPT-2 small, seq {seq}, prefill, no KV cache", "gpt2", nh, h), gpt2),
        "vit": (Spec("vit", size or "ViT-B/16, 224x224", "vit", nh, h),
                image(tf.ViTForImageClassification, vit, 32 if small else 224)),
        "whisper": (Spec("whisper", size or "Whisper-base encoder, 80x3000 log-mel", "bart",
                         4 if small else 8, 64 if small else 512), whisper),
        "resnet50": (Spec("resnet50", size or "ResNet-50, 224x224, BatchNormalization unfolded"),
                     image(tf.ResNetForImageClassification, resnet, px)),
        "convnext": (Spec("convnext", size or "ConvNeXt-T, 224x224"),
                     image(tf.ConvNextForImageClassification, convnext, px)),
    }  # fmt: skip


def export(name: str, batch: int, small: bool, path: Path) -> dict:
    """Build `name` at random init and export it to `path` (opset 17, fp32, shapes fixed at `batch`);
    check ONNX Runtime against torch on the example inputs. Returns what the build log says."""
    import gc
    import warnings

    import numpy as np
    import onnxruntime as ort
    import torch

    torch.manual_seed(0)
    spec, build = _builders(small)[name]
    module, args, names, outs, cnn = build(batch)
    _perturb(module)
    module.eval()
    start = time.perf_counter()
    tmp = path.with_suffix(".tmp.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module, args, str(tmp), dynamo=False, opset_version=17, input_names=names, output_names=outs,
            do_constant_folding=True, external_data=False,
            training=torch.onnx.TrainingMode.PRESERVE if cnn else torch.onnx.TrainingMode.EVAL,
        )  # fmt: skip
        want = [o.numpy() for o in module(*args)]
    seconds = time.perf_counter() - start
    del module
    gc.collect()
    model = onnx.load(str(tmp))
    bn = sum(n.op_type == "BatchNormalization" for n in model.graph.node)
    if name == "resnet50" and not bn:
        raise RuntimeError("the export folded BatchNormalization away")
    model.doc_string = f"{spec.info}: random init (bench_gpu_plan.py), batch {batch}"
    onnx.save(model, str(tmp))
    sess = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: a.numpy() for n, a in zip(names, args)})
    diff = max(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), 1e-6) for g, w in zip(got, want))
    del sess, model
    os.replace(tmp, path)
    return {"export_seconds": round(seconds, 1), "ort_vs_torch": diff, "batchnorm": bn}


def _convert_all(spec: Spec, src: Path, work: Path) -> dict[str, tuple[Path | None, str | None, float]]:
    """conversion -> (path of its model, error, seconds). The peers' and the optimizer's failures are
    kept as errors; the rows after a failed optimizer say so."""
    import autocast_onnx

    out: dict = {"fp32": (src, None, 0.0)}

    def run(label, fn):
        start = time.perf_counter()
        dst = work / (label.replace(" ", "_").replace(">", "").replace("-", "_") + ".onnx")
        try:
            model = fn(dst)
            if model is not None:  # the optimizer's rows save themselves, as its command line does
                onnx.save(model, str(dst))
            out[label] = (dst, None, time.perf_counter() - start)
        except Exception as exc:  # a peer or the tool failing is a row, not the end of the run
            out[label] = (None, _one_line(exc), time.perf_counter() - start)

    run("autocast", lambda dst: autocast_onnx.convert(str(src)).model)
    run("autocast any", lambda dst: autocast_onnx.convert(str(src), runtime="any").model)
    run("autocast precise", lambda dst: autocast_onnx.convert(str(src), precise=True).model)

    def occ(dst):
        from onnxconverter_common.float16 import convert_float_to_float16

        return convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)

    def ortf16(dst):
        from onnxruntime.transformers.float16 import convert_float_to_float16

        return convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)

    run("onnxconverter-common", occ)
    run("ort float16", ortf16)
    if spec.model_type is None:
        return out
    held: dict = {}

    def optimized(dst):
        from onnxruntime.transformers.optimizer import optimize_model

        held["m"] = optimize_model(str(src), model_type=spec.model_type, num_heads=spec.heads,
                                   hidden_size=spec.hidden, opt_level=0)  # fmt: skip
        held["m"].save_model_to_file(str(dst))  # sorts the nodes and declares com.microsoft

    run("ort-opt fp32", optimized)
    opt = out["ort-opt fp32"][0]
    if opt is None:
        for label in CONVERSIONS[7:]:
            out[label] = (None, "ort-opt fp32 failed", 0.0)
        return out
    run("ort-opt -> autocast", lambda dst: autocast_onnx.convert(str(opt)).model)
    run("ort-opt -> autocast precise", lambda dst: autocast_onnx.convert(str(opt), precise=True).model)

    def opt_float16(dst):
        held["m"].convert_float_to_float16(keep_io_types=True)
        held["m"].save_model_to_file(str(dst))

    run("ort-opt --float16", opt_float16)
    held.clear()
    return out


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """The exception in one line, without the benchmark's temporary paths."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = re.sub(r"/\S*/(\S+\.onnx)", r"\1", text)
    return f"{type(exc).__name__}: {text}"[:limit]


def short_error(message: str) -> str:
    """The rel error cell of a validation that failed: ONNX Runtime's own reason when it could not
    load the model (the text after its last 'FAIL :' or 'failed:'), else the message's head."""
    if "cannot load" in message:
        tail = re.split(r"FAIL : |failed:", message)[-1].strip()
        return "ORT cannot load: " + tail[:100]
    return "failed: " + message[:100]


def _ort_symbolic_then_onnx(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's symbolic shape inference (it knows the com.microsoft ops the optimizer writes),
    then ONNX's; ONNX's alone where the symbolic one fails."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        model = SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
    except Exception as exc:
        print(f"    symbolic shape inference failed ({_one_line(exc)}); ONNX's alone", file=sys.stderr)
    return onnx_inference(model)


def _fusions(spec: Spec, path: Path) -> dict:
    """The ORT fusions column's figures for the model at `path` (see the module's docstring)."""
    if spec.model_type is not None:
        import logging

        from onnxruntime.transformers.optimizer import optimize_model

        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        m = optimize_model(str(path), model_type=spec.model_type, num_heads=spec.heads, hidden_size=spec.hidden,
                           opt_level=0)  # fmt: skip
        return {"fusions": {k: int(v) for k, v in m.get_fused_operator_statistics().items()}}
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        optimized = onnx.load(so.optimized_model_filepath, load_external_data=False)
    exported = onnx.load(str(path), load_external_data=False)
    return {
        "bn_left": sum(n.op_type == "BatchNormalization" for n in optimized.graph.node),
        "bn_exported": sum(n.op_type == "BatchNormalization" for n in exported.graph.node),
    }


def _measure(spec: Spec, label: str, path: Path, src: Path, inputs: Path, batch: int) -> dict:
    """One table row: every column of `label`'s model at `path`; a column that fails says so."""
    import autocast_onnx

    model = onnx.load(str(path))
    moved = bytes_moved(model, batch, infer=_ort_symbolic_then_onnx)
    row = {
        "conversion": label, "ok": True, "nodes": len(model.graph.node),
        "casts": sum(n.op_type == "Cast" for n in model.graph.node),
        "bytes": moved.total, "cast_bytes": moved.casts, "unshaped_share": moved.unshaped_share,
        "by_op": moved.by_op, "cast_sites": moved.cast_sites,
    }  # fmt: skip
    del model
    if label not in ("fp32", "ort-opt fp32"):
        try:
            report = autocast_onnx.lint(str(path), runtime="cuda", select=("AC404",))
            row["cpu_nodes"] = sum(d.code == "AC404" for d in report.findings)
        except Exception as exc:
            row["cpu_nodes_error"] = _one_line(exc)
    try:
        row.update(_fusions(spec, path))
    except Exception as exc:
        row["fusions_error"] = "failed: " + _one_line(exc)[:60]
    if label != "fp32":
        try:
            report = autocast_onnx.validate(str(src), str(path), inputs=str(inputs), device="cpu",
                                            numerics="emulate", speed=False, generate=0)  # fmt: skip
            row["rel_error"] = max(o.relative_error for o in report.outputs)
            row["outputs"] = {o.name: o.relative_error for o in report.outputs}
            row["passed"] = report.passed
        except Exception as exc:
            row["error_note"] = short_error(_one_line(exc, 600))
            row["rel_error_error"] = _one_line(exc)
    row["measure_peak_rss_mb"] = peak_rss_mb()
    return row


def _inputs(src: Path, path: Path) -> None:
    """One generated batch for the fp32 model (validate's generator, seed 0), saved as .npz."""
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs, save_batch

    model = onnx.load(str(src), load_external_data=False)
    save_batch(path, generate(plan_inputs(describe_inputs(model)), seed=0))


def worker(name: str, batch: int, small: bool, cache: Path, out: Path) -> None:
    """Build (or take from the cache), convert and measure one model; write its result to `out`."""
    spec, _ = _builders(small)[name]
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{name}{'_small' if small else ''}_b{batch}"
    src, inputs = cache / f"{stem}.onnx", cache / f"{stem}.inputs.npz"
    log = cache / f"{stem}.build.json"
    start = time.perf_counter()
    if not src.exists():
        log.write_text(json.dumps(export(name, batch, small, src)) + "\n")
    if not inputs.exists():
        _inputs(src, inputs)
    built = time.perf_counter() - start
    result = {"model": name, "info": spec.info, "build": json.loads(log.read_text()) if log.exists() else {},
              "build_seconds": round(built, 1), "rows": []}  # fmt: skip
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        converted = _convert_all(spec, src, Path(tmp))
        for label in CONVERSIONS:
            if label not in converted:
                continue
            path, error, seconds = converted[label]
            print(f"  {name}: {label}", file=sys.stderr, flush=True)
            if path is None:
                result["rows"].append({"conversion": label, "ok": False, "error": error})
                continue
            reference = src
            if label.startswith("ort-opt ") and label != "ort-opt fp32":
                reference = converted["ort-opt fp32"][0] or src  # the precision's error, not the fusions'
            try:
                row = _measure_apart(spec, label, path, reference, inputs, batch)
            except Exception as exc:
                row = {"conversion": label, "ok": False, "error": "measuring: " + _one_line(exc)}
            row["convert_seconds"] = round(seconds, 2)
            result["rows"].append(row)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["peak_rss_mb"] = peak_rss_mb()
    out.write_text(json.dumps(result) + "\n")


def peak_rss_mb() -> int:
    """This process's peak resident memory (VmHWM), MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM:"))


def _measure_apart(*args) -> dict:
    """_measure in a fresh process: a validation of GPT-2 at batch 8 peaks at 9.5 GB and the
    allocator keeps much of it, so rows measured one after the other in one process add up."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_measure, *args).result()
        except BrokenProcessPool:
            return {"conversion": args[1], "ok": False, "error": "measuring: the process died (out of memory?)"}


def run_model(name: str, args) -> dict:
    """`name` measured in a process of its own; its failure (or crash) becomes the model's error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--worker", name, "--batch", str(args.batch), "--cache", str(args.cache),
               "--worker-out", str(out)] + (["--small"] if args.small else [])  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        last: collections.deque = collections.deque(maxlen=20)
        assert proc.stderr is not None
        for line in proc.stderr:  # the worker's progress lines are shown, the libraries' chatter kept
            if line.startswith(f"  {name}: "):
                print(line.rstrip(), file=sys.stderr, flush=True)
            elif line.strip():
                last.append(line.rstrip())
        code = proc.wait()
        if code == 0 and out.exists():
            return json.loads(out.read_text())
        if code < 0:  # a signal: SIGKILL is what the kernel's out-of-memory killer sends
            why = f"killed by signal {-code}" + (" (out of memory?)" if code == -9 else "")
        else:
            why = next((x for x in reversed(last) if not x.startswith(" ")), "no message")[:200]
        return {"model": name, "error": f"{why} (exit {code})"}


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for pkg in ("onnx", "onnxruntime", "onnxconverter-common", "torch", "transformers"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} missing")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    changed = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})  # fmt: skip
    dirty = len([x for x in changed.stdout.splitlines() if x.strip()])
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    return (
        f"{when}, commit {commit or '?'} ({dirty} tracked files modified in the tree, code {code_hash()}); "
        + ", ".join(parts)
    )


def code_hash() -> str:
    """A short hash of the tool's code and rules as they are in the working tree (others may edit
    it while a run goes on: the report says when it changed under the run)."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted([*(ROOT / "autocast_onnx").rglob("*.py"), *(ROOT / "rules").rglob("*.toml")]):
        digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


NOTE = (
    "rel error: the largest relative error over the outputs against fp32, emulated fp16; the ort-opt rows "
    "below ort-opt fp32 against ort-opt fp32 (whose own row gives what the fusions change)."
)


def report(results: list[dict], header: str) -> str:
    parts = [header, "", NOTE, "", table(results), "Ratios (the goals of issue 37):", "", ratio_table(ratios(results))]
    for ours, peer in (("autocast", "ort float16"), ("ort-opt -> autocast", "ort-opt --float16")):
        parts.append("")
        for res in results:
            row = _row(res, ours)
            if row is not None:
                parts.append(cast_text(res["model"], ours, row.get("cast_sites", [])))
        for res in results:
            a, b = _row(res, ours), _row(res, peer)
            if a is not None and b is not None:
                parts.append(op_diff_text(res["model"], a.get("by_op", {}), b.get("by_op", {}), ours, peer))
    return "\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {','.join(MODELS)}")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--cache", type=Path, default=CACHE, help="where exported models and inputs are kept")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    ap.add_argument("--small", action="store_true", help="small configurations of the same architectures")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.batch, args.small, args.cache, args.worker_out)
        return 0
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown or args.batch < 1:
        ap.error(f"unknown model(s) {unknown}; choose from {MODELS}" if unknown else "--batch must be >= 1")
    header = f"bench_gpu_plan: batch {args.batch}{', small configs' if args.small else ''}; {versions()}"
    print(header, flush=True)
    start, code = time.perf_counter(), code_hash()
    results = []
    for name in names:
        t0 = time.perf_counter()
        results.append(run_model(name, args))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    changed = "" if code_hash() == code else f"; the tool's code changed during the run (now {code_hash()})"
    text = report(results, f"total {time.perf_counter() - start:.0f} s{changed}")
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"header": header, "results": results, "ratios": ratios(results)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
