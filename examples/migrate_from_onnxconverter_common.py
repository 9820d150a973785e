"""The one-import switch from onnxconverter-common to autocast-onnx, on the example models.

A script written for onnxconverter-common:

    from onnxconverter_common.float16 import convert_float_to_float16
    model_fp16 = convert_float_to_float16(onnx.load("model.onnx"), keep_io_types=True)

switches by changing its import only:

    from autocast_onnx.compat import convert_float_to_float16

This script makes that same call with each import on every example model and prints, for each,
whether the output passes onnx.checker (full check) and loads in ONNX Runtime, and its error
against the fp32 model: the largest relative L2 error over the float outputs on generated inputs
(validate's generator, seed 0), with the low type's rounding emulated on CPU as `autocast-onnx
validate` measures (benchmarks/bench_peers.py measures the same way). Run it where
onnxconverter-common is installed, outside the project's dependencies:

    python3 -m venv .venv-peers && .venv-peers/bin/pip install -e ".[peers-test]"
    .venv-peers/bin/python examples/migrate_from_onnxconverter_common.py

Without onnxconverter-common it prints the "after" columns only. docs/migrating.md shows the table.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
MODELS = sorted((ROOT / "examples" / "models").glob("*.onnx")) + sorted(
    (ROOT / "tests" / "data" / "evidence").glob("*.onnx")
)


def the_script(convert_float_to_float16, path: Path) -> onnx.ModelProto:
    """The user's code, unchanged between the two imports."""
    model = onnx.load(str(path))
    return convert_float_to_float16(model, keep_io_types=True)


def outcome(source: onnx.ModelProto, converted: onnx.ModelProto) -> dict:
    """Checker (full), ONNX Runtime load, and the worst relative L2 error against fp32 (emulated)."""
    from autocast_onnx.validate import runner
    from autocast_onnx.validate.diagnose import relative_error
    from autocast_onnx.validate.emulate import emulation_model
    from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

    row: dict = {"checker": "ok", "ort": "ok", "error": None}
    try:
        onnx.checker.check_model(converted, full_check=True)
    except Exception as exc:
        row["checker"] = "FAIL: " + str(exc).splitlines()[0][:60]
    try:
        runner.session(converted.SerializeToString(), "cpu")
    except Exception as exc:
        row["ort"] = "FAIL: " + str(exc).splitlines()[0][:60]
    feeds = generate(plan_inputs(describe_inputs(source)), seed=0)
    ref = runner.run(runner.session(source.SerializeToString(), "cpu"), feeds)
    emu = runner.session(emulation_model(converted).SerializeToString(), "cpu", optimize=False)
    got = runner.run(emu, runner.feeds_for(emu, feeds))
    errors = [relative_error(g, r) for r, g in zip(ref, got) if r.dtype.kind == "f"]
    row["error"] = max(errors) if errors else None
    return row


def main() -> int:
    from autocast_onnx.compat import convert_float_to_float16 as after

    try:
        from onnxconverter_common.float16 import convert_float_to_float16 as before
    except ImportError:
        before = None
        print("onnxconverter-common is not installed here: the 'before' columns are left out", file=sys.stderr)
    head = ["model", "before: checker", "before: ORT", "before: error", "after: checker", "after: ORT", "after: error"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for path in MODELS:
        source = onnx.load(str(path))
        cells = [path.stem]
        for convert in (before, after):
            if convert is None:
                cells += ["-", "-", "-"]
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the peer's clamping notes and the plan's notes
                row = outcome(source, the_script(convert, path))
            error = "-" if row["error"] is None else f"{row['error']:.2e}"
            cells += [row["checker"], row["ort"], error]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
