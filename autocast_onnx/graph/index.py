"""Stage: index. Builds read-only lookup structures over a model in one linear pass:
values with their producer and consumers, nodes with resolved inputs, nested scopes for
If/Loop/Scan bodies (outer-scope references resolved lexically), a topological order per
scope, and the element type of every tensor (declared, or inferred from op signatures).

Nothing here edits the model, except that subgraph tensors stored as external data are
read in (checked like the main graph's), as are sparse initializers', and a graph given out of
order is noted so the writer can emit it sorted.
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto

from ..errors import AutocastError, InternalCheckError
from . import signatures
from .domains import normalize_domain

log = logging.getLogger(__name__)

NONTENSOR = -1  # sequences, maps, optionals: never converted
# Type strings of values that are not tensors (a schema's concrete port type or allowed types).
_CONTAINER_TYPES = ("seq(", "map(", "optional(", "sparse_tensor(")
GRAPH_ATTR_OPS = {"If", "Loop", "Scan", "SequenceMap", "BeamSearch", "GreedySearch", "Sampling", "WhisperBeamSearch"}
KNOWN_NO_GRAPH_DOMAINS = {"", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training", "ai.onnx.preview"}
# Deepest body nesting (the main graph is level 0) whose bodies protobuf can still read back with
# typed values: it stops at 100 message levels, each level of bodies takes three (NodeProto,
# AttributeProto, GraphProto), and a typed output of a body at level 32 would sit at level 101.
# A deeper model exists only in memory: it could be neither checked, saved and read back, nor run.
MAX_NESTING = 31


class Value:
    __slots__ = (
        "consumers",
        "declared",
        "dtype",
        "elem",
        "graph_outputs",
        "initializer",
        "kind",
        "name",
        "out_port",
        "producer",
        "scope",
    )

    def __init__(self, name, scope, kind, dtype=None, producer=None, out_port=-1, initializer=None):
        self.name = name
        self.scope = scope
        self.kind = kind  # "input", "initializer", "node"
        self.dtype = dtype  # onnx elem type, NONTENSOR, or None if unknown
        # NONTENSOR values: the element type of a sequence of tensors or an optional tensor, when known
        self.elem: int | None = None
        self.producer = producer
        self.out_port = out_port
        self.consumers: list | tuple = []  # (Node, input port); a tuple once the index is built
        self.graph_outputs = ()  # (scope, index) of each graph output slot it fills
        self.declared = dtype is not None
        self.initializer = initializer  # TensorProto for initializers

    def __repr__(self):
        return f"Value({self.name!r}, {self.dtype})"


class Node:
    __slots__ = ("_name", "domain", "id", "inputs", "op", "outputs", "pos", "proto", "scope", "subscopes")

    def __init__(self, id_, proto, scope, pos, op, domain, input_names, output_names, name):
        self.id = id_
        self.proto = proto
        self.scope = scope
        self.pos = pos
        self.op = op
        self.domain = domain  # normalised: "" for the default domain however the model spells it
        self.inputs = input_names  # replaced by the Values (None: an omitted input) once resolved
        self.outputs = output_names  # replaced by a tuple of Value | None
        self.subscopes: tuple[Scope, ...] = ()
        self._name = name

    @property
    def name(self) -> str:
        """The node's name as the model gives it ("" for an unnamed node)."""
        return self._name

    @property
    def authored_domain(self) -> str:
        """The domain as the model spells it (the default one may be "" or "ai.onnx"): what plans
        and fingerprints record, so that they stay as the author wrote the model."""
        return self.proto.domain

    @property
    def label(self) -> str:
        """A human name: the node name, or op type and position for unnamed nodes."""
        return self.name or f"<{self.op} #{self.pos}{'' if self.scope.parent is None else ' in ' + self.scope.path}>"

    def __repr__(self):
        return f"Node({self.label})"


class Scope:
    __slots__ = (
        "attr_name",
        "base_dir",
        "depth",
        "graph",
        "id",
        "initializer_names",
        "inputs",
        "nodes",
        "order",
        "outputs",
        "owner",
        "parent",
        "path",
        "sorted",
        "sparse",
        "typed",
        "value_elem",
        "value_info",
        "values",
    )

    def __init__(self, id_, graph, parent, owner, attr_name, path, base_dir=None):
        self.id = id_
        self.base_dir = base_dir  # folder that external data locations are relative to
        self.graph = graph
        self.parent = parent
        self.owner = owner
        self.attr_name = attr_name
        self.path = path
        self.depth = 0 if parent is None else parent.depth + 1  # nesting level: main is 0
        self.values = {}
        self.initializer_names: list[str] = []  # of graph.initializer, in its order
        self.sparse: dict[str, onnx.SparseTensorProto] = {}  # of graph.sparse_initializer, by name
        self.nodes = []
        self.inputs = []
        self.outputs = []
        self.order: list[Node] | None = None  # set by GraphIndex._order_and_type_all
        self.sorted = True
        self.value_info = {}
        self.value_elem: dict[str, int | None] = {}  # declared sequences and optionals: their tensors' type
        self.typed = False

    def resolve(self, name):
        scope = self
        while scope is not None:
            value = scope.values.get(name)
            if value is not None:
                return value
            scope = scope.parent
        return None


class GraphIndex:
    """Everything the planner needs to read about a model, in linear-size structures."""

    def __init__(
        self, model: onnx.ModelProto, where: str = "<model>", base_dir: Path | None = None, main_checked: bool = False
    ):
        self.model = model
        self._main_checked = main_checked
        self.where = where
        self.base_dir = base_dir
        self.external_tensors = 0  # initializers of any graph stored as external data
        self._external_files: dict = {}  # location -> (file, size), each file looked at once
        self.opsets = {normalize_domain(o.domain): o.version for o in model.opset_import}
        self.scopes: list[Scope] = []
        self._output_rules: dict = {}
        self._port_rule_cache: dict = {}
        self.nodes: list[Node] = []
        self.main = self._build_scope(model.graph, None, None, "", "main")
        self._order_and_type_all()
        self._freeze_edges()

    # ---- construction -------------------------------------------------------------------
    def _build_scope(self, graph, parent, owner, attr_name, path) -> Scope:
        """Index one graph (and, recursively, its subgraphs) in four passes."""
        scope = Scope(len(self.scopes), graph, parent, owner, attr_name, path, self.base_dir)
        self.scopes.append(scope)
        self._declare_values(scope)
        protos = list(graph.node)
        # Fields are read from the protobuf once, in bulk: attribute access on protobuf messages
        # dominates the cost of large graphs.
        fields = [(p.op_type, p.domain, p.input[:], p.output[:], p.name) for p in protos]
        if any(
            op in GRAPH_ATTR_OPS or (domain and normalize_domain(domain) not in KNOWN_NO_GRAPH_DOMAINS)
            for op, domain, _, _, _ in fields
        ):
            self._walk_nodes(scope, protos, fields, resolve=False)
            del protos, fields
            has_subgraphs = self._resolve_inputs(scope)
            # Inline typing only in a sorted main graph without subgraphs: a body may read outer values
            # that are typed later, so bodies are typed in _infer_types, in the order the outer graph runs.
            if parent is None and scope.sorted and not has_subgraphs:
                self._type_in_order(scope)
                scope.typed = True
        else:
            self._walk_nodes(scope, protos, fields, resolve=True)
        self._bind_outputs(scope)
        log.debug("index %s: %d nodes, %d values, sorted=%s", path, len(scope.nodes), len(scope.values), scope.sorted)
        return scope

    def _declare_values(self, scope: Scope) -> None:
        """Pass 1: graph inputs, initializers (an initializer named like an input is that input's
        default) and declared types from value_info and outputs."""
        graph, values = scope.graph, scope.values
        for vi in graph.input:
            value = Value(vi.name, scope, "input", _type_of(vi))
            if value.dtype == NONTENSOR:
                value.elem = _elem_of(vi)
            values[vi.name] = value
            scope.inputs.append(value)
        from ..io import external_location

        names = scope.initializer_names
        for init in graph.initializer:
            name = init.name
            names.append(name)
            if init.data_location == TensorProto.EXTERNAL:
                self.external_tensors += 1
                if self.base_dir is None:
                    raise AutocastError(
                        f"initializer '{name}' uses external data but the model has no folder",
                        self.where,
                        "load the model from its file",
                    )
                if scope.parent is not None or not self._main_checked:  # checked now, read when needed
                    external_location(init, self.base_dir, self.where, self._external_files)
            self._declare_constant(scope, name, init)
        for sparse in graph.sparse_initializer:
            self._declare_sparse(scope, sparse)
        for vi in graph.value_info:
            scope.value_info[vi.name] = _type_of(vi)
        for vi in graph.output:
            if vi.name not in scope.value_info:
                scope.value_info[vi.name] = _type_of(vi)
        for vi in (*graph.value_info, *graph.output):
            if scope.value_info.get(vi.name) == NONTENSOR and vi.name not in scope.value_elem:
                scope.value_elem[vi.name] = _elem_of(vi)

    def _declare_constant(self, scope: Scope, name: str, tensor: TensorProto) -> None:
        """The Value of an initializer (`tensor`), or the default of the graph input it is named
        after (which stays an input)."""
        existing = scope.values.get(name)
        if existing is not None and existing.kind == "input":
            existing.initializer = tensor
            return
        if existing is not None:
            raise AutocastError(
                f"initializer name '{name}' is defined twice in graph {scope.path}", self.where, "rename one of them"
            )
        scope.values[name] = Value(name, scope, "initializer", tensor.data_type, initializer=tensor)

    def _declare_sparse(self, scope: Scope, sparse: onnx.SparseTensorProto) -> None:
        """A sparse initializer is a constant like a dense one: its Value's `initializer` is the
        tensor of its stored values (1-D, named after the sparse tensor), which the data rules
        screen and the rewrite converts; scope.sparse keeps the SparseTensorProto, whose indices
        and dims a converted copy shares. External data of its values or indices is checked like
        an initializer's (inside the model's folder) and read in, since the writer carries over
        the external data of dense initializers only.

            sparse_initializer W (dims [4, 4], values [3] float, indices [3])  ->  Value W, float"""
        values = sparse.values
        name = values.name
        if not name:
            return  # nothing can read it
        for tensor in (values, sparse.indices):
            if tensor.data_location == TensorProto.EXTERNAL:
                self._read_external(tensor, f"sparse initializer '{name}'")
        try:
            onnx.checker.check_sparse_tensor(sparse)  # indices in range and in order, shapes agree
        except onnx.checker.ValidationError as exc:
            raise AutocastError(
                f"sparse initializer '{name}' is malformed: {str(exc).strip().splitlines()[0]}",
                self.where + ("" if scope.parent is None else f" (subgraph {scope.path})"),
                "the graph is broken: re-export it",
            ) from None
        self._declare_constant(scope, name, values)
        scope.sparse[name] = sparse

    def _read_external(self, tensor: TensorProto, what: str) -> None:
        """Read a tensor's external data into it, refusing locations outside the model's folder."""
        from ..io import load_external_tensor

        if self.base_dir is None:
            raise AutocastError(
                f"{what} uses external data but the model has no folder", self.where, "load the model from its file"
            )
        load_external_tensor(tensor, self.base_dir, self.where, self._external_files)

    def _walk_nodes(self, scope: Scope, protos: list, fields: list, resolve: bool) -> None:
        """Pass 2: a Node per NodeProto and a Value per output it defines. With `resolve` (a graph
        without subgraphs) passes 3 and 4 happen in the same walk: each node's inputs resolve to
        the Values recorded so far (in a sorted graph, all of them) and, in the main graph, its
        outputs are typed at once. An input produced later (an unsorted graph) or by nothing is
        resolved after the walk, as the separate passes would: the graph is marked unsorted (typed
        later, in topological order), and the consumers of such values are put back in node order.
        Without `resolve`, node.inputs keeps the names for _resolve_inputs.

            h = MatMul(x, w)   ->  Node(MatMul, inputs [x, w]), Value h (producer MatMul, float)"""
        values, parent, nodes = scope.values, scope.parent, scope.nodes
        base = len(self.nodes)
        typing = resolve and parent is None
        late: list = []  # (node, port, name) of inputs not defined when their node was reached
        ops: dict[str, str] = {}  # one string per op type: protobuf hands out a new one per read
        get = values.get
        for pos, proto in enumerate(protos):
            op, domain, input_names, output_names, node_name = fields[pos]
            op = ops.setdefault(op, op)
            if domain:
                domain = normalize_domain(domain)
            node = Node(base + pos, proto, scope, pos, op, domain, input_names, None, node_name)
            if resolve:
                in_values = [get(name) if name else None for name in input_names]  # "": an omitted input
                port = 0
                for value in in_values:
                    if value is not None:
                        value.consumers.append((node, port))
                    elif input_names[port]:  # defined in an outer scope, later, or nowhere
                        value = scope.resolve(input_names[port]) if parent is not None else None
                        if value is None:
                            late.append((node, port, input_names[port]))
                        else:
                            value.consumers.append((node, port))
                            in_values[port] = value
                    port += 1
                node.inputs = tuple(in_values)  # never changed again but by _resolve_late
            out_values: list[Value | None] = []
            port = 0
            for name in output_names:
                if not name:
                    out_values.append(None)
                elif name in values:
                    raise AutocastError(
                        f"tensor '{name}' is produced twice (by node {node.label} and another)",
                        self.where,
                        "each tensor must have exactly one producer",
                    )
                else:
                    value = values[name] = Value(name, scope, "node", None, node, port)
                    out_values.append(value)
                port += 1
            node.outputs = tuple(out_values)  # never changed again: a tuple is the smaller
            if typing:
                self._type_outputs(node)
            nodes.append(node)
        self.nodes.extend(nodes)
        if late:
            self._resolve_late(scope, late)
        if resolve:
            scope.typed = typing and scope.sorted

    def _resolve_late(self, scope: Scope, late: list) -> None:
        """Inputs the flat walk could not resolve in order: produced later in this graph (the graph
        is unsorted) or by nothing (broken)."""
        touched = {}
        for node, port, name in late:
            value = scope.values.get(name)
            if value is None:
                raise AutocastError(
                    f"node {node.label} reads tensor '{name}', which nothing produces",
                    self.where + ("" if scope.parent is None else f" (subgraph {scope.path})"),
                    "the graph is broken: re-export it",
                )
            scope.sorted = False
            value.consumers.append((node, port))
            node.inputs = node.inputs[:port] + (value,) + node.inputs[port + 1 :]
            touched[id(value)] = value
        for value in touched.values():
            value.consumers.sort(key=lambda use: (use[0].id, use[1]))

    def _freeze_edges(self) -> None:
        """Once every graph is indexed, each value's consumers become a tuple: the index is
        read-only from here on, and a tuple holds the same edges in less memory than a list
        grown by appends (4 MB at 100k nodes)."""
        for scope in self.scopes:
            for value in scope.values.values():
                value.consumers = tuple(value.consumers)

    def _resolve_inputs(self, scope: Scope) -> bool:
        """Pass 3: each input name becomes its Value (outer scopes resolved lexically), consumers
        are recorded, out-of-order reads mark the graph unsorted, and subgraphs are indexed.
        Returns whether any node has subgraphs."""
        values, parent = scope.values, scope.parent
        has_subgraphs = False
        for node in scope.nodes:
            in_values: list[Value | None] = []
            port = 0
            pos = node.pos
            for name in node.inputs:
                if not name:
                    in_values.append(None)
                    port += 1
                    continue
                value = values.get(name)
                if value is None:
                    value = scope.resolve(name) if parent is not None else None
                    if value is None:
                        raise AutocastError(
                            f"node {node.label} reads tensor '{name}', which nothing produces",
                            self.where + ("" if parent is None else f" (subgraph {scope.path})"),
                            "the graph is broken: re-export it",
                        )
                elif value.producer is not None and value.producer.scope is scope and value.producer.pos >= pos:
                    scope.sorted = False
                value.consumers.append((node, port))
                in_values.append(value)
                port += 1
            node.inputs = in_values
            if node.op in GRAPH_ATTR_OPS or node.domain not in KNOWN_NO_GRAPH_DOMAINS:
                node.subscopes = self._build_subscopes(scope, node)
                has_subgraphs = has_subgraphs or bool(node.subscopes)
        return has_subgraphs

    def _build_subscopes(self, scope: Scope, node: Node) -> tuple[Scope, ...]:
        """The scopes of `node`'s graph attributes. A body's path is its parent's path plus one
        segment naming the node within the parent (not node.label, which holds the parent's path
        again and would double the path at every level):

            main/<If #2>.then_branch/<If #0>.else_branch,  main/loop.body/<Scan #3>.graphs[1]"""
        subs = []
        segment = f"{scope.path}/{node.name or f'<{node.op} #{node.pos}>'}."
        if scope.depth >= MAX_NESTING and any(a.type in _GRAPH_ATTRS for a in node.proto.attribute):
            raise AutocastError(
                f"subgraphs nest more than {MAX_NESTING} levels deep (a body of {node.op} node "
                f"{node.name or f'#{node.pos}'} would be level {scope.depth + 1}); protobuf reads at most 100 "
                "message levels, so such a model cannot be checked, saved and read back, or run",
                self.where,
                f"flatten the control flow (inline If branches, unroll loops) to at most {MAX_NESTING} levels",
            )
        for attr in node.proto.attribute:
            if attr.type == AttributeProto.GRAPH:
                subs.append(self._build_scope(attr.g, scope, node, attr.name, segment + attr.name))
            elif attr.type == AttributeProto.GRAPHS:
                for k, sub in enumerate(attr.graphs):
                    subs.append(self._build_scope(sub, scope, node, attr.name, f"{segment}{attr.name}[{k}]"))
        return tuple(subs)

    def _type_in_order(self, scope: Scope) -> None:
        """Pass 4 (sorted main graph with subgraphs left untyped): each node's output types from
        its op's typing rules, in graph order, so every producer is typed before its consumers."""
        for node in scope.nodes:
            self._type_outputs(node)

    def _type_outputs(self, node: Node) -> None:
        """The element type of each output of `node`, from its op's typing rule and its inputs'
        types (which must be known by now), else the type the graph declares."""
        in_values = node.inputs
        outs = node.outputs
        key = (node.op, node.domain, len(in_values), len(outs))
        rules = self._port_rule_cache.get(key)
        if rules is None:
            rules = self._port_rule_cache[key] = self._port_rules(node.domain, node.op, len(in_values), len(outs))
        port = 0
        for value in outs:
            if value is not None:
                rule = rules[port]
                if rule.__class__ is int:
                    dtype = rule
                elif rule.__class__ is tuple:
                    dtype = None
                    for i in rule:
                        source = in_values[i]
                        if source is not None and source.dtype is not None:
                            dtype = source.dtype
                            break
                else:
                    dtype = rule(node, port)
                if dtype is None:
                    dtype = node.scope.value_info.get(value.name)
                    value.declared = dtype is not None
                value.dtype = dtype
                if dtype == NONTENSOR and value.elem is None:
                    value.elem = _container_elem(node, value)
            port += 1

    def _bind_outputs(self, scope: Scope) -> None:
        """Graph outputs: each names the Value it exposes (possibly an outer or input value)."""
        for idx, vi in enumerate(scope.graph.output):
            value = scope.resolve(vi.name)
            if value is None:
                raise AutocastError(
                    f"graph output '{vi.name}' is produced by nothing", self.where, "the graph is broken: re-export it"
                )
            value.graph_outputs += ((scope, idx),)
            scope.outputs.append(value)

    # ---- order ------------------------------------------------------------------------
    def _order_and_type_all(self) -> None:
        for scope in self.scopes:
            deps = (
                self._outer_dependencies(scope) if not scope.sorted or any(n.subscopes for n in scope.nodes) else None
            )
            if scope.sorted and not self._has_late_outer_refs(scope, deps):
                scope.order = scope.nodes
            else:
                scope.sorted = False
                scope.order = self._toposort(scope, deps)
        self._infer_types(self.main)

    def _outer_dependencies(self, scope: Scope) -> dict:
        """For each control-flow node of `scope`, the values of `scope` its bodies read."""
        deps = {}
        for node in scope.nodes:
            if not node.subscopes:
                continue
            reads = []
            stack = list(node.subscopes)
            while stack:
                sub = stack.pop()
                for inner in sub.nodes:
                    for value in inner.inputs:
                        if value is not None and value.scope is scope:
                            reads.append(value)
                    stack.extend(inner.subscopes)
                for value in sub.outputs:
                    if value.scope is scope:
                        reads.append(value)
            deps[node] = reads
        return deps

    def _has_late_outer_refs(self, scope, deps) -> bool:
        if not deps:
            return False
        for node, reads in deps.items():
            for value in reads:
                if value.producer is not None and value.producer.pos >= node.pos:
                    return True
        return False

    def _toposort(self, scope: Scope, deps) -> list:
        nodes = scope.nodes
        indeg = [0] * len(nodes)
        succ: list[list[int]] = [[] for _ in nodes]

        def preds(node):
            for value in node.inputs:
                if value is not None and value.producer is not None and value.producer.scope is scope:
                    yield value.producer
            for value in (deps or {}).get(node, ()):
                if value.producer is not None:
                    yield value.producer

        for node in nodes:
            for p in preds(node):
                succ[p.pos].append(node.pos)
                indeg[node.pos] += 1
        ready = [i for i in range(len(nodes)) if indeg[i] == 0]
        ready.reverse()
        order = []
        while ready:
            i = ready.pop()
            order.append(nodes[i])
            for j in reversed(succ[i]):
                indeg[j] -= 1
                if indeg[j] == 0:
                    ready.append(j)
        if len(order) != len(nodes):
            cycle = _find_cycle([node for node in nodes if indeg[node.pos] > 0], preds)
            raise AutocastError(
                "the graph has a cycle: " + _cycle_text(cycle),
                self.where + ("" if scope.parent is None else f" (subgraph {scope.path})"),
                "ONNX graphs must be acyclic; re-export the model",
            )
        return order

    # ---- types ------------------------------------------------------------------------
    def _infer_types(self, scope: Scope) -> None:
        if scope.typed:
            return
        declared = scope.value_info
        if scope.order is None:
            raise InternalCheckError(f"scope {scope.path} is typed before it is ordered")
        for node in scope.order:
            for sub in node.subscopes:
                self._infer_types(sub)
            outs = node.outputs
            for port, value in enumerate(outs):
                if value is None:
                    continue
                dtype = self._infer_output(node, port)
                if dtype is None:
                    dtype = declared.get(value.name)
                    value.declared = dtype is not None
                value.dtype = dtype
                if dtype == NONTENSOR and value.elem is None:
                    value.elem = _container_elem(node, value)

    def _infer_output(self, node: Node, port: int):
        op = node.op
        domain = node.domain
        if domain == "":
            special = _SPECIAL.get(op)
            if special is not None:
                result = special(node, port)
                if result is not _FALLTHROUGH:
                    return result
        key = (domain, op, port, len(node.inputs))
        rule = self._output_rules.get(key)
        if rule is None:
            rule = self._output_rules[key] = self._output_rule(domain, op, port, len(node.inputs))
        if rule.__class__ is int:
            return rule
        inputs = node.inputs
        for i in rule:
            value = inputs[i]
            if value is not None and value.dtype is not None:
                return value.dtype
        return None

    def _port_rules(self, domain, op, n_inputs, n_outputs) -> list:
        """Typing rule of each output port: an element type, the input ports whose type it takes
        (a tuple), or a function of the node for ops typed by attributes."""
        rules = []
        special = _SPECIAL.get(op) if domain == "" else None
        for port in range(n_outputs):
            if (
                special is not None
                and not (op == "QuantizeLinear" and port > 0)
                and not (op == "LayerNormalization" and port == 0)
            ):
                rules.append(special)
            else:
                rules.append(self._output_rule(domain, op, port, n_inputs))
        return rules

    def _output_rule(self, domain, op, port, n_inputs):
        """How to type output `port`: a fixed element type (int), or the input ports (tuple)
        whose type it takes."""
        sig = signatures.lookup(domain, op, self.opsets.get(domain))
        if sig is None:
            return ()
        param = sig.output_param(port)
        if param is None:
            return ()
        if container_param(sig, param):
            return NONTENSOR  # a sequence, map, optional or sparse tensor: no element type of its own
        allowed = sig.allowed(param)
        if allowed is not None and len(allowed) == 1:
            return next(iter(allowed))
        return tuple(i for i in range(n_inputs) if sig.input_param(i) == param)

    # ---- helpers ------------------------------------------------------------------------
    def opset(self, domain: str = "") -> int | None:
        return self.opsets.get(normalize_domain(domain))


def _find_cycle(stuck: list, preds) -> list:
    """A cycle among the nodes Kahn's algorithm could not order: each node produces an input of
    the next, and the last one an input of the first, which is the cycle's node earliest in the
    graph. Every such node has a predecessor that is also stuck, so walking predecessors from any
    of them must come back to a node already seen."""
    stuck_ids = {id(n) for n in stuck}
    path: list[Node] = []
    seen_at: dict[int, int] = {}
    node = stuck[0]
    while id(node) not in seen_at:
        seen_at[id(node)] = len(path)
        path.append(node)
        node = next(p for p in preds(node) if id(p) in stuck_ids)
    cycle = path[seen_at[id(node)] :]
    cycle.reverse()
    first = min(range(len(cycle)), key=lambda k: cycle[k].pos)
    return cycle[first:] + cycle[:first]


def _cycle_text(cycle: list, head: int = 4, tail: int = 3) -> str:
    """The cycle as `a -> b -> c -> a`; a long one shows its first `head` and last `tail` nodes and
    says how many are left out between them, so every arrow shown is an edge of the graph:

        n0 -> n1 -> n2 -> n3 -> ... (39993 more) -> n39997 -> n39998 -> n39999 -> n0"""
    if len(cycle) <= head + tail + 2:  # eliding fewer than three nodes saves nothing
        return " -> ".join(n.label for n in cycle + cycle[:1])
    shown = [n.label for n in cycle[:head]] + [f"... ({len(cycle) - head - tail} more)"]
    return " -> ".join(shown + [n.label for n in cycle[-tail:] + cycle[:1]])


def _type_of(value_info) -> int | None:
    t = value_info.type
    which = t.WhichOneof("value")
    if which == "tensor_type":
        return t.tensor_type.elem_type or None
    if which is None:
        return None
    return NONTENSOR


def _elem_of(value_info) -> int | None:
    """The element type of the tensors in a declared sequence of tensors or optional tensor (None
    for other types, or when it is not given)."""
    t = value_info.type
    which = t.WhichOneof("value")
    if which == "sequence_type":
        inner = t.sequence_type.elem_type
    elif which == "optional_type":
        inner = t.optional_type.elem_type
    else:
        return None
    return (inner.tensor_type.elem_type or None) if inner.WhichOneof("value") == "tensor_type" else None


def container_param(sig, param: str | None) -> bool:
    """Whether a port of type `param` holds no tensor but a sequence, map, optional or sparse
    tensor: a type parameter that admits no tensor type, or such a concrete type. The element type
    of such a value is never changed, so neither is that of the tensors that go in or come out."""
    if sig is None or param is None:
        return False
    if param in sig.params:
        return not sig.params[param]
    return param.startswith(_CONTAINER_TYPES)


def _container_elem(node: Node, value: Value) -> int | None:
    """The element type of a container output that its op's typing rule left open: as declared,
    or, for Identity, its input's."""
    elem = node.scope.value_elem.get(value.name)
    if elem is None and node.op == "Identity" and node.inputs and node.inputs[0] is not None:
        elem = node.inputs[0].elem
    return elem


_FALLTHROUGH = object()
_GRAPH_ATTRS = (AttributeProto.GRAPH, AttributeProto.GRAPHS)


def _attr(node: Node, name: str):
    for attr in node.proto.attribute:
        if attr.name == name:
            return attr
    return None


def _input_dtype(node, i):
    if i < len(node.inputs) and node.inputs[i] is not None:
        return node.inputs[i].dtype
    return None


def _cast(node, port):
    attr = _attr(node, "to")
    return attr.i if attr is not None else None


def _dtype_attr(default_from_input=None, default=None):
    def infer(node, port):
        attr = _attr(node, "dtype")
        if attr is not None:
            return attr.i
        if default_from_input is not None:
            return _input_dtype(node, default_from_input)
        return default

    return infer


def _constant(node, port):
    for attr in node.proto.attribute:
        if attr.name == "value":
            return attr.t.data_type
        if attr.name == "sparse_value":
            return attr.sparse_tensor.values.data_type
        if attr.name in ("value_float", "value_floats"):
            return TensorProto.FLOAT
        if attr.name in ("value_int", "value_ints"):
            return TensorProto.INT64
        if attr.name in ("value_string", "value_strings"):
            return TensorProto.STRING
    return None


def _constant_of_shape(node, port):
    attr = _attr(node, "value")
    return attr.t.data_type if attr is not None else TensorProto.FLOAT


def _cast_like(node, port):
    return _input_dtype(node, 1)


def _body_output(offset):
    """If, Loop, Scan: output `port` has the type of body output `port + offset` (a sequence's
    element type too, recorded on the node's output)."""

    def infer(node, port):
        for sub in node.subscopes:
            if sub.attr_name in ("then_branch", "body"):
                k = port + offset
                if k < len(sub.outputs):
                    inner = sub.outputs[k]
                    dtype = inner.dtype if inner.dtype is not None else sub.value_info.get(inner.name)
                    if dtype == NONTENSOR and node.outputs[port] is not None:
                        node.outputs[port].elem = (
                            inner.elem if inner.elem is not None else sub.value_elem.get(inner.name)
                        )
                    return dtype
        return None

    return infer


def _elem_in(node, i: int) -> int | None:
    """The element type held by container input `i` (None if unknown or absent)."""
    if i < len(node.inputs) and node.inputs[i] is not None and node.inputs[i].dtype == NONTENSOR:
        return node.inputs[i].elem
    return None


def _tensor_in(node, i: int) -> int | None:
    """The element type of tensor input `i` (None if unknown, absent or not a tensor)."""
    dtype = _input_dtype(node, i)
    return None if dtype == NONTENSOR else dtype


def _element_out(node, port):
    """SequenceAt, ConcatFromSequence: a tensor of the sequence's element type."""
    return _elem_in(node, 0)


def _optional_get(node, port):
    """OptionalGetElement: the optional's tensor, or (opset 18) the tensor it is given as it is.
    An optional holding a sequence has no element type here: the output falls back to its
    declared type."""
    return _elem_in(node, 0) if _input_dtype(node, 0) == NONTENSOR else _input_dtype(node, 0)


def _container_out(elem_of):
    """Sequence and optional builders: the output is a container (NONTENSOR) whose element type
    `elem_of(node)` gives, recorded on the output value."""

    def infer(node, port):
        value = node.outputs[port]
        if value is not None:
            value.elem = elem_of(node)
        return NONTENSOR

    return infer


def _optional_elem(node) -> int | None:
    if node.inputs:
        return _tensor_in(node, 0)
    attr = _attr(node, "type")
    if attr is not None and attr.tp.WhichOneof("value") == "tensor_type":
        return attr.tp.tensor_type.elem_type or None
    return None


def _sequence_empty_elem(node) -> int | None:
    attr = _attr(node, "dtype")
    return attr.i if attr is not None else TensorProto.FLOAT


def _quantize(node, port):
    if port == 0:
        zp = _input_dtype(node, 2)
        if zp is not None:
            return zp
        attr = _attr(node, "output_dtype")
        if attr is not None and attr.i:
            return attr.i
        return TensorProto.UINT8
    return _FALLTHROUGH


def _layernorm(node, port):
    """Mean and InvStdDev (outputs 1, 2) have the type stash_type names (float by default)."""
    if port == 0:
        return _FALLTHROUGH
    attr = _attr(node, "stash_type")
    return attr.i if attr is not None else TensorProto.FLOAT


_SPECIAL = {
    "LayerNormalization": _layernorm,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "EyeLike": _dtype_attr(default_from_input=0),
    "RandomNormalLike": _dtype_attr(default_from_input=0),
    "RandomUniformLike": _dtype_attr(default_from_input=0),
    "Bernoulli": _dtype_attr(default_from_input=0),
    "RandomNormal": _dtype_attr(default=TensorProto.FLOAT),
    "RandomUniform": _dtype_attr(default=TensorProto.FLOAT),
    "Multinomial": _dtype_attr(default=TensorProto.INT32),
    "If": _body_output(0),
    "Loop": _body_output(1),
    "Scan": _body_output(0),
    "QuantizeLinear": _quantize,
    # sequences and optionals: a container's element type is tracked through the ops that fill
    # and empty it (Value.elem), so the tensors taken out of it are typed
    "SequenceAt": _element_out,
    "ConcatFromSequence": _element_out,
    "OptionalGetElement": _optional_get,
    "SequenceConstruct": _container_out(lambda node: _tensor_in(node, 0)),
    "SplitToSequence": _container_out(lambda node: _tensor_in(node, 0)),
    "SequenceInsert": _container_out(lambda node: _elem_in(node, 0) or _tensor_in(node, 1)),
    "SequenceErase": _container_out(lambda node: _elem_in(node, 0)),
    "SequenceEmpty": _container_out(_sequence_empty_elem),
    "Optional": _container_out(_optional_elem),
}


def build_index(
    model: onnx.ModelProto, where: str = "<model>", base_dir: Path | None = None, main_checked: bool = False
) -> GraphIndex:
    """Index `model`; raise AutocastError for broken graphs (cycles, dangling inputs, duplicates).
    External data locations are checked, except the main graph's where `main_checked` says that
    the loader did so already (io.load_model). Subgraphs nested too deeply to walk are bad input."""
    try:
        return GraphIndex(model, where, base_dir, main_checked)
    except RecursionError:
        raise AutocastError("the model nests subgraphs too deeply to be read", where, "re-export it") from None
