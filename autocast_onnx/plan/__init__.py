"""Planning: classify every node and paint precisions into a `PrecisionPlan` (reads only)."""

from .classify import Classification, classify
from .model import NodePlan, PrecisionPlan, Reason
from .paint import global_order, paint

__all__ = ["Classification", "NodePlan", "PrecisionPlan", "Reason", "classify", "global_order", "paint"]
