"""Stage: final checks on the rewritten model. A failure here is a bug in autocast-onnx, not
bad input, so it raises InternalCheckError (a CheckerRefusal for onnx.checker) and is never
hidden, with one exception: when the input fails the same check the same way, the defect is the
input's, which the conversion kept (blame_input_for: exit 2, naming the defect and --check none).

onnxruntime-training writes a few of its own ops into the default domain (MaxPoolGrad,
AveragePoolGrad, SparseSoftmaxCrossEntropy(Grad)), which onnx.checker rejects even in the input.
Such a model is checked with those nodes moved to a domain the checker leaves alone, so that
everything else is still checked.

The input check (graph/sanity.py) accepts two things onnx.checker refuses: a main-graph input or
output with a type but no shape (which ONNX Runtime runs), and a graph without a name. The
rewrite keeps them as they are, so the output check refuses them no more than the input check
does: a model the checker refuses for them has its structure checked on a copy with those
shapes made empty and the graphs named, and (full check) its shapes and types inferred as it is,
where an empty shape would declare rank 0. Every other defect still fails."""

from __future__ import annotations

import re

import onnx

from ..dtypes import MIXABLE, dtype_name
from ..errors import AutocastError, InternalCheckError
from ..graph import NONTENSOR
from ..graph.domains import normalize_domain
from ..io import all_graphs, encoded_size

CHECK_LIMIT = 2**31 - 64 * 2**20
_ORT_DOMAIN = "com.microsoft"
# what the input check tolerates (graph/sanity.py, its checker stand-in), in the checker's words
_INPUT_TOLERATED = re.compile(r"Field 'shape' of 'type' is required|Field 'name' of 'graph'")


class CheckerRefusal(InternalCheckError):
    """onnx.checker refused the converted model: `said` is the checker's first line, `full`
    whether shape and type inference ran. A bug unless the input is refused alike
    (blame_input_for)."""

    def __init__(self, said: str, full: bool):
        super().__init__(f"the converted model fails onnx.checker: {said}")
        self.said = said
        self.full = full


def check_result(model: onnx.ModelProto | bytes, full: bool = True) -> None:
    """onnx.checker (with shape/type inference when `full`) on the converted model or its bytes;
    a failure is a CheckerRefusal (the conversion made a model the checker refuses) unless
    the input was at fault (_check_again)."""
    if isinstance(model, onnx.ModelProto) and encoded_size(model) > CHECK_LIMIT:
        return  # checked from the saved file instead (see convert_file)
    try:
        onnx.checker.check_model(model, full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        _check_again(model, exc, full)


def blame_input_for(failure: BaseException, source, where: str) -> None:
    """After a conversion failed with `failure`: when it is (or was caused by) a CheckerRefusal,
    run the same check on the input `source` (its path, or the model as the caller gave it) and
    raise an AutocastError (exit 2) if the input fails it the same way: the defect is the input's,
    which the conversion kept, not a bug. Returns otherwise (the failure stands)."""
    refusal = _refusal_in(failure)
    if refusal is None or source is None:
        return
    try:
        if isinstance(source, (onnx.ModelProto, bytes)):
            check_result(source, full=refusal.full)
        else:
            check_file(source, full=refusal.full)
    except CheckerRefusal as again:
        if _same_defect(again.said, refusal.said):
            raise AutocastError(
                f"the input model fails onnx.checker{' (full check)' if refusal.full else ''} as the converted one "
                f"does, a defect the conversion keeps: {refusal.said}",
                where,
                "fix the input model (re-export it), or pass --check none to write the converted model unchecked",
            ) from None
    except Exception:  # the input cannot even be checked again: the failure stands as it is
        return


def _refusal_in(failure: BaseException | None) -> CheckerRefusal | None:
    """The CheckerRefusal that `failure` is or was raised from (a stage wraps it), if any."""
    seen = 0
    while failure is not None and seen < 8:
        if isinstance(failure, CheckerRefusal):
            return failure
        failure = failure.__cause__ or failure.__context__
        seen += 1
    return None


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _same_defect(a: str, b: str) -> bool:
    """Whether two checker messages report the same defect: equal once the names they quote are
    left out (the conversion may rename a tensor the message names, e.g. a graph output's producer)."""
    return a == b or _QUOTED.sub("''", a) == _QUOTED.sub("''", b)


# Ops whose tensors are a container's elements: op -> (the container port, the tensor ports bound to
# its element type, "inputs" for every input). Ports are ("in" | "out", index).
_ELEMENT_PORTS: dict[str, tuple] = {
    "SequenceAt": (("in", 0), (("out", 0),)),
    "ConcatFromSequence": (("in", 0), (("out", 0),)),
    "OptionalGetElement": (("in", 0), (("out", 0),)),
    "SequenceConstruct": (("out", 0), "inputs"),
    "SplitToSequence": (("out", 0), (("in", 0),)),
    "SequenceInsert": (("in", 0), (("in", 1),)),
    "Optional": (("out", 0), (("in", 0),)),
}


def check_container_elements(nodes, final_type) -> None:
    """Every tensor that goes into a sequence or optional, or comes out of one, has the element
    type the container holds (graph.index tracks it as Value.elem; the rewrite never changes it).
    `final_type(node, side, k)` is the type port `k` of the rewritten node has (`side` "in" or
    "out"). onnx.checker's structural check (--check basic) does not see a mismatch, only the full
    check's type inference does, and ONNX Runtime refuses the model: so the rewrite checks this
    whatever --check says, at the cost of a dict lookup per node. A failure is a bug
    (InternalCheckError)."""
    for node in nodes:
        ports = _ELEMENT_PORTS.get(node.op)
        if ports is None or node.domain != "":
            continue
        container = _port(node, *ports[0])
        if container is None or container.dtype != NONTENSOR or container.elem is None:
            continue
        bound = ports[1] if ports[1] != "inputs" else tuple(("in", i) for i in range(len(node.inputs)))
        for side, k in bound:
            tensor = _port(node, side, k)
            if tensor is None or tensor.dtype not in MIXABLE:
                continue
            have = final_type(node, side, k)
            if have != container.elem:
                raise InternalCheckError(
                    f"node {node.label} ({node.op}): {'input' if side == 'in' else 'output'} {k} '{tensor.name}' "
                    f"would be {dtype_name(have)}, but '{container.name}', which it goes into or comes out of, holds "
                    f"{dtype_name(container.elem)}: ONNX Runtime would refuse the model"
                )


def _port(node, side: str, k: int):
    values = node.inputs if side == "in" else node.outputs
    return values[k] if k < len(values) else None


def check_file(path, full: bool = True) -> None:
    """onnx.checker on the written model at `path` (one too large to check in memory, or one
    whose weights are in external data), with the same allowances as check_result."""
    try:
        onnx.checker.check_model(str(path), full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        _check_again(onnx.load(str(path), load_external_data=False), exc, full)


def _check_again(model, exc: Exception, full: bool) -> None:
    """After the checker refused `model` with `exc`: check a copy without what it refused that the
    tool accepts (see the module's docstring), or raise InternalCheckError when the refusal is
    real. Each copy is checked the same way, which finds the next such thing, if any."""
    if _INPUT_TOLERATED.search(str(exc)):
        filled = _shapes_and_names_filled(model)
        if filled is not None:
            check_result(filled, full=False)
            if full:  # on the model as it is: an empty shape in the copy would declare rank 0
                _check_inference(model)
            return
    patched = _ort_default_domain_ops_moved(model) or _sparse_made_dense(model)
    if patched is None:
        raise _failure(exc, full) from exc
    check_result(patched, full)


def _check_inference(model) -> None:
    """The full check's shape and type inference (strict, types checked) without the structural
    check, for a model whose structure was checked on a copy; ONNX Runtime's default-domain ops
    and sparse initializers are allowed for as in check_result."""
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        patched = _ort_default_domain_ops_moved(model) or _sparse_made_dense(model)
        if patched is None:
            raise _failure(exc, True) from exc
        _check_inference(patched)


def _failure(exc: Exception, full: bool) -> CheckerRefusal:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CheckerRefusal(first, full)


def _shapes_and_names_filled(model) -> onnx.ModelProto | None:
    """A copy for the structural check, where each main-graph input and output with a tensor type
    but no shape has an empty one (which declares rank 0: not for shape inference) and each graph
    without a name has one, or None when there is neither: what the input check lets through
    (graph/sanity.py) is let through here too, and nothing else. Subgraph inputs and outputs
    need no shape (the checker asks it of the main graph's only)."""
    if isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    changed = False
    for value in [*copy.graph.input, *copy.graph.output]:
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()
            changed = True
    for graph in all_graphs(copy.graph):
        if not graph.name:
            graph.name = "main" if graph is copy.graph else "subgraph"
            changed = True
    return copy if changed else None


def _sparse_made_dense(model) -> onnx.ModelProto | None:
    """A copy with every sparse initializer made a dense one, or None when the model has none.
    ONNX's shape inference does not read sparse initializers (it fails on a model that has one,
    as given), so the full check runs on this copy: the same graph, weights stored densely."""
    import numpy as np
    from onnx import numpy_helper

    if isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    if not any(len(g.sparse_initializer) for g in all_graphs(model.graph)):
        return None
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for graph in all_graphs(copy.graph):
        for sparse in graph.sparse_initializer:
            values, indices = numpy_helper.to_array(sparse.values), numpy_helper.to_array(sparse.indices)
            shape = tuple(sparse.dims)
            dense = np.zeros(int(np.prod(shape)), values.dtype)
            dense[indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)] = values
            graph.initializer.append(numpy_helper.from_array(dense.reshape(shape), sparse.values.name))
        del graph.sparse_initializer[:]
    return copy


def _ort_default_domain_ops_moved(model) -> onnx.ModelProto | None:
    """A copy with ONNX Runtime's default-domain ops (unknown to onnx) moved to com.microsoft,
    or None when the model has none (the failure is real)."""
    from ..graph.signatures import _ort_table

    if isinstance(model, bytes):
        model = onnx.ModelProto.FromString(model)
    table = _ort_table()
    opset = next((o.version for o in model.opset_import if normalize_domain(o.domain) == ""), None)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    moved = 0
    for node in (n for g in all_graphs(copy.graph) for n in g.node):
        if normalize_domain(node.domain) == "" and node.op_type in table and not onnx.defs.has(node.op_type):
            node.domain = _ORT_DOMAIN
            moved += 1
    if not moved or opset is None:
        return None
    if not any(o.domain == _ORT_DOMAIN for o in copy.opset_import):
        copy.opset_import.add(domain=_ORT_DOMAIN, version=1)
    return copy
