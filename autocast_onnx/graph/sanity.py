"""Input checks: a model that breaks the ONNX format is the input's fault. It is refused before
any work, with one line that names the tensor, node or function at fault (AutocastError, exit 2),
never left to fail later as an internal error (exit 3) nor converted as if nothing were wrong.
`load_checked` (every command's load) and `check_input` (a model given in memory) run:

- Own checks, for what onnx.checker does not look at or reports without a name: the header (IR
  version, opset imports), local functions that call themselves, the types of the main graph's
  inputs and outputs, and every tensor of the model (initializers and sparse initializers of
  every graph, attribute tensors of every node, in bodies and local functions too): a known data
  type, dims that are not negative and describe a tensor that can exist, and exactly dims x
  element size of data, inline (raw or typed) or in external data.
- onnx.checker.check_model without shape inference: nodes against their schemas, attributes,
  graphs, functions. Tensors left in external data are set aside while it runs (it would look
  for their files relative to the current folder, not the model's). Where it refuses what this
  tool accepts (an unsorted graph, an input or output without a shape, an unnamed graph, an op
  onnx does not know), it checks a stand-in without those: a copy of the model whose main-graph
  initializers are declared as inputs, so that their payloads are not copied. Graph structure
  the index refuses in its own words (cycles, names read but never defined, names defined twice)
  is left to it.

Every tensor that can hold external data keeps to the loader's folder rule (io.external_location):
a location outside the model's folder is refused before anything is read. Attribute and sparse
tensors are then read into memory, so that no later reader looks for their file anywhere else;
initializers stay on disk and are read from the model's folder when needed.

Cost, benchmarks/bench_convert.py --sizes 100000 (100k nodes, 30k initializers, 1.5 s to convert):
the own checks ~0.1 s (2 us an initializer, 0.4 us a node; the initializers the loader left in the
file and checked are skipped), onnx.checker ~0.15 s. `convert` skips the latter where it checks its output
(check_input(onnx_checker=False)): a node the conversion leaves malformed fails the output check,
and convert_file then checks the input from its file (blame_input) to say whose fault it is.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto

from ..errors import AutocastError
from ..io import (
    LeftInFile,
    LoadedModel,
    external_location,
    load_external_data,
    load_external_tensor,
    load_model,
)
from .domains import normalize_domain

HINT = "fix the model or re-export it"
_KNOWN_TYPES = frozenset(v for v in TensorProto.DataType.values() if v != TensorProto.UNDEFINED)
# bits per element of each type whose payload size follows from its dims (others: not checked)
_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (
        ("FLOAT", 32),
        ("UINT8", 8),
        ("INT8", 8),
        ("UINT16", 16),
        ("INT16", 16),
        ("INT32", 32),
        ("INT64", 64),
        ("BOOL", 8),
        ("FLOAT16", 16),
        ("DOUBLE", 64),
        ("UINT32", 32),
        ("UINT64", 64),
        ("COMPLEX64", 64),
        ("COMPLEX128", 128),
        ("BFLOAT16", 16),
        ("FLOAT8E4M3FN", 8),
        ("FLOAT8E4M3FNUZ", 8),
        ("FLOAT8E5M2", 8),
        ("FLOAT8E5M2FNUZ", 8),
        ("FLOAT8E8M0", 8),
        ("UINT4", 4),
        ("INT4", 4),
        ("FLOAT4E2M1", 4),
        ("UINT2", 2),
        ("INT2", 2),
    )
    if hasattr(TensorProto, name)
}
# the typed field holding each type's values, and how many entries one element takes
_TYPED: dict[int, tuple[str, int]] = {
    TensorProto.FLOAT: ("float_data", 1),
    TensorProto.COMPLEX64: ("float_data", 2),
    TensorProto.DOUBLE: ("double_data", 1),
    TensorProto.COMPLEX128: ("double_data", 2),
    TensorProto.INT64: ("int64_data", 1),
    TensorProto.UINT32: ("uint64_data", 1),
    TensorProto.UINT64: ("uint64_data", 1),
    TensorProto.STRING: ("string_data", 1),
    # one int32 per element
    **dict.fromkeys(
        (
            TensorProto.UINT8,
            TensorProto.INT8,
            TensorProto.UINT16,
            TensorProto.INT16,
            TensorProto.INT32,
            TensorProto.BOOL,
            TensorProto.FLOAT16,
            TensorProto.BFLOAT16,
            TensorProto.FLOAT8E4M3FN,
            TensorProto.FLOAT8E4M3FNUZ,
            TensorProto.FLOAT8E5M2,
            TensorProto.FLOAT8E5M2FNUZ,
        ),
        ("int32_data", 1),
    ),
}
_MAX_BYTES = 2**62  # no tensor is larger: dims asking for more overflow or cannot exist
_UNCHECKED_DOMAIN = "autocast.unchecked"  # ops onnx does not know go here in the checker's stand-in


# ---- entry points ------------------------------------------------------------------------------
def load_checked(path, load_external: bool = True, **options) -> LoadedModel:
    """io.load_model, then check_input on the model before its external data is read into memory
    (load_external): a malformed model is refused before any work. `options` go to load_model."""
    loaded = check_loaded(load_model(path, load_external=False, **options))
    if load_external:
        load_external_data(loaded)
    return loaded


def check_loaded(loaded: LoadedModel) -> LoadedModel:
    """check_input on a model io.load_model read from its file (`loaded`, its external data not yet
    read): the second half of load_checked, for a caller that looks at the header first."""
    assert loaded.path is not None
    where = str(loaded.path)
    loaded.typed_outputs = check_input(loaded.model, where, loaded.path.parent, left_in_file=loaded.left_in_file)
    return loaded


def check_input(
    model: onnx.ModelProto,
    where: str = "<model>",
    base_dir: Path | None = None,
    onnx_checker: bool = True,
    left_in_file: LeftInFile | None = None,
) -> list[str]:
    """Refuse a malformed model (AutocastError naming what is wrong and where). `base_dir` is the
    model's folder (None: a model built in memory), which external data must stay inside. A graph
    output declared without a type (main graph or body) is given, in place, the type ONNX type
    inference gives it, as ONNX Runtime infers it when it loads the model (type_untyped_outputs);
    returns a note for each output so typed.

    `onnx_checker=False` leaves out onnx.checker (1.3 us a node) for a conversion whose output
    it checks anyway: a node the conversion leaves malformed fails there, and the conversion
    then blames the input (blame_input). The own checks, which find what would crash or be
    converted wrongly, always run. `left_in_file` (the loader's, io.load_model(parse=...), fast/in_file.py,
    for `model` as loaded) names the initializers whose payloads the loader left in the model's
    file after checking each against the parse: they are not checked twice (check_initializers)."""
    try:
        check_header(model, where)
        check_functions(model, where)
        typed = type_untyped_outputs(model)
        check_io_types(model.graph, where)
        files: dict = {}
        left = left_in_file.ordinals if left_in_file is not None else frozenset()
        on_disk = check_initializers(model.graph, where, base_dir, files, left)
        on_disk.extend(check_other_tensors(model, where, base_dir, files))
        if onnx_checker:
            _run_checker(model, where, on_disk)
    except RecursionError:
        raise AutocastError("the model nests subgraphs too deeply to be read", where, HINT) from None
    return typed


def blame_input(path) -> None:
    """After a conversion of the model at `path` failed unexpectedly (its output failed
    onnx.checker, or an exception): raise the input's defect (AutocastError) if the model is
    malformed, so that a bad model is not reported as a bug. Read again from the file: the
    conversion edited the model in memory. Returns when the model passes (the failure is ours)."""
    try:
        load_checked(path, load_external=False)
    except AutocastError:
        raise
    except Exception:  # the file cannot even be read back as it was: not the input's fault to say
        return


# ---- header, functions, types ------------------------------------------------------------------
def check_header(model: onnx.ModelProto, where: str) -> None:
    """The IR version is one this onnx package reads, and the opset imports name each domain once
    with a positive version."""
    ir = model.ir_version
    if ir <= 0:
        raise AutocastError("the model has no IR version (ir_version is not set)", where, HINT)
    if ir > onnx.IR_VERSION:
        raise AutocastError(
            f"IR version {ir} is newer than the installed onnx package reads ({onnx.IR_VERSION})",
            where,
            "export the model with an older IR version, or upgrade onnx",
        )
    if not model.opset_import:
        raise AutocastError("the model has no opset_import (which ops it uses is unknown)", where, HINT)
    seen: set[str] = set()
    for opset in model.opset_import:
        domain = normalize_domain(opset.domain)
        shown = repr(opset.domain or "ai.onnx")
        if domain in seen:
            raise AutocastError(f"opset_import names domain {shown} twice", where, HINT)
        seen.add(domain)
        if opset.version <= 0:
            raise AutocastError(f"opset_import gives domain {shown} version {opset.version}", where, HINT)


def check_functions(model: onnx.ModelProto, where: str) -> None:
    """No model-local function calls itself, directly or through others (ONNX forbids it, and
    anything that expands the calls would never end)."""
    calls = {
        (f.domain, f.name, f.overload): {(n.domain, n.op_type, n.overload) for n in f.node} for f in model.functions
    }
    for start in calls:
        cycle = _call_cycle(start, calls)
        if cycle is not None:
            path = " -> ".join(name for _, name, _ in cycle)
            raise AutocastError(f"model-local function {cycle[0][1]!r} calls itself ({path})", where, HINT)


def _call_cycle(start, calls: dict) -> list | None:
    """The calls from `start` back to `start`, if any (depth-first, iterative)."""
    stack = [(start, [start])]
    seen = set()
    while stack:
        name, path = stack.pop()
        for callee in calls[name]:
            if callee == start:
                return [*path, callee]
            if callee in calls and callee not in seen:
                seen.add(callee)
                stack.append((callee, [*path, callee]))
    return None


def type_untyped_outputs(model: onnx.ModelProto) -> list[str]:
    """Where a main-graph output is declared without a type, or with a tensor type without an
    element type (exporters leave If results so), give it and every body output declared so the
    type that ONNX type inference gives it, in place: ONNX Runtime infers the same when it loads
    the model. An output inference cannot type is left as it is (check_io_types refuses it in the
    main graph). Returns one note per output typed, naming it and its type. A model whose main
    outputs are all typed costs a look at them: the index types untyped body outputs from their
    producers itself."""
    if not any(_untyped(v) for v in model.graph.output):
        return []
    untyped = [
        (path, k) for path, graph in _graph_paths(model.graph) for k, v in enumerate(graph.output) if _untyped(v)
    ]
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
        return []  # nothing to learn from it: the output stays untyped, and is refused where that matters
    mine, theirs = dict(_graph_paths(model.graph)), dict(_graph_paths(inferred.graph))
    notes = []
    for path, k in untyped:
        found = theirs[path].output[k] if path in theirs and k < len(theirs[path].output) else None
        if found is None or _untyped(found):
            continue
        value = mine[path].output[k]
        value.type.CopyFrom(found.type)
        shown = _shown_type(found.type)
        scope = "graph output" if not path else "body output"
        notes.append(f"{scope} {value.name!r} is declared without a type: typed {shown} by ONNX type inference")
    return notes


def _shown_type(type_proto: onnx.TypeProto) -> str:
    """A tensor type as `float[1, N]` (a scalar `float[]`; no shape: `float`); others as onnx prints them."""
    if type_proto.WhichOneof("value") != "tensor_type":
        return onnx.helper.printable_type(type_proto)
    tensor = type_proto.tensor_type
    name = TensorProto.DataType.Name(tensor.elem_type).lower()
    if not tensor.HasField("shape"):
        return name
    dims = [str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in tensor.shape.dim]
    return f"{name}[{', '.join(dims)}]"


def _untyped(value: onnx.ValueInfoProto) -> bool:
    """No type, an empty type, or a tensor type without an element type."""
    kind = value.type.WhichOneof("value") if value.HasField("type") else None
    return kind is None or (kind == "tensor_type" and value.type.tensor_type.elem_type == TensorProto.UNDEFINED)


def _graph_paths(graph: onnx.GraphProto) -> Iterator[tuple[tuple, onnx.GraphProto]]:
    """(path, graph) for `graph` (path ()) and every body inside it; a body's path is its node's
    position, attribute name and index in the graph above, appended to that graph's path, so that
    two copies of one model give the same paths (iterative: any depth)."""
    stack: list[tuple[tuple, onnx.GraphProto]] = [((), graph)]
    while stack:
        path, each = stack.pop()
        yield path, each
        for n, node in enumerate(each.node):
            if not _may_hold_graphs(node.op_type):
                continue
            for attr in node.attribute:
                bodies = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
                stack.extend(((*path, (n, attr.name, b)), body) for b, body in enumerate(bodies))


@cache
def _may_hold_graphs(op_type: str) -> bool:
    """Whether a node of this op type may have a graph attribute (as _may_hold_tensors decides
    for tensors): a default-domain op whose schema declares none has none."""
    if not onnx.defs.has(op_type):
        return True
    graphs = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
    return any(a.type in graphs for a in onnx.defs.get_schema(op_type).attributes.values())


def check_io_types(graph: onnx.GraphProto, where: str) -> None:
    """Every input and output of the main graph has a type, with element types onnx knows."""
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            what = f"graph {kind} {value.name!r}"
            if not value.HasField("type"):
                raise AutocastError(f"{what} has no type", where, HINT)
            _check_type(value.type, what, where)


def _check_type(type_proto: onnx.TypeProto, what: str, where: str) -> None:
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        elem = getattr(type_proto, kind).elem_type
        if elem not in _KNOWN_TYPES:
            shown = "no element type" if elem == 0 else f"unknown element type {elem}"
            raise AutocastError(f"{what} has {shown}", where, HINT)
    elif kind in ("sequence_type", "optional_type"):
        inner = getattr(type_proto, kind)
        if not inner.HasField("elem_type"):
            raise AutocastError(f"{what} is a {kind.split('_')[0]} without an element type", where, HINT)
        _check_type(inner.elem_type, what, where)
    elif kind == "map_type":
        if type_proto.map_type.key_type not in _KNOWN_TYPES or not type_proto.map_type.HasField("value_type"):
            raise AutocastError(f"{what} is a map without a key or value type", where, HINT)
        _check_type(type_proto.map_type.value_type, what, where)
    elif kind is None:
        raise AutocastError(f"{what} has an empty type", where, HINT)


# ---- tensors -----------------------------------------------------------------------------------
def check_initializers(
    graph: onnx.GraphProto, where: str, base_dir: Path | None, files: dict, left: Collection[int] = frozenset()
) -> list[TensorProto]:
    """check_tensor on every initializer of the main graph (the loader checked the locations of
    those in external data; here their sizes are compared with their dims); returns those in
    external data. `left` holds the ordinals of those the loader left in the model's own file,
    checked there already (io._left_in_file: fp32, no other payload, external data exactly
    inside that file, dims not negative and of exactly its bytes): they are not checked again."""
    on_disk = []
    for ordinal, tensor in enumerate(graph.initializer):
        if ordinal in left:
            on_disk.append(tensor)
        elif not _plainly_sound(tensor):
            check_tensor(tensor, f"initializer {tensor.name!r}", where, base_dir, files)
            if tensor.data_location == TensorProto.EXTERNAL:
                on_disk.append(tensor)
    return on_disk


# TensorProto fields a plainly sound tensor may have besides dims (1), data_type (2), raw_data (9)
# and data_location (14): name (8), doc_string (12), metadata_props (16)
_NO_PAYLOAD = frozenset({8, 12, 16})


def _plainly_sound(tensor: TensorProto) -> bool:
    """True for the common case, in as few reads as it takes (2 us a tensor): inline raw_data of
    a fixed-size type, of exactly the size its dims give, and no other data. False says nothing:
    check_tensor then looks at everything.

    The fields are read as ListFields gives those present, never by asking for one that may be
    absent: a repeated field (float_data, ...) read from a parsed message that lacks it is given
    to it, empty, and every later pass over the model (the rewrite, the save, the output check)
    slows down, by ~0.05 s at 100k nodes for the typed field of every initializer."""
    raw = dims = None
    dtype = 0
    for descriptor, value in tensor.ListFields():
        number = descriptor.number
        if number == 9:
            raw = value
        elif number == 1:
            dims = value[:]
        elif number == 2:
            dtype = value
        elif number == 14:
            if value == TensorProto.EXTERNAL:
                return False
        elif number not in _NO_PAYLOAD:
            return False  # typed data, segment, external data: check_tensor says whether that is fine
    bits = _BITS.get(dtype)
    if bits is None or not raw:
        return False
    if dims is None:
        return len(raw) == (bits + 7) // 8  # a scalar
    count = math.prod(dims)
    return len(raw) == (count * bits + 7) // 8 and count >= 0 and not (dims and min(dims) < 0)


def check_tensor(
    tensor: TensorProto, what: str, where: str, base_dir: Path | None = None, files: dict | None = None
) -> None:
    """A known data type, dims that are not negative and describe a tensor that can exist, and
    exactly dims x element size of data: raw_data, the typed field of its type, or external data
    inside `base_dir` (the location is checked, nothing is read). Data given twice over is
    refused too (onnx.checker refuses the rest of what a value field can hold wrong)."""
    dtype = tensor.data_type
    bits = _BITS.get(dtype)
    external = tensor.data_location == TensorProto.EXTERNAL
    if external and base_dir is None:
        raise AutocastError(f"{what} uses external data but the model has no folder", where, "load its file")
    if bits is None and dtype not in _KNOWN_TYPES:
        shown = "no data type (UNDEFINED)" if dtype == 0 else f"unknown data type {dtype}"
        raise AutocastError(f"{what} has {shown}", where, HINT)
    dims = tensor.dims[:]
    count = math.prod(dims)
    if count < 0 or (dims and min(dims) < 0):
        raise AutocastError(f"{what} has a negative dimension in dims {list(dims)}", where, HINT)
    if bits is not None and count * bits > 8 * _MAX_BYTES:
        raise AutocastError(
            f"{what}: dims {list(dims)} describe {count} elements, more than any tensor holds", where, HINT
        )
    field, per = _TYPED.get(dtype, ("", 1))
    typed = len(getattr(tensor, field)) if field else 0
    if tensor.HasField("raw_data"):
        if external or typed:
            held = "external data" if external else field
            raise AutocastError(f"{what} holds its data twice (raw_data and {held})", where, HINT)
        if dtype == TensorProto.STRING:
            raise AutocastError(f"{what} is a STRING tensor with raw_data (strings go in string_data)", where, HINT)
        _check_size(len(tensor.raw_data), count, bits, dtype, dims, what, where, "raw_data")
    elif external:
        if typed:
            raise AutocastError(f"{what} holds its data twice ({field} and external data)", where, HINT)
        assert base_dir is not None  # refused above
        _, _, size, _ = external_location(tensor, base_dir, where, files, what)
        if dtype != TensorProto.STRING:
            _check_size(size, count, bits, dtype, dims, what, where, "external data")
    elif field and not tensor.HasField("segment") and typed != count * per:
        type_name = TensorProto.DataType.Name(dtype)
        raise AutocastError(
            f"{what}: {field} holds {typed} values, but dims {list(dims)} of {type_name} need {count * per}",
            where,
            HINT,
        )


def _check_size(size, count, bits, dtype, dims, what, where, holder) -> None:
    if bits is None:
        return
    need = (count * bits + 7) // 8
    if size != need:
        type_name = TensorProto.DataType.Name(dtype)
        raise AutocastError(
            f"{what}: {holder} holds {size} bytes, but dims {list(dims)} of {type_name} need {need}", where, HINT
        )


# ---- every other tensor: subgraph initializers, sparse initializers, attribute tensors --------
def check_other_tensors(model: onnx.ModelProto, where: str, base_dir: Path | None, files: dict) -> list[TensorProto]:
    """check_tensor on every tensor of the model but the main graph's initializers (checked by
    check_initializers): subgraph initializers, sparse initializers, the tensors of node
    attributes (Constant and ConstantOfShape values and any other, in subgraphs and local
    functions too). External data follows the loader's folder rule: attribute and sparse tensors
    are read into memory (so that no later reader looks for their file, nor anywhere else);
    subgraph initializers stay on disk (the index reads them when needed) and are returned."""
    on_disk = []
    for item, what, read in _other_tensors(model):
        if isinstance(item, onnx.SparseTensorProto):
            _check_sparse(item, what, where)
            continue
        check_tensor(item, what, where, base_dir, files)
        if item.data_location != TensorProto.EXTERNAL:
            continue
        if read:
            assert base_dir is not None  # check_tensor refuses external data without a folder
            load_external_tensor(item, base_dir, where, files, what)
        else:
            on_disk.append(item)
    return on_disk


def _check_sparse(sparse: onnx.SparseTensorProto, what: str, where: str) -> None:
    """Its indices in range and in order, and its shapes agreeing (its values and indices, read
    in, were checked just before)."""
    try:
        onnx.checker.check_sparse_tensor(sparse)
    except onnx.checker.ValidationError as exc:
        first = " ".join((str(exc).strip().splitlines() or ["onnx.checker refused it"])[0].split())
        raise AutocastError(f"{what} is malformed: {first}", where, HINT) from None


def _other_tensors(model: onnx.ModelProto) -> Iterator[tuple[TensorProto | onnx.SparseTensorProto, str, bool]]:
    """(tensor, its name in errors, whether to read it in) for every tensor of the model but the
    main graph's initializers, each sparse tensor after its values and indices. Iterative, so
    that no depth of subgraphs is too deep."""
    for sparse in model.graph.sparse_initializer:
        yield from _sparse(sparse, f"sparse initializer {sparse.values.name!r}")
    pending: list[tuple[object, str]] = [(model.graph.node, "")]
    pending.extend((f.node, f" of function {f.name!r}") for f in model.functions)
    while pending:
        nodes, scope = pending.pop()
        for node in nodes:  # type: ignore[attr-defined]
            if _may_hold_tensors(node.op_type):
                yield from _attribute_tensors(node, scope, pending)


def _attribute_tensors(node: onnx.NodeProto, scope: str, pending: list):
    """The tensors of `node`'s attributes and of its subgraphs' initializers; its subgraphs'
    nodes go to `pending`."""
    for attr in node.attribute:
        kind = attr.type
        if kind not in _HOLDERS:
            continue
        label = f"node {node.name!r}{scope}, attribute {attr.name!r}"
        if kind == AttributeProto.TENSOR:
            yield attr.t, f"tensor {attr.t.name!r} ({label})", True
        elif kind == AttributeProto.TENSORS:
            for t in attr.tensors:
                yield t, f"tensor {t.name!r} ({label})", True
        elif kind == AttributeProto.SPARSE_TENSOR:
            yield from _sparse(attr.sparse_tensor, f"sparse tensor ({label})")
        elif kind == AttributeProto.SPARSE_TENSORS:
            for sparse in attr.sparse_tensors:
                yield from _sparse(sparse, f"sparse tensor ({label})")
        else:
            for graph in [attr.g] if kind == AttributeProto.GRAPH else list(attr.graphs):
                inner = f" of subgraph {attr.name!r} of node {node.name!r}{scope}"
                for tensor in graph.initializer:
                    yield tensor, f"initializer {tensor.name!r}{inner}", False
                for sparse in graph.sparse_initializer:
                    yield from _sparse(sparse, f"sparse initializer {sparse.values.name!r}{inner}")
                pending.append((graph.node, inner))


@cache
def _may_hold_tensors(op_type: str) -> bool:
    """Whether a node of this op type may have tensor or graph attributes: an op of the default
    domain whose schema declares none has none (onnx.checker refuses an attribute its schema
    does not declare); an op onnx does not know there (another domain's, or none) may. A node of
    another domain named like a default op is taken as that op: its attributes are onnx.checker's."""
    if not onnx.defs.has(op_type):
        return True
    return any(a.type in _HOLDERS for a in onnx.defs.get_schema(op_type).attributes.values())


_HOLDERS = frozenset(
    {
        AttributeProto.TENSOR,
        AttributeProto.TENSORS,
        AttributeProto.SPARSE_TENSOR,
        AttributeProto.SPARSE_TENSORS,
        AttributeProto.GRAPH,
        AttributeProto.GRAPHS,
    }
)


def _sparse(
    sparse: onnx.SparseTensorProto, what: str
) -> Iterator[tuple[TensorProto | onnx.SparseTensorProto, str, bool]]:
    """Its values and indices, both named as the sparse tensor (as the index names them), then
    the sparse tensor itself."""
    yield sparse.values, what, True
    yield sparse.indices, what, True
    yield sparse, what, True


# ---- onnx.checker ------------------------------------------------------------------------------
# graph structure the index refuses with its own words (graph/index.py)
_INDEX_SAYS = re.compile(
    r"topologically sorted|used as output names multiple times|initializer name is not unique"
    r"|is not an output of any node"
)
_TOLERATED = re.compile(r"topologically sorted|Field 'shape' of 'type' is required|Field 'name' of 'graph'")
_UNKNOWN_OP = re.compile(r"No Op registered for (\S+) with domain_version")
_CONTEXT = re.compile(r"==> Context: Bad node spec for node\. Name: (.*?) OpType:\s*(\S*)")


def _run_checker(model: onnx.ModelProto, where: str, on_disk: list[TensorProto]) -> None:
    """onnx.checker on the model with the tensors still on disk set aside; where it refuses what
    this tool accepts, on a stand-in (see the module's docstring)."""
    with _set_aside(on_disk):
        error = _checker_error(model)
        if error is not None and _tolerated(error):
            stand_in = _stand_in(model)
            error = _checker_error(stand_in) if stand_in is not None else None  # None: a cycle
    if error is None or _INDEX_SAYS.search(error):
        return  # a cycle, a dangling name, a name defined twice: the index refuses it in its own words
    raise AutocastError(f"not a valid ONNX model: {_words(error)}", where, HINT)


def _checker_error(model: onnx.ModelProto) -> str | None:
    """The checker's refusal, or None. A model it cannot even parse (nested deeper than protobuf's
    C++ parser reads, over 2 GiB) gets no verdict here: the index says what is wrong with it."""
    try:
        onnx.checker.check_model(model, full_check=False)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        return str(exc).strip() or type(exc).__name__
    except ValueError:
        return None
    return None


def _tolerated(error: str) -> bool:
    """Whether the checker refused something this tool accepts (which the stand-in removes)."""
    if _TOLERATED.search(error):
        return True
    unknown = _UNKNOWN_OP.search(error)
    return unknown is not None and not onnx.defs.has(unknown.group(1))


def _words(error: str) -> str:
    """The checker's first line, with its node context as 'in node NAME (OP)'."""
    flat = " ".join(error.split())
    text = flat.split("==>")[0].strip().rstrip(".") or "onnx.checker refused it"
    context = _CONTEXT.search(flat)
    if context:
        text += f" (in node {context.group(1)!r}, {context.group(2) or 'no op type'})"
    return text


@contextmanager
def _set_aside(tensors: list) -> Iterator[None]:
    """While inside, each external tensor looks like an empty one (dims [0], no data): the
    checker then checks everything else about it but does not look for its file, which it would
    look for relative to the current folder. Restored after."""
    saved = [(t, list(t.dims), [(e.key, e.value) for e in t.external_data]) for t in tensors]
    _empty(tensors)
    try:
        yield
    finally:
        for t, dims, entries in saved:
            del t.dims[:]
            t.dims.extend(dims)
            del t.external_data[:]
            for key, value in entries:
                entry = t.external_data.add()
                entry.key, entry.value = key, value
            t.data_location = TensorProto.EXTERNAL


def _empty(tensors) -> None:
    for t in tensors:
        del t.dims[:]
        t.dims.append(0)
        del t.external_data[:]
        t.ClearField("data_location")


# ---- the checker's stand-in --------------------------------------------------------------------
def _stand_in(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` without what onnx.checker refuses and this tool accepts: the main graph's
    initializers become inputs (checked by check_initializers; their payloads are not copied),
    external tensors elsewhere are set aside, every graph is sorted (None when one cannot be:
    a cycle or a dangling input), inputs and outputs without a shape get an empty one, unnamed
    graphs a name, and ops onnx does not know in the default domain move to a domain it does
    not check (the index and the op signatures judge them)."""
    copy = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(copy, name, getattr(model, name))
    copy.opset_import.extend(model.opset_import)
    copy.functions.extend(model.functions)
    source = model.graph
    graph = copy.graph
    graph.name = source.name or "main"
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    graph.sparse_initializer.extend(source.sparse_initializer)
    declared = {value.name for value in graph.input}
    for tensor in source.initializer:
        if tensor.name not in declared:
            declared.add(tensor.name)
            _declare(graph.input.add(), tensor)
    moved = False
    for each in _graphs(graph):
        if not _sort(each):
            return None
        _fill_shapes(each)
        moved = _move_unknown_ops(each.node) or moved
    for function in copy.functions:
        moved = _move_unknown_ops(function.node) or moved
    if moved:
        copy.opset_import.add(domain=_UNCHECKED_DOMAIN, version=1)
    return copy


def _declare(value: onnx.ValueInfoProto, tensor: TensorProto) -> None:
    value.name = tensor.name
    tensor_type = value.type.tensor_type
    tensor_type.elem_type = tensor.data_type
    shape = tensor_type.shape
    shape.SetInParent()
    for d in tensor.dims:
        shape.dim.add().dim_value = d


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every graph inside it, outermost first (iterative: any depth)."""
    stack = [graph]
    while stack:
        each = stack.pop()
        if not each.name:
            each.name = "subgraph"
        yield each
        for node in each.node:
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    stack.append(attr.g)
                elif attr.type == AttributeProto.GRAPHS:
                    stack.extend(attr.graphs)


def _fill_shapes(graph: onnx.GraphProto) -> None:
    for value in [*graph.input, *graph.output]:
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()


def _move_unknown_ops(nodes) -> bool:
    moved = False
    for node in nodes:
        if normalize_domain(node.domain) == "" and node.op_type and not onnx.defs.has(node.op_type):
            node.domain = _UNCHECKED_DOMAIN
            moved = True
    return moved


def _sort(graph: onnx.GraphProto) -> bool:
    """Put `graph`'s nodes in an order where each reads only what is defined before it (Kahn's
    algorithm; names read inside a node's subgraphs count as its inputs). False when no such
    order exists; names defined nowhere in this graph are taken to come from outside it."""
    nodes = list(graph.node)
    produced = {name: k for k, node in enumerate(nodes) for name in node.output if name}
    needs = [{produced[name] for name in _reads(node) if name in produced} - {k} for k, node in enumerate(nodes)]
    users: dict[int, list[int]] = {}
    for k, producers in enumerate(needs):
        for p in producers:
            users.setdefault(p, []).append(k)
    waiting = [len(producers) for producers in needs]
    ready = deque(k for k, w in enumerate(waiting) if w == 0)
    order: list[int] = []
    while ready:
        k = ready.popleft()
        order.append(k)
        for user in users.get(k, ()):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(order) != len(nodes):
        return False
    if order != list(range(len(nodes))):
        ordered = onnx.GraphProto()
        ordered.node.extend(nodes[k] for k in order)
        graph.ClearField("node")
        graph.node.extend(ordered.node)
    return True


def _reads(node: onnx.NodeProto) -> set[str]:
    """The names `node` reads: its inputs and the names its subgraphs read from outside them."""
    names = {name for name in node.input if name}
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs if attr.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) else ():
            defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                defined.update(inner.output)
            for inner in graph.node:
                names.update(name for name in _reads(inner) if name not in defined)
    return names
