"""autocast-onnx: automatic mixed precision for ONNX models, explained node by node.

import autocast_onnx
result = autocast_onnx.convert("model.onnx", precision="fp16")   # also calibration_data=, target=
result.model   # the converted onnx.ModelProto
result.plan    # the PrecisionPlan: every node's precision and the reasons for it
report = autocast_onnx.validate("model.onnx", result.model)      # ValidationReport
autocast_onnx.explain("model.onnx", op="Softmax")                 # [NodePlan, ...]
autocast_onnx.lint("model.fp16.onnx")                             # LintReport
autocast_onnx.diagnose("model.onnx", "model.fp16.onnx")           # error attribution

The functions take the CLI's options as keywords (docs/api.md).
"""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

from . import lint, validate  # callable: autocast_onnx.validate(...) and autocast_onnx.lint(...)
from .api import LintReport, OutputComparison, ValidationReport, convert, explain
from .errors import AutocastError
from .gate import CheckResult, check
from .options import PlanOptions
from .pipeline import ConversionResult, DataPlanning, convert_file, plan_on_data
from .plan import NodePlan, PrecisionPlan
from .validate.diagnose import diagnose_files as diagnose

__all__ = [
    "AutocastError",
    "CheckResult",
    "ConversionResult",
    "DataPlanning",
    "LintReport",
    "NodePlan",
    "OutputComparison",
    "PlanOptions",
    "PrecisionPlan",
    "ValidationReport",
    "__version__",
    "check",
    "convert",
    "convert_file",
    "diagnose",
    "explain",
    "lint",
    "plan_on_data",
    "validate",
]
