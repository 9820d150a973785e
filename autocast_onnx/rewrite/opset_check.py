"""The check behind `--opset N` (rewrite/opset.py): does the upgraded model compute what the original
does, and can the runtime run what the upgrade changed?

ONNX's version converter rewrites a node only where its op's schema changes between the two opsets,
and some of its adapters change what the node computes (Resize-10 `linear` loses its asymmetric
coordinates, Hardmax-11's axis becomes Hardmax-13's) or leave it as it was where its meaning moved. So
when any node's op version changes, the original and the upgraded fp32 model are run on the same
generated inputs in ONNX Runtime's CPU provider, with the graph optimizations validation uses (all;
none for a model with Q/DQ nodes: holds_qdq), and their outputs compared. Where they disagree, the
tensors both models compute are compared in the original's topological order, and the producer of
the first that disagrees is the node named (without such a tensor, the nodes whose op version
changed are). Only the outputs are fetched unless they
disagree, so a model the upgrade carries over correctly costs two sessions and one run of each, and
one whose op versions do not change costs nothing. The upgraded model is refused as well where it
takes other inputs than the original (Scan 8 -> 9 drops the model's batch axis), where it fails on
inputs the original runs on, and where ONNX Runtime finds it invalid though it loads the original
(GroupNormalization-18's per-group scale left as it was for opset 21, which reads it per channel).
Outputs that depend on random draws (a random op without a seed, a Dropout in training mode) are
not compared.

The tolerance is that of two fp32 computations of the same function, not of a low-precision one: an
element agrees when |upgraded - original| <= RTOL * |original| + ATOL * max(1, the output's largest
finite magnitude). A kernel that sums n terms in another order differs by about n * 2**-24 of the
magnitudes summed; RTOL = 1e-3 (about 16,000 fp32 units) leaves room for the different fusions and
summation orders the two opsets' kernels may take in a deep model, while what an adapter gets wrong
moves elements by their own size (Hardmax by 1, Resize's coordinates by half a pixel's difference).
Non-finite elements must sit where they sit in the original, integer and bool outputs must be equal.

This module is below `validate/` (which it may not import), so it opens ONNX Runtime itself when it is
importable, and generates its inputs as validation does: floats standard normal, integers within the
embedding table they index (else 0..99, masks and type ids 0 or 1), symbolic dimensions 3 for a batch,
16 for a sequence, 8 for others. When the comparison cannot be made (no onnxruntime, an input it
cannot generate, a model the CPU provider does not load or run at the model's own opset) it says so as
a warning, never silently; when the CPU provider has no kernel for an upgraded node, that is a warning
too (the model may be meant for another runtime), and so is an upgraded node that the runtime planned
for (`--runtime`, catalog/kernels.py) or, planned for none, the CPU provider cannot run at the low
precision that the upgrade lets planning give it (bf16 Conv-22)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, defs, helper

from ..catalog.kernels import has_kernel, missing_kernel, no_kernel_message
from ..dtypes import dtype_name
from ..graph.domains import normalize_domain

RTOL = 1e-3
ATOL = 1e-4
GENERATED_LIMIT = 256 * 2**20  # bytes of generated inputs: a larger model is not compared
BATCH_HINT = re.compile(r"batch|^n$|^b$", re.I)
SEQ_HINT = re.compile(r"seq|len|token|position|time|step", re.I)
DEFAULT_BATCH, DEFAULT_SEQ, DEFAULT_OTHER = 3, 16, 8
QUIET = 4  # ONNX Runtime's FATAL: its own log lines would repeat what the warning says
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\((\d+)\) node with name '([^']*)'")
# ONNX Runtime's words for a model that breaks the ONNX standard (its type and shape inference)
_INVALID = re.compile(r"INVALID_GRAPH|ShapeInferenceError|TypeInferenceError|Type Error")


@dataclass(frozen=True)
class OpsetWarning:
    """Something the upgrade could not check or the runtime cannot run: `kind` "unchecked" (the
    comparison was not made), "kernel" (a runtime has no kernel for an upgraded node) or "kept" (what
    the converter drops could not all be carried over); `node` names the node concerned, if one is."""

    kind: str
    message: str
    node: str | None = None


@dataclass(frozen=True)
class Changed:
    """A node whose op version the upgrade changes: its since-versions at the two opsets."""

    node: onnx.NodeProto
    path: str  # "main", or the path of the body or function it is in
    before: int
    after: int

    @property
    def label(self) -> str:
        name = f"'{self.node.name}'" if self.node.name else "(unnamed)"
        where = "" if self.path == "main" else f" in {self.path}"
        op = self.node.op_type
        deprecated = defs.get_schema(op, self.after, "").deprecated
        versions = (
            f"{op}-{self.before}, which opset {self.after} deprecates"
            if deprecated
            else f"{op}-{self.before} -> {op}-{self.after}"
        )
        return f"node {name} ({versions}){where}"


class Disagreement(Exception):
    """The upgraded model computes something else (the message says what and where)."""


# ---- the comparison -------------------------------------------------------------------------------
def compare(
    original: onnx.ModelProto, upgraded: onnx.ModelProto, changed: list[Changed], base_dir=None
) -> list[OpsetWarning]:
    """Run both fp32 models on generated inputs and compare them (see the module's text). Raises
    Disagreement naming the node where they disagree; returns the warnings of a comparison that could
    not be made, or of an upgraded node the CPU provider has no kernel for. Nothing to compare when no
    node's op version changed: then the converter changed nothing but the opset."""
    if not changed:
        return []
    rt = _runtime()
    if rt is None:
        return [_unchecked(changed, 'onnxruntime is not installed (pip install "autocast-onnx[cpu]")')]
    feeds, why = generated_feeds(original)
    if feeds is None:
        return [_unchecked(changed, why)]
    _refuse_other_inputs(original, upgraded, changed)
    folder = _external_folder(original, base_dir)
    version = f"ONNX Runtime {rt.__version__}"
    optimize = not holds_qdq(original)
    try:
        reference = _session(rt, original.SerializeToString(), folder, optimize)
    except Exception as exc:  # ORT raises its own exception types
        return [_unchecked(changed, f"{version}'s CPU provider does not load the original model: {_first(exc)}")]
    try:
        session = _session(rt, upgraded.SerializeToString(), folder, optimize)
    except Exception as exc:
        return [_load_failure(exc, version, changed)]
    try:
        want = reference.run(None, feeds)
    except Exception as exc:
        return [_unchecked(changed, f"the original model fails on generated inputs in {version}: {_first(exc)}")]
    try:
        got = session.run(None, feeds)
    except Exception as exc:
        raise Disagreement(
            f"the upgraded model fails on generated inputs on which the original runs ({_first(exc)}); "
            f"the upgrade changed {_listed(changed)}"
        ) from None
    names = [o.name for o in reference.get_outputs()]
    random = drawn(original.graph)
    if all(n in random for n in names):
        return [_unchecked(changed, "every output depends on random draws of an op without a seed")]
    compared = [(n, w, g) for n, w, g in zip(names, want, got, strict=False) if n not in random]
    bad = next(((n, w, g) for n, w, g in compared if differs(w, g)), None)
    if bad is None and len(want) == len(got):
        return []
    raise Disagreement(_localised(rt, original, upgraded, feeds, folder, changed, bad, optimize))


QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})


def holds_qdq(model: onnx.ModelProto) -> bool:
    """Whether the model holds Q/DQ nodes (in any graph): then both models run without ONNX Runtime's
    graph optimizations, as validation runs such a reference. Its fused int8 kernels (QLinearConv,
    ...) round differently from the Q/DQ arithmetic ONNX defines, and which of them apply depends on
    the op versions, so the two opsets' models could differ by a quantization step with the same
    meaning."""
    graphs = [model.graph, *(_function_graph(f) for f in model.functions)]
    return any(n.op_type in QDQ_OPS and normalize_domain(n.domain) == "" for g in graphs for n in _walk(g))


def _function_graph(f: onnx.FunctionProto) -> onnx.GraphProto:
    graph = onnx.GraphProto()
    graph.node.extend(f.node)
    return graph


def _walk(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for body in _graphs(attr):
                yield from _walk(body)


def _refuse_other_inputs(original: onnx.ModelProto, upgraded: onnx.ModelProto, changed: list[Changed]) -> None:
    """Raise Disagreement where the upgraded model takes other inputs than the original (names, types,
    declared dimensions): an adapter that changed the model's interface (Scan 8 -> 9 drops the batch
    axis of the model's inputs) makes a model that no longer takes the original's inputs."""
    before = {v.name: _type_text(v.type) for v in original.graph.input}
    after = {v.name: _type_text(v.type) for v in upgraded.graph.input}  # (denotations aside: the converter drops them)
    for name, kind in before.items():
        if after.get(name) != kind:
            now = f"is {after[name]}" if name in after else "is gone"
            raise Disagreement(
                f"the upgraded model takes other inputs than the original: its input '{name}' {now} where the "
                f"original's is {kind}; the upgrade changed {_listed(changed)}"
            )
    extra = [n for n in after if n not in before]
    if extra:
        raise Disagreement(
            f"the upgraded model takes an input the original does not, '{extra[0]}'; the upgrade changed "
            f"{_listed(changed)}"
        )


def _type_text(kind: onnx.TypeProto) -> str:
    t = kind.tensor_type
    if kind.WhichOneof("value") != "tensor_type":
        return kind.WhichOneof("value") or "untyped"
    dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    shape = f"[{', '.join(dims)}]" if t.HasField("shape") else "of any shape"
    return f"{dtype_name(t.elem_type)} {shape}"


RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial"}
)


def drawn(graph: onnx.GraphProto) -> set[str]:
    """The tensors of `graph` that depend on random draws: the outputs of a random op without a seed
    (a Dropout fed a training_mode; a node whose bodies hold such an op), and all they reach. The two
    models draw differently, so these are not compared."""
    found: set[str] = set()
    off = {t.name for t in graph.initializer if t.data_type == TensorProto.BOOL and not _any_true(t)}
    for node in topological(graph):
        if _draws(node, off) or any(i in found for i in _reads(node)):
            found.update(o for o in node.output if o)
    return found


def _any_true(t: onnx.TensorProto) -> bool:
    try:
        return bool(np.any(onnx.numpy_helper.to_array(t)))
    except Exception:  # external data not at hand: it may be on
        return True


def _draws(node: onnx.NodeProto, off: set[str]) -> bool:
    """Whether the node draws random numbers: a random op without a seed, a Dropout whose training_mode
    is not an initializer holding False, or a node whose bodies hold one."""
    seeded = any(a.name == "seed" for a in node.attribute)
    if normalize_domain(node.domain) == "" and not seeded:
        training = node.op_type == "Dropout" and len(node.input) > 2 and node.input[2] not in ("", *off)
        if node.op_type in RANDOM_OPS or training:
            return True
    return any(_draws(inner, off) for attr in node.attribute for body in _graphs(attr) for inner in body.node)


def _graphs(attr: onnx.AttributeProto) -> list[onnx.GraphProto]:
    return [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)


def differs(want, got) -> str | None:
    """How `got` departs from `want` beyond fp32 noise (see the module's text), or None."""
    want, got = np.asarray(want), np.asarray(got)
    if want.shape != got.shape:
        return f"has shape {list(got.shape)} where the original's has {list(want.shape)}"
    if want.dtype != got.dtype:
        return f"is {got.dtype} where the original's is {want.dtype}"
    if not np.issubdtype(want.dtype, np.floating):
        wrong = int(np.count_nonzero(want != got))
        return f"differs in {wrong} of {want.size} elements" if wrong else None
    w, g = want.astype(np.float64), got.astype(np.float64)
    finite = np.isfinite(w)
    if not np.array_equal(finite, np.isfinite(g)) or not np.array_equal(w[~finite], g[~finite], equal_nan=True):
        return "has infinities or NaNs where the original has none, or none where it has them"
    if not finite.any():
        return None
    scale = max(1.0, float(np.abs(w[finite]).max()))
    gap = np.abs(g[finite] - w[finite])
    over = gap > RTOL * np.abs(w[finite]) + ATOL * scale
    if not over.any():
        return None
    return f"differs by up to {float(gap.max()):.3g} in {int(over.sum())} of {want.size} elements"


def _localised(rt, original, upgraded, feeds, folder, changed: list[Changed], bad, optimize: bool) -> str:
    """What disagrees, where: the producer of the first tensor both models compute that disagrees
    (the original's topological order), else the nodes whose op version changed."""
    producers = {o: n for n in original.graph.node for o in n.output if o}
    made = {o for n in upgraded.graph.node for o in n.output if o}
    random = drawn(original.graph)
    names = [o for n in topological(original.graph) for o in n.output if o and o in made and o not in random]
    found: tuple[str, str | None] | None = None
    try:
        want = _session(rt, _fetching(original, names), folder, optimize).run(None, feeds)
        got = _session(rt, _fetching(upgraded, names), folder, optimize).run(None, feeds)
        found = next(((n, d) for n, w, g in zip(names, want, got, strict=True) if (d := differs(w, g))), None)
    except Exception:  # the intermediates could not all be fetched: name what changed instead
        found = None
    if found is None and bad is not None and bad[0] in producers:
        found = (bad[0], differs(bad[1], bad[2]))
    if found is None:
        return (
            "the upgraded model's outputs disagree with the original's on generated inputs; the upgrade changed "
            f"{_listed(changed)}"
        )
    name, how = found
    return (
        f"the upgraded model computes something else than the original on generated inputs, at "
        f"{_named(producers[name], changed)}: its output '{name}' {how}, so ONNX's version converter changed "
        "what the node computes"
    )


def _named(node: onnx.NodeProto, changed: list[Changed]) -> str:
    """The node as the refusal names it: its versions when the upgrade changed it, or the changed nodes
    it holds (in the bodies of a control-flow node, in the body of the model-local function it calls)."""
    own = next((c for c in changed if c.path == "main" and _same(c.node, node)), None)
    if own is not None:
        return own.label
    label = f"node '{node.name}' ({node.op_type})" if node.name else f"node (unnamed) ({node.op_type})"
    bodies = f"main/{node.name or node.op_type}."
    function = f"function {node.domain}:{node.op_type}" if node.domain else f"function {node.op_type}"
    inner = [c for c in changed if c.path.startswith(bodies) or c.path == function]
    return f"{label}, which holds {_listed(inner)}" if inner else label


def _same(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
    return a.name == b.name and a.op_type == b.op_type and list(a.output) == list(b.output)


def topological(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes in an order where each comes after the nodes whose outputs it reads (Kahn's
    algorithm, stable: the stored order where it already is one); nodes on a cycle are left out."""
    producer = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    waiting = [0] * len(graph.node)
    readers: list[list[int]] = [[] for _ in graph.node]
    for k, node in enumerate(graph.node):
        for src in {producer[i] for i in _reads(node) if i in producer and producer[i] != k}:
            waiting[k] += 1
            readers[src].append(k)
    ready = [k for k in range(len(graph.node)) if waiting[k] == 0]
    ready.reverse()
    order = []
    while ready:
        k = ready.pop()
        order.append(graph.node[k])
        for r in reversed(readers[k]):
            waiting[r] -= 1
            if waiting[r] == 0:
                ready.append(r)
    return order


def _reads(node: onnx.NodeProto) -> Iterator[str]:
    """The names a node reads: its inputs and what its bodies read from outside them."""
    yield from (i for i in node.input if i)
    for attr in node.attribute:
        for body in _graphs(attr):
            for inner in body.node:
                yield from _reads(inner)


def _fetching(model: onnx.ModelProto, names: list[str]) -> bytes:
    """`model` serialized with `names` as its outputs (untyped: ONNX Runtime infers them)."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    return probe.SerializeToString()


def _load_failure(exc: Exception, version: str, changed: list[Changed]) -> OpsetWarning:
    """The upgraded model does not load where the original does: a node the CPU provider has no kernel
    for at its new version (named), or another refusal of the runtime (an opset it does not know yet).
    Raises Disagreement where ONNX Runtime finds the upgraded model invalid (its type or shape
    inference fails: an adapter that left a node's inputs as they were where their meaning moved,
    GroupNormalization-18's per-group scale read as 21's per-channel one)."""
    said = _first(exc)
    match = _NO_KERNEL.search(said)
    if match is None and _INVALID.search(said):
        raise Disagreement(
            f"{version} refuses the upgraded model as invalid, though it loads the original ({said}); the "
            f"upgrade changed {_listed(changed)}"
        )
    if match is None:
        return _unchecked(changed, f"{version}'s CPU provider does not load the upgraded model: {said}")
    op, since, name = match.groups()
    node = next((c for c in changed if c.node.name == name and c.node.op_type == op), None)
    was = f" (the original's {op}-{node.before} runs there)" if node is not None else ""
    return OpsetWarning(
        "kernel",
        f"{version}'s CPU provider has no kernel for {op}-{since} (node '{name}'){was}: the upgraded model does "
        "not run on it, and could not be compared with the original; choose an opset below the one that "
        f"changed {op}, or run the model on a provider that has the kernel",
        name or None,
    )


def _unchecked(changed: list[Changed], why: str) -> OpsetWarning:
    return OpsetWarning(
        "unchecked",
        f"the upgraded model was not compared with the original ({why}): check that it computes the same "
        f"(autocast-onnx validate ORIGINAL UPGRADED); the upgrade changed {_listed(changed)}",
    )


def _listed(changed: list[Changed], most: int = 3) -> str:
    shown = ", ".join(c.label for c in changed[:most])
    return shown + (f" and {len(changed) - most} more node(s)" if len(changed) > most else "")


def _first(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


# ---- ONNX Runtime ---------------------------------------------------------------------------------
def _runtime():
    """The onnxruntime module, or None where it is not installed."""
    try:
        import onnxruntime
    except ImportError:
        return None
    onnxruntime.set_default_logger_severity(QUIET)
    return onnxruntime


def _session(rt, data: bytes, folder: str | None, optimize: bool = True):
    options = rt.SessionOptions()
    options.log_severity_level = QUIET
    if not optimize:
        options.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    if folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
    return rt.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _external_folder(model: onnx.ModelProto, base_dir) -> str | None:
    """The folder external data is read from (the model's own), when any tensor keeps its data there."""
    external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    return str(Path(base_dir or ".").resolve()) if external else None


# ---- generated inputs -----------------------------------------------------------------------------
def generated_feeds(model: onnx.ModelProto, seed: int = 0) -> tuple[dict | None, str]:
    """One batch of inputs for `model`'s main graph (see the module's text), or (None, why not)."""
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds: dict = {}
    total = 0
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        kind = vi.type.WhichOneof("value")
        t = vi.type.tensor_type
        if kind != "tensor_type" or t.elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
            return None, f"input '{vi.name}' is not a numeric tensor, which it cannot generate"
        shape = _shape(vi.name, t)
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        total += int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
        if total > GENERATED_LIMIT:
            return None, f"its generated inputs would take over {GENERATED_LIMIT // 2**20} MiB"
        feeds[vi.name] = _values(vi.name, t.elem_type, shape, _bound(model, vi.name, inits), rng)
    return feeds, ""


def _shape(name: str, t: onnx.TypeProto.Tensor) -> tuple:
    dims = []
    for k, d in enumerate(t.shape.dim):
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param:
            p = d.dim_param
            dims.append(DEFAULT_BATCH if BATCH_HINT.search(p) else DEFAULT_SEQ if SEQ_HINT.search(p) else DEFAULT_OTHER)
        else:
            dims.append(DEFAULT_BATCH if k == 0 else DEFAULT_OTHER)
    return tuple(dims)


def _values(name: str, elem_type: int, shape: tuple, bound: int | None, rng) -> np.ndarray:
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    if elem_type == TensorProto.BOOL:
        return np.asarray(rng.random(shape) < 0.5)
    if np.issubdtype(dtype, np.integer):
        lower = name.lower()
        high = bound if bound else 2 if ("mask" in lower or "type" in lower) else 100
        return np.asarray(rng.integers(0, high, size=shape)).astype(dtype)
    return np.asarray(rng.standard_normal(shape)).astype(dtype)


def _bound(model: onnx.ModelProto, name: str, tables: dict, depth: int = 0) -> int | None:
    """The size of the table an integer input indexes (a Gather of an initializer, through the ops
    that pass indices on), or None."""
    if depth > 4:
        return None
    for node in model.graph.node:
        for port, read in enumerate(node.input):
            if read != name:
                continue
            if node.op_type == "Gather" and port == 1 and tables.get(node.input[0]):
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                return int(tables[node.input[0]][axis])
            if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity") and port == 0:
                found = _bound(model, node.output[0], tables, depth + 1)
                if found:
                    return found
    return None


# ---- kernels of the runtime ----------------------------------------------------------------------
def kernel_warnings(
    changed: list[Changed], opsets: tuple[int, int], runtime: str | None, low_type: int | None
) -> list[OpsetWarning]:
    """The upgraded nodes the runtime cannot run (`opsets`: the model's before and after). With a
    kernel table (`runtime` cuda, tensorrt, dml): a node whose new version has no kernel at fp32 or at
    `low_type` where its old version has one (or the table cannot tell), one warning per op. Planned
    for no runtime: the nodes whose new version ONNX Runtime's CPU provider has no `low_type` kernel
    for, where their old version had one or did not admit the type (the upgrade is what lets planning
    give them that type), in one warning. Each names the first node of its op and counts the others."""
    groups: dict[tuple, list[Changed]] = {}
    for c in changed:
        if normalize_domain(c.node.domain) == "":
            groups.setdefault((c.node.op_type, c.before, c.after), []).append(c)
    found: list[OpsetWarning] = []
    on_cpu: list[Changed] = []
    for nodes in groups.values():
        first = nodes[0]
        more = f" and {len(nodes) - 1} more {first.node.op_type} node(s)" if len(nodes) > 1 else ""
        if runtime not in (None, "any"):
            why = _table_loss(runtime, first.node.op_type, opsets, first.before, low_type)
            if why is not None:
                found.append(OpsetWarning("kernel", f"{first.label}{more}: {why}", first.node.name or None))
        elif low_type is not None and _cpu_loses(first, low_type):
            on_cpu.extend(nodes)
    if on_cpu and low_type is not None:
        found.append(OpsetWarning("kernel", _cpu_message(on_cpu, low_type), on_cpu[0].node.name or None))
    return found


def _cpu_message(nodes: list[Changed], low_type: int) -> str:
    rt = _runtime()
    name = dtype_name(low_type)
    version = f"ONNX Runtime {rt.__version__}" if rt is not None else "ONNX Runtime"
    return (
        f"{version}'s CPU provider has no {name} kernel for the upgraded versions of {len(nodes)} node(s) that "
        f"planning may now give {name} ({_listed(nodes)}): planned {name}, they run only on a provider that has "
        "one (--runtime cuda plans for ONNX Runtime's CUDA provider)"
    )


def _table_loss(runtime: str, op: str, opsets: tuple[int, int], before: int, low_type: int | None) -> str | None:
    """Why `runtime`'s table has no kernel for the new version where it has one for the old (fp32,
    then the low type), or None."""
    old, new = opsets
    runs_low = low_type is not None and has_kernel(runtime, "", op, new, low_type) is True
    if has_kernel(runtime, "", op, new, TensorProto.FLOAT) is False and not runs_low:
        # (where the low type is known to run, float does too: the tables may be older than the probes)
        if has_kernel(runtime, "", op, old, TensorProto.FLOAT) is not False:
            return no_kernel_message(runtime, op, new, "float") + f" (its {op}-{before} has one)"
    if low_type is None:
        return None
    lost = missing_kernel(runtime, "", op, new, [low_type], {})
    if lost is not None and missing_kernel(runtime, "", op, old, [low_type], {}) is None:
        return lost + f" (its {op}-{before} has one); planning for {runtime} keeps the node fp32"
    return None


def _cpu_loses(c: Changed, low_type: int) -> bool:
    """Whether the CPU provider cannot run the new version in `low_type` though the old version ran in
    it or could not be planned in it (False where onnxruntime is not installed: the comparison says
    so)."""
    if _runtime() is None:
        return False
    op, attrs, ports = c.node.op_type, _attrs(c.node), (len(c.node.input), len(c.node.output))
    if _cpu_probe(op, c.after, low_type, attrs, *ports) != "no-kernel":
        return False
    return _cpu_probe(op, c.before, low_type, attrs, *ports) != "no-kernel"


def _attrs(node: onnx.NodeProto) -> bytes:
    """The node's attributes other than bodies, serialized (a probe's cache key and its attributes)."""
    kept = [a for a in node.attribute if a.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)]
    holder = onnx.NodeProto()
    holder.attribute.extend(kept)
    return holder.SerializeToString()


@cache
def _cpu_probe(op: str, since: int, low_type: int, attrs: bytes, n_in: int, n_out: int) -> str:
    """Whether the CPU provider runs a one-node model of `op` at its version `since` in `low_type`:
    "kernel", "no-kernel", or "invalid" (the schema does not admit the type, or the probe is not a
    model ONNX Runtime takes)."""
    rt = _runtime()
    try:
        schema = defs.get_schema(op, since, "")
    except defs.SchemaError:
        return "invalid"
    ports = _probe_types(schema, low_type, n_in, n_out)
    if ports is None:
        return "invalid"
    holder = onnx.NodeProto.FromString(attrs)
    inputs = [f"i{k}" if t else "" for k, t in enumerate(ports[0])]
    node = helper.make_node(op, inputs, [f"o{k}" for k in range(n_out)], name="probe")
    node.attribute.extend(holder.attribute)
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info(n, t, None) for n, t in zip(inputs, ports[0], strict=True) if n],
        [helper.make_tensor_value_info(f"o{k}", t, None) for k, t in enumerate(ports[1])],
    )
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", since)])
    probe.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", since)], ignore_unknown=True)
    try:
        _session(rt, probe.SerializeToString(), None, optimize=False)
    except Exception as exc:
        return "no-kernel" if _NO_KERNEL.search(str(exc)) else "invalid"
    return "kernel"


def _probe_types(schema, low_type: int, n_in: int, n_out: int) -> tuple[list, list] | None:
    """The element type of each port of a probe in `low_type`: the low type where the port's type
    parameter admits it, else float, int64, int32 or the first type it admits; None where the schema's
    first input does not admit the low type (nothing of the op computes in it)."""
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    low = f"tensor({'bfloat16' if low_type == TensorProto.BFLOAT16 else 'float16'})"

    def pick(formals, k: int) -> int:
        formal = formals[min(k, len(formals) - 1)]
        types = allowed.get(formal.type_str, {formal.type_str})
        for wanted in (low, "tensor(float)", "tensor(int64)", "tensor(int32)", *sorted(types)):
            if wanted in types:
                return _ELEM[wanted] if wanted in _ELEM else TensorProto.FLOAT
        return TensorProto.FLOAT

    if not schema.inputs or low not in allowed.get(schema.inputs[0].type_str, {schema.inputs[0].type_str}):
        return None
    return [pick(schema.inputs, k) for k in range(n_in)], [pick(schema.outputs, k) for k in range(n_out)]


_ELEM = {f"tensor({name.lower()})": value for name, value in TensorProto.DataType.items() if value and name != "STRING"}
_ELEM.update({"tensor(float)": TensorProto.FLOAT, "tensor(double)": TensorProto.DOUBLE})
_ELEM.update({"tensor(float16)": TensorProto.FLOAT16, "tensor(bfloat16)": TensorProto.BFLOAT16})
