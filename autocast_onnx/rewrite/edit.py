"""Stage: rewrite (editing helpers). The graph-editing primitives that the rewrite uses and
the emulation builder shares: collision-free names, Cast nodes written as serialized bytes, and
putting a scope's node list in order with new nodes placed after their producers. Only `rewrite/`
edits graphs; validation's emulation model is built with these helpers too."""

from __future__ import annotations

from ..errors import InternalCheckError
from ..graph import GraphIndex
from ..varint import encode_varint


class Names:
    """Collision-free, deterministic names for new tensors and nodes."""

    def __init__(self, index: GraphIndex):
        self.tensors: set[str] = set()
        for scope in index.scopes:
            self.tensors.update(scope.values)
            for vi in scope.graph.output:
                self.tensors.add(vi.name)
        self._index = index
        self._nodes: set[str] | None = None

    @staticmethod
    def _fresh(base: str, taken: set[str]) -> str:
        name = base
        k = 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name

    def fresh(self, base: str) -> str:
        """A tensor name used nowhere in the model (any graph)."""
        return self._fresh(base, self.tensors)

    def fresh_node(self, base: str) -> str:
        """A node name used by no other node (built on first use: most conversions need few)."""
        if self._nodes is None:
            self._nodes = {node.name for node in self._index.nodes}
        return self._fresh(base, self._nodes)


def cast_node(src: str, dst: str, name: str, to: int) -> bytes:
    """A serialized NodeProto `Cast(src) -> dst` with attribute to: protobuf wire format, written
    directly because building 10^4 small messages through the Python API is the slow part of
    large conversions. Fields: input=1, output=2, name=3, op_type=4, attribute=5; in the
    AttributeProto: name=1, i=3, type=20 (INT=2)."""
    tail = _CAST_TAILS.get(to)
    if tail is None:
        attr = b"\x0a\x02to\x18" + encode_varint(to) + b"\xa0\x01\x02"
        tail = _CAST_TAILS[to] = b"\x22\x04Cast\x2a" + encode_varint(len(attr)) + attr
    return _field(b"\x0a", src) + _field(b"\x12", dst) + _field(b"\x1a", name) + tail


_CAST_TAILS: dict[int, bytes] = {}  # element type -> the op type and `to` attribute fields


def write_nodes(index: GraphIndex, head: dict, after: dict, skip_unchanged: bool = True) -> list[str]:
    """Write every scope's node list back in its topological order, with `head[scope id]` placed
    first and `after[node id]` right after each node (NodeProtos or serialized bytes). The new
    nodes are appended and the list is put in order by one sort of the repeated field, which moves
    the messages without copying them: every NodeProto the index holds (body graphs included)
    stays the one in the model. Returns the paths of the graphs that were not sorted before."""
    resorted = []
    placed: dict[int, list] = {}  # scope id -> node ids with new nodes after them
    for node_id in after:
        placed.setdefault(index.nodes[node_id].scope.id, []).append(node_id)
    for scope in index.scopes:
        first = head.get(scope.id, [])
        if skip_unchanged and not first and scope.sorted and scope.id not in placed:
            continue
        if not scope.sorted:
            resorted.append(scope.path)
        if scope.order is None:
            raise InternalCheckError(f"scope {scope.path} was never ordered")
        added = list(first)
        if scope.sorted:
            keys = _keys_in_place(index, scope, first, sorted(placed.get(scope.id, ())), after, added)
        else:
            keys = _keys_in_order(scope, first, after, added)
        append_nodes(scope.graph, added)
        if len(scope.graph.node) != len(keys):
            raise InternalCheckError(f"scope {scope.path}: the index and the graph's node list disagree")
        ordered = iter(keys)
        scope.graph.node.sort(key=lambda _node: next(ordered))
    return resorted


def _keys_in_place(index: GraphIndex, scope, first: list, node_ids: list, after: dict, added: list) -> list:
    """Sort keys, in the field's order (existing nodes, then `added`), for a graph already in
    order: node p keeps p * stride, the k-th node placed after it gets p * stride + k + 1, the
    head's come first (negative). Work in the number of new nodes, not of nodes."""
    stride = 1 + max((len(after[i]) for i in node_ids), default=0)
    new_keys = list(range(-len(first), 0))
    for node_id in node_ids:  # in node order: the order `added` receives them
        extra = after[node_id]
        start = index.nodes[node_id].pos * stride + 1
        new_keys.extend(range(start, start + len(extra)))
        added.extend(extra)
    return list(range(0, len(scope.nodes) * stride, stride)) + new_keys


def _keys_in_order(scope, first: list, after: dict, added: list) -> list:
    """Sort keys, in the field's order, for a graph that must be put in topological order."""
    ranks = [0] * len(scope.nodes)
    new_keys = list(range(len(first)))
    rank = len(first)
    for node in scope.order:
        ranks[node.pos] = rank
        rank += 1
        extra = after.get(node.id)
        if extra:
            added.extend(extra)
            new_keys.extend(range(rank, rank + len(extra)))
            rank += len(extra)
    return ranks + new_keys


def append_nodes(graph, nodes) -> None:
    """Append `nodes` (NodeProtos or serialized bytes) to graph.node: building 10^4 messages
    through the protobuf API is slow, so each is serialized and all are merged as `node` fields
    (tag 1, length-delimited) in one parse."""
    if not nodes:
        return
    parts = []
    varint = encode_varint
    for proto in nodes:
        payload = proto if proto.__class__ is bytes else proto.SerializeToString()
        parts.append(b"\x0a" + varint(len(payload)) + payload)
    graph.MergeFromString(b"".join(parts))


def _field(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8")
    return tag + encode_varint(len(data)) + data
