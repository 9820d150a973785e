"""autocast-onnx: automatic mixed precision for ONNX models, explained node by node.

import autocast_onnx
result = autocast_onnx.convert("model.onnx", precision="fp16")   # also calibration_data=, target=
result.model   # the converted onnx.ModelProto
result.plan    # the PrecisionPlan: every node's precision and the reasons for it
report = autocast_onnx.validate("model.onnx", result.model)      # ValidationReport
autocast_onnx.explain("model.onnx", op="Softmax")                 # [NodePlan, ...]
autocast_onnx.lint("model.fp16.onnx")                             # LintReport
autocast_onnx.diagnose("model.onnx", "model.fp16.onnx")           # DiagnoseReport: error attribution
autocast_onnx.check("model.onnx", precision="bf16", rtol=0.05)    # CheckResult: the CI gate

The functions take the CLI's options as keywords (docs/api.md).
"""

from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from . import lint, validate  # callable: autocast_onnx.validate(...) and autocast_onnx.lint(...)
    from .api import check, convert, explain
    from .errors import AutocastError
    from .gate import CheckResult
    from .lint.api import LintReport
    from .pipeline import ConversionResult, convert_file
    from .plan import NodePlan, PrecisionPlan
    from .plan.options import PlanOptions
    from .validate.api import OutputComparison, ValidationReport
    from .validate.diagnose import DiagnoseReport
    from .validate.diagnose import diagnose_files as diagnose
    from .validate.on_data import DataPlanning, plan_on_data

# Each public name is imported on first use (PEP 562): `autocast-onnx convert` then loads the
# conversion's modules only, not those of lint and validation (a tenth of a second per process).
_WHERE = {
    "lint": (".lint", None),
    "validate": (".validate", None),
    "LintReport": (".lint.api", "LintReport"),
    "OutputComparison": (".validate.api", "OutputComparison"),
    "ValidationReport": (".validate.api", "ValidationReport"),
    "convert": (".api", "convert"),
    "explain": (".api", "explain"),
    "AutocastError": (".errors", "AutocastError"),
    "CheckResult": (".gate", "CheckResult"),
    "check": (".api", "check"),
    "PlanOptions": (".plan.options", "PlanOptions"),
    "ConversionResult": (".pipeline", "ConversionResult"),
    "DataPlanning": (".validate.on_data", "DataPlanning"),
    "convert_file": (".pipeline", "convert_file"),
    "plan_on_data": (".validate.on_data", "plan_on_data"),
    "NodePlan": (".plan", "NodePlan"),
    "PrecisionPlan": (".plan", "PrecisionPlan"),
    "diagnose": (".validate.diagnose", "diagnose_files"),
    "DiagnoseReport": (".validate.diagnose", "DiagnoseReport"),
}


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'autocast_onnx' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(where[0], __name__)
    value = module if where[1] is None else getattr(module, where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "AutocastError",
    "CheckResult",
    "ConversionResult",
    "DataPlanning",
    "DiagnoseReport",
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
