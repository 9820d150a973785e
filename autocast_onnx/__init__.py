"""autocast-onnx: automatic mixed precision for ONNX models, explained node by node.

import autocast_onnx
result = autocast_onnx.convert("model.onnx", precision="fp16")
result.model   # the converted onnx.ModelProto
result.plan    # the PrecisionPlan: every node's precision and the reasons for it
"""

from .errors import AutocastError
from .pipeline import ConversionResult, convert, convert_file
from .plan import PrecisionPlan

__version__ = "0.1.0"
__all__ = ["AutocastError", "ConversionResult", "PrecisionPlan", "__version__", "convert", "convert_file"]
