"""Mixed-precision training support: dynamic loss scaling (this package will also hold the step
helper for onnxruntime-training's Module/Optimizer). Pure Python; nothing here needs a runtime."""

from .scaler import DynamicLossScaler

__all__ = ["DynamicLossScaler"]
