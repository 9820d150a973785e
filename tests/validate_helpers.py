"""Helpers for the validate and emulation tests: run an emulation model the way `validate` does,
compare I/O signatures, and call the CLI in-process or as a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import helper

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
DATA = ROOT / "examples" / "data"


def ort_session(m: onnx.ModelProto, optimize: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        # validate() runs the emulation model with graph optimizations off (runner.session(optimize=False))
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_emulated(emu: onnx.ModelProto, feeds: dict, extra_outputs=()) -> list:
    """Run an emulation model on ORT CPU as validate() does; `extra_outputs` exposes inner tensors
    (appended after the model's outputs, declared fp32 - the type emulation gives inner tensors)."""
    m = emu
    if extra_outputs:
        m = onnx.ModelProto()
        m.CopyFrom(emu)
        for name in extra_outputs:
            m.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return ort_session(m, optimize=False).run(None, feeds)


def io_signature(m: onnx.ModelProto):
    """(name, serialized TypeProto) of the main graph's inputs and outputs (initializers excluded)."""
    inits = {t.name for t in m.graph.initializer}
    ins = [(v.name, v.type.SerializeToString()) for v in m.graph.input if v.name not in inits]
    outs = [(v.name, v.type.SerializeToString()) for v in m.graph.output]
    return ins, outs


def io_types(m: onnx.ModelProto):
    inits = {t.name for t in m.graph.initializer}
    return (
        [(v.name, v.type.tensor_type.elem_type) for v in m.graph.input if v.name not in inits],
        [(v.name, v.type.tensor_type.elem_type) for v in m.graph.output],
    )


def nonfinite(a) -> int:
    return int(np.count_nonzero(~np.isfinite(np.asarray(a, dtype=np.float64))))


def bf16_exact(a) -> bool:
    """Every value of the fp32 array is a bfloat16 value: the low 16 bits of its pattern are zero."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return bool(np.all((bits & 0xFFFF) == 0))


def fp16_exact(a) -> bool:
    a = np.asarray(a, dtype=np.float32)
    finite = np.isfinite(a)
    return bool(np.array_equal(a[finite].astype(np.float16).astype(np.float32), a[finite]))


class CliResult:
    def __init__(self, code, stdout, stderr, exception=None):
        self.code, self.stdout, self.stderr, self.exception = code, stdout, stderr, exception

    def error_line(self) -> str:
        """The one error line on stderr; fails the test if there is a traceback or more lines."""
        assert self.exception is None, f"uncaught {type(self.exception).__name__}: {self.exception}"
        assert "Traceback" not in self.stderr, self.stderr
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith("autocast-onnx: error: "), lines[0]
        return lines[0]


def cli(*args) -> CliResult:
    """Run the CLI in-process (fast). An exception that escapes the command is kept in
    `.exception` (a real process would print a traceback and exit 1)."""
    from autocast_onnx.cli.main import cli as group

    result = CliRunner().invoke(group, [str(a) for a in args], prog_name="autocast-onnx")
    exc = result.exception if result.exception is not None and not isinstance(result.exception, SystemExit) else None
    return CliResult(result.exit_code, result.stdout, result.stderr, exc)


def cli_proc(*args, cwd=None) -> CliResult:
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", *map(str, args)], check=False, capture_output=True, text=True, cwd=cwd
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)
