"""An estimate of GPU latency without a GPU: a roofline model of an ONNX graph.

Each kernel takes max(FLOPs / peak FLOP/s, bytes / bandwidth), or the launch cost (gpus.json) where
that is longer: launches are asynchronous, so the GPU runs one kernel while the next is dispatched;
the patterns ONNX Runtime fuses count as one kernel, whose tensors between its nodes never reach
memory. Products (MatMul, Gemm, Conv, ConvTranspose, attention) are priced at the tensor-core
peak of their input type (fp32 as TF32, as ONNX Runtime's CUDA provider runs it by default);
every other op is priced by its bytes. It ignores caches, kernel choice and occupancy, overlap of
kernels, layout transposes the runtime inserts, and CPU fallbacks; it is an estimate, which
docs/benchmarks.md holds against measured figures. Below planning: it reads a model, its shapes
and the fused groups a caller names, and nothing of the plan."""

from .gpus import GPU, gpu, table
from .model import Estimate, KernelCost, estimate

__all__ = ["GPU", "Estimate", "KernelCost", "estimate", "gpu", "table"]
