"""The one diagnostic model: every finding (lint check, suppression problem) is a Diagnostic,
and the text, JSON, SARIF and HTML emitters and the exit code all read the same list."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SEVERITIES = ("info", "warning", "error")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass
class Diagnostic:
    code: str  # stable check code, e.g. "AC101"
    name: str  # kebab-case check name
    severity: str  # info, warning, error
    message: str  # what is wrong with this node, with measured values
    fix: str  # how to fix it
    node: str | None = None  # node name (or "<Op #k>" for unnamed nodes); None for model-level findings
    op_type: str | None = None
    graph: str = "main"  # "main" or the path of the subgraph
    node_index: int | None = None  # position of the node in its graph
    model: str | None = None  # the model file
    value: float | None = None  # a measured value the message cites
    protected: bool | None = None  # fp32 models: whether the default conversion rules keep this safe
    tensor: str | None = None  # the tensor concerned, when there is one

    def key(self) -> tuple:
        """Identity used to compare against a baseline: code, graph and node (or tensor)."""
        return (self.code, self.graph, self.node or "", self.tensor or "")

    def as_dict(self) -> dict:
        """Plain JSON-safe data: a non-finite measured value (an -inf mask) becomes None; the
        message still says it."""
        data = asdict(self)
        if data["value"] is not None and not math.isfinite(data["value"]):
            data["value"] = None
        return data


def at_least(severity: str, threshold: str) -> bool:
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[threshold]
