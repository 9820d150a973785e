"""Mixed-precision training support: dynamic loss scaling (DynamicLossScaler), one training step
for onnxruntime-training's Module/Optimizer (TrainingStep), and the conversion of an artifacts
folder (convert_artifacts). Nothing here imports onnxruntime."""

from .artifacts import ArtifactsResult, convert_artifacts, is_artifacts_dir
from .scaler import DynamicLossScaler
from .step import StepResult, TrainingStep

__all__ = [
    "ArtifactsResult",
    "DynamicLossScaler",
    "StepResult",
    "TrainingStep",
    "convert_artifacts",
    "is_artifacts_dir",
]
