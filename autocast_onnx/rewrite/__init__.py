"""Rewrite: the one stage that edits the model. Applies a precision plan (casts, converted
initializers, retargeted dtype attributes, value_info), then checks the result."""

from .apply import ApplyStats, apply_plan
from .checks import check_result

__all__ = ["ApplyStats", "apply_plan", "check_result"]
