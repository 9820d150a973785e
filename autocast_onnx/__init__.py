"""autocast-onnx: automatic mixed precision for ONNX models, explained node by node.

import autocast_onnx
result = autocast_onnx.convert("model.onnx", precision="fp16")
result.model   # the converted onnx.ModelProto
result.plan    # the PrecisionPlan: every node's precision and the reasons for it
"""

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

from .errors import AutocastError
from .gate import CheckResult, check
from .options import PlanOptions
from .pipeline import ConversionResult, DataPlanning, convert, convert_file, plan_on_data
from .plan import PrecisionPlan
from .validate.diagnose import diagnose_files as diagnose

__all__ = [
    "AutocastError",
    "CheckResult",
    "ConversionResult",
    "DataPlanning",
    "PlanOptions",
    "PrecisionPlan",
    "__version__",
    "check",
    "convert",
    "convert_file",
    "diagnose",
    "plan_on_data",
]
