"""Stage: paint. Turns a classification into a `PrecisionPlan` with linear passes over the
float edges of the graph (an edge joins an output that follows its node's precision to an
input that does), in the tradition of TensorFlow's auto-mixed-precision painting:

  1. seeds: low_precision nodes (and nodes forced low) are LOW; keep_fp32 nodes, nodes kept
     fp32 by a rule, a data rule or a schema limit, and nodes of unknown type are FP32;
  2. FP32 taint flows forward from every FP32 node through follow and clear nodes;
  3. LOW flows forward from every LOW node through the follow and clear nodes the taint did
     not reach (so follow/clear nodes between or after low nodes run low);
  4. a clear node all of whose consumers are LOW becomes LOW (the cast moves upstream);
  5. casts, constants and other type-setting nodes take the type all their consumers need,
     so an author's Cast(to=FLOAT) guarding a softmax stays as it is;
  6. what is left keeps the type it had.

Only reads the index; the plan it returns is applied by `rewrite`.
"""

from __future__ import annotations

from ..dtypes import FLOAT, NAME_OF, dtype_name
from ..graph import GraphIndex
from .classify import CAT_NAME, Classification
from .model import NodePlan, PrecisionPlan, Reason, Warning_


def global_order(index: GraphIndex) -> list:
    """All nodes, each subgraph's nodes placed just before the node that owns the subgraph."""
    out = []

    def walk(scope):
        for node in scope.order:
            for sub in node.subscopes:
                walk(sub)
            out.append(node)

    walk(index.main)
    return out


def paint(index: GraphIndex, cls: Classification, target: int, keep_io_types: bool,
          rule_files=(), order=None) -> PrecisionPlan:
    nodes = index.nodes
    n = len(nodes)
    roles_in, roles_out, cat, seed, frozen = cls.roles_in, cls.roles_out, cls.cat, cls.seed, cls.frozen
    paint_ = ["-"] * n
    cause = [None] * n
    for node in nodes:
        i = node.id
        c = cat[i]
        ports = roles_in[i] + roles_out[i]
        if c in "NX" or ("p" not in ports and "f" not in ports and not frozen[i]):
            continue
        s = seed[i]
        if frozen[i] or s == "deny" or s == "schema":
            paint_[i] = "D"
        elif s == "allow":
            paint_[i] = "A"
        elif c == "L":
            paint_[i] = "A"
        elif c == "K":
            paint_[i] = "D"
        else:
            paint_[i] = "U"

    # Pass 2: fp32 taint forward through follow and clear nodes. A node that is fp32 only because
    # its schema lacks the target type starts no taint (its values need no fp32 precision), but
    # passes on a taint that reaches it.
    stack = [node for node in nodes if paint_[node.id] == "D" and seed[node.id] != "schema"]
    tainted = {node.id for node in stack}
    while stack:
        node = stack.pop()
        ro = roles_out[node.id]
        for consumer in [c for k, v in enumerate(node.outputs) if ro[k] in "pf" for c, port in v.consumers
                         if paint_[c.id] != "-" and roles_in[c.id][port] in "pa"]:
            j = consumer.id
            if paint_[j] == "U":
                paint_[j] = "D"
                cause[j] = ("fp32-taint", node)
                tainted.add(j)
                stack.append(consumer)
            elif paint_[j] == "D" and j not in tainted:
                tainted.add(j)
                stack.append(consumer)

    # Pass 3: low precision forward through the untainted follow and clear nodes.
    stack = [node for node in nodes if paint_[node.id] == "A"]
    while stack:
        node = stack.pop()
        ro = roles_out[node.id]
        for consumer in [c for k, v in enumerate(node.outputs) if ro[k] == "p" for c, port in v.consumers
                         if paint_[c.id] == "U" and roles_in[c.id][port] in "pa"]:
            j = consumer.id
            if paint_[j] == "U":
                paint_[j] = "A"
                cause[j] = ("follows-low", node)
                stack.append(consumer)

    order = order if order is not None else global_order(index)
    target_name = dtype_name(target)

    def requirement(consumer, port, value):
        """Type the consumer needs at `port`, or None when any type will do."""
        role = roles_in[consumer.id][port]
        if role == "f":
            return FLOAT
        if role == "p":
            p = paint_[consumer.id]
            if p == "A":
                return target
            if p == "D" and not frozen[consumer.id]:
                return FLOAT
            return value.dtype
        if role == "o":
            return value.dtype
        return None

    type_setting = {"Cast", "Constant", "ConstantOfShape", "EyeLike"}
    for node in reversed(order):
        i = node.id
        # Pass 4: a clear node whose consumers are all low goes low.
        if paint_[i] == "U" and cat[i] == "C":
            consumers = [(c, port) for k, v in enumerate(node.outputs) if roles_out[i][k] == "p"
                         for c, port in v.consumers]
            outputs = any(v.graph_outputs for k, v in enumerate(node.outputs) if roles_out[i][k] == "p")
            if consumers and not outputs and all(paint_[c.id] == "A" and roles_in[c.id][port] in "pa"
                                                 for c, port in consumers):
                paint_[i] = "A"
                cause[i] = Reason("consumers-low", "clear op whose consumers all run in low precision")
        # Pass 5: type-setting nodes take the one type their consumers need.
        if (node.op in type_setting and node.domain in ("", "ai.onnx") and paint_[i] != "-" and seed[i] is None
                and cat[i] == "C"):
            needs = set()
            for k, value in enumerate(node.outputs):
                if roles_out[i][k] != "p":
                    continue
                for consumer, port in value.consumers:
                    needs.add(requirement(consumer, port, value))
                for scope, _ in value.graph_outputs:
                    # subgraph outputs always keep their types; the main graph's unless told otherwise
                    needs.add(value.dtype if keep_io_types or scope is not index.main else None)
            needs.discard(None)
            if len(needs) == 1:
                need = needs.pop()
                before = paint_[i]
                if need == target:
                    paint_[i] = "A"
                elif need == FLOAT:
                    paint_[i] = "D"
                else:
                    paint_[i] = "U"
                if paint_[i] != before:
                    cause[i] = Reason("consumers-need", f"all its consumers need {dtype_name(need)}")
            elif needs and node.op != "Cast" and paint_[i] == "A":
                paint_[i] = "U"
                cause[i] = Reason("consumers-mixed", "consumers need different types: keeps its own and each "
                                  "consumer gets a cast")

    precisions = [None] * n
    for node in nodes:
        i = node.id
        p = paint_[i]
        if p == "A":
            precisions[i] = target_name
        elif p == "D" and not frozen[i]:
            precisions[i] = "fp32"
        elif p == "U":
            precisions[i] = NAME_OF.get(_original_type(node, roles_in[i], roles_out[i]), "unchanged")
        else:
            precisions[i] = "unchanged"

    def build_nodes():
        """The per-node plan entries with their reasons, built when someone reads them."""
        plans = []
        for node in nodes:
            i = node.id
            p = paint_[i]
            reasons = list(cls.reasons[i] or ())
            c = cause[i]
            if c.__class__ is tuple:
                code, src = c
                if code == "fp32-taint":
                    c = Reason(code, f"fed by fp32 node {src.label} ({src.op}); fp32 flows forward through "
                               "follow and clear ops")
                else:
                    c = Reason(code, f"fed by low-precision node {src.label} ({src.op}) and by no fp32 node")
            if c is not None:
                reasons.append(c)
            if p == "U":
                original = _original_type(node, roles_in[i], roles_out[i])
                reasons.append(Reason("unchanged", "not fed by a low-precision node and nothing forces it: "
                                      f"keeps its type ({dtype_name(original)})"))
            elif p not in "AD" or frozen[i]:
                if cat[i] not in "NX" and not frozen[i]:
                    reasons.append(Reason("no-float", "no float tensor follows this op's precision"))
            plans.append(NodePlan(id=i, name=node.name, op_type=node.op, domain=node.domain,
                                  graph=node.scope.path, category=CAT_NAME[cat[i]], precision=precisions[i],
                                  reasons=reasons, fp32_inputs=list(cls.pins_in[i]),
                                  fp32_outputs=list(cls.pins_out[i])))
        return plans

    plan = PrecisionPlan(target=target_name, keep_io_types=keep_io_types, nodes=None, rule_files=list(rule_files),
                         warnings=[Warning_(c, m, n_) for c, m, n_ in cls.warnings],
                         clamp_initializers=dict(cls.clamp))
    plan.set_lazy_nodes(build_nodes, precisions, [CAT_NAME[c] for c in cat])
    for value, message in cls.flush_notes.values():
        users = [c for c, port in value.consumers if paint_[c.id] == "A" and roles_in[c.id][port] == "p"]
        if users:
            plan.warnings.append(Warning_("data-flush", f"{message}; converted for {users[0].label}"
                                          + (f" and {len(users) - 1} more" if len(users) > 1 else ""),
                                          users[0].label))
    return plan


def _original_type(node, roles_in, roles_out):
    for k, value in enumerate(node.outputs):
        if roles_out[k] == "p":
            return value.dtype
    for k, value in enumerate(node.inputs):
        if roles_in[k] == "p":
            return value.dtype
    return None
