"""Validation: run the reference and converted models on the same inputs with ONNX Runtime
(CUDA when present, faithful fp16 emulation on CPU) and compare accuracy and speed."""
