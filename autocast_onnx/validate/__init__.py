"""Validation: run the reference and converted models on the same inputs with ONNX Runtime
(CUDA when present, faithful fp16 emulation on CPU) and compare accuracy and speed."""

# `autocast_onnx.validate(...)` is the API function (validate/api.py, re-exported by autocast_onnx.api);
# the package stays importable as `autocast_onnx.validate.<module>`.
import sys as _sys
import types as _types


class _CallablePackage(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .api import validate as _validate

        return _validate(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallablePackage
