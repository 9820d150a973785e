"""Planning: classify every node and paint precisions into a `PrecisionPlan` (reads only), or
read a plan back from its file and check that it fits the model."""

from .classify import Classification, classify
from .model import PLAN_VERSION, NodePlan, PlanWarning, PrecisionPlan, Reason
from .paint import global_order, index_fingerprint, paint
from .replay import check_plan_fits
from .vocab import Category, Paint, PortRole, Precision, Seed, required_type

__all__ = [
    "PLAN_VERSION",
    "Category",
    "Classification",
    "NodePlan",
    "Paint",
    "PlanWarning",
    "PortRole",
    "Precision",
    "PrecisionPlan",
    "Reason",
    "Seed",
    "check_plan_fits",
    "classify",
    "global_order",
    "index_fingerprint",
    "paint",
    "required_type",
]
