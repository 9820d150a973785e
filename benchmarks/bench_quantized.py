"""Quantized (Q/DQ) example models through autocast-onnx and its peers: what stays int8.

Each example model (examples/models: resnet_tiny, bert_tiny, vit_tiny, digits_cnn) is quantized
with ONNX Runtime's static quantizer in the QDQ format (`quantize_static(...,
quant_format=QuantFormat.QDQ)`, int8 weights and uint8 activations, calibrated on a few batches
the validator generates), then converted:

  autocast-onnx fp16        at the model's own opset (17)
  autocast-onnx fp16 @19    with --opset 19 (fp16 Q/DQ scales)
  autocast-onnx bf16 @22    with --precision bf16 --opset 22 (the CNNs: bf16 convolutions)
  modelopt                  NVIDIA ModelOpt's modelopt.onnx.autocast.convert_to_f16 (it raises the opset
                            to 19 itself)
  onnxconverter-common      onnxconverter_common.float16.convert_float_to_float16(keep_io_types=True)

Per model and conversion: the output's opset; the int8 units kept intact (ops that read every float
input straight from DequantizeLinear, against the quantized model's); Casts between a Q/DQ node and
its op; casts added; the share of the float remainder (float nodes outside the units) computing in
fp16/bf16, and the units that do; the emulated error against the quantized fp32 model
(autocast_onnx.validate, emulated numerics, generated inputs); and the fused int8 operators in ONNX
Runtime's CPU-optimized graph before and after (autocast_onnx/validate/fusion.py).

The peers run in their own interpreter (`--peer-python`, default .venv-peers/bin/python when it
exists, else this one), never as dependencies of the project; a peer that is not installed there is
skipped with the reason printed. ModelOpt's ONNX part installs without its CUDA dependencies as

    python3 -m venv PEERS && PEERS/bin/pip install nvidia-modelopt --no-deps
    PEERS/bin/pip install onnx==1.19.1 onnxruntime==1.32.0 onnxconverter-common==1.16.0 onnx-graphsurgeon
    PEERS/bin/pip install onnxslim onnxscript lief pydantic rich pyyaml scipy tqdm safetensors nvidia-ml-py omegaconf
    PEERS/bin/pip install "pulp<4" regex
    PEERS/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu

An autocast-onnx option this checkout lacks (--opset) skips its rows the same way.

    python benchmarks/bench_quantized.py [--peer-python PYTHON] [--markdown docs/quantized.md] [--json OUT.json]

--markdown writes the table between the markers of a page that has them (docs/quantized.md), else
as the whole file.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from autocast_onnx.dtypes import BFLOAT16, FLOAT16, MIXABLE
from autocast_onnx.errors import AutocastError
from autocast_onnx.graph import build_index
from autocast_onnx.validate.core import ValidateOptions, validate
from autocast_onnx.validate.fusion import QDQ_OPS, fused_int8_ops, qdq_units
from autocast_onnx.validate.inputs import describe_inputs, generate, plan_inputs

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["resnet_tiny", "bert_tiny", "vit_tiny", "digits_cnn"]
CNNS = {"resnet_tiny", "digits_cnn"}
PEERS_VENV_PYTHON = ROOT / ".venv-peers" / "bin" / "python"

# (label, autocast-onnx convert flags, models it applies to (None: all))
OURS = [
    ("autocast-onnx fp16", [], None),
    ("autocast-onnx fp16 --opset 19", ["--opset", "19"], None),
    ("autocast-onnx bf16 --opset 22", ["--precision", "bf16", "--opset", "22"], CNNS),
]
PEERS = ["modelopt", "onnxconverter-common"]

# Runs in the peer interpreter: convert SRC into DST with TOOL; exit 3 with a line when the tool is missing.
PEER_DRIVER = r"""
import sys
tool, src, dst = sys.argv[1:4]
import onnx
try:
    if tool == "modelopt":
        from modelopt.onnx.autocast import convert_to_f16 as conv
    else:
        from onnxconverter_common.float16 import convert_float_to_float16 as conv
except ImportError as exc:
    print(f"{tool} is not installed in {sys.executable}: {exc}".splitlines()[0])
    sys.exit(3)
onnx.save(conv(onnx.load(src), keep_io_types=True), dst)
"""


def quantize(name: str, out: Path) -> Path:
    """examples/models/NAME.onnx quantized statically in the QDQ format (ONNX Runtime's defaults:
    int8 weights per tensor, uint8 activations), calibrated on 4 generated batches."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    src = ROOT / "examples" / "models" / f"{name}.onnx"
    plan = plan_inputs(describe_inputs(onnx.load(src)), {}, {})

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([generate(plan, seed=100 + k) for k in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ)
    return out


def convert_ours(src: Path, dst: Path, flags: list) -> str | None:
    """autocast-onnx convert as a user runs it; None on success, else why it was skipped."""
    run = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "convert", str(src), "-o", str(dst), *flags],
        capture_output=True,
        text=True,
    )
    if run.returncode == 0:
        return None
    lines = run.stderr.strip().splitlines()
    return f"autocast-onnx convert {' '.join(flags)} failed: {lines[-1] if lines else run.returncode}"


def convert_peer(peer_python: str, tool: str, src: Path, dst: Path) -> str | None:
    run = subprocess.run([peer_python, "-c", PEER_DRIVER, tool, str(src), str(dst)], capture_output=True, text=True)
    if run.returncode == 0:
        return None
    out = (run.stdout.strip() or run.stderr.strip() or f"exit {run.returncode}").splitlines()
    return out[-1] if run.returncode == 3 else f"{tool} failed: {out[-1][:200]}"


def _compute_type(node) -> int | None:
    """A node's compute type: its first float output's type, else its first float input's."""
    for value in list(node.outputs) + list(node.inputs):
        if value is not None and value.dtype in MIXABLE:
            return value.dtype
    return None


def low_shares(quantized: onnx.ModelProto, converted: onnx.ModelProto, units: list) -> tuple[str, str]:
    """(low-precision share of the float remainder, of the units): nodes of the quantized model
    (by name) outside Q, DQ and Cast that touch a float tensor, and the units among them, whose
    namesake in the converted model computes in fp16 or bf16."""
    ref = build_index(quantized, "<quantized>")
    conv = {n.name: n for n in build_index(converted, "<converted>").nodes}
    unit_set = set(units)
    counts = {"remainder": [0, 0], "units": [0, 0]}
    for node in ref.nodes:
        if node.op in QDQ_OPS or node.op == "Cast" or _compute_type(node) is None:
            continue
        kind = "units" if node.name in unit_set else "remainder"
        counts[kind][1] += 1
        twin = conv.get(node.name)
        counts[kind][0] += twin is not None and _compute_type(twin) in (FLOAT16, BFLOAT16)
    return tuple(f"{low}/{total}" for low, total in (counts["remainder"], counts["units"]))  # type: ignore[return-value]


def measure(quantized: Path, converted: Path, before: dict) -> dict:
    """One row's figures (see the module's docstring)."""
    q_model, c_model = onnx.load(quantized), onnx.load(converted)
    ref_units, conv_units = qdq_units(q_model), qdq_units(c_model)
    remainder, units_low = low_shares(q_model, c_model, ref_units["unit_nodes"])
    row = {
        "opset": next(o.version for o in c_model.opset_import if o.domain in ("", "ai.onnx")),
        "units_kept": f"{sum(conv_units['units'].values())}/{sum(ref_units['units'].values())}",
        "casts_next_to_qdq": f"{len(conv_units['between'])} ({len(ref_units['between'])})",
        "casts_added": sum(n.op_type == "Cast" for n in c_model.graph.node)
        - sum(n.op_type == "Cast" for n in q_model.graph.node),
        "scales": "/".join(conv_units["scale_types"]),
        "remainder_low": remainder,
        "units_low": units_low,
        "fused_before": before,
        "fused_after": fused_int8_ops(converted).ops,
    }
    try:
        report = validate(str(quantized), str(converted), ValidateOptions(device="cpu", numerics="emulate", batches=2))
        worst = max(report["outputs"], key=lambda o: o["relative_error"])
        row["error"] = {"relative": worst["relative_error"], "max_abs": worst["max_abs_error"], "output": worst["name"]}
    except AutocastError as exc:
        row["error"] = {"refused": _why(_load_error(converted) or exc.what)}
    return row


def _load_error(path: Path) -> str | None:
    """ONNX Runtime's whole message when it refuses to load the model (validation's line is cut)."""
    import onnxruntime

    try:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own exception types
        return str(exc)
    return None


def _why(what: str) -> str:
    """ONNX Runtime's refusal, short: the type error's tensor, op and node when it gives one."""
    found = re.search(r"Type '([^']+)' of input parameter \((.+?)\) of operator \((.+?)\) in node \((.+?)\)", what)
    if found:
        elem, tensor, op, node = found.groups()
        return f"{elem} {tensor} of {op} {node} refused"
    return what[:140]


def _fused(ops: dict | None) -> str:
    return "-" if ops is None else str(sum(ops.values()))


def markdown(rows: list) -> str:
    head = (
        "| model | conversion | opset | int8 units intact | Casts next to Q/DQ (before) | casts added | scales "
        "| remainder low | units low | emulated rel. error (max abs) | ORT CPU int8 ops before → after |\n"
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|---|\n"
    )
    lines = []
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['model']} | {r['tool']} | | | | | | | | skipped: {r['skipped']} | |")
            continue
        e = r["error"]
        err = f"{e['relative']:.3g} ({e['max_abs']:.3g})" if "relative" in e else f"does not load: {e['refused']}"
        lines.append(
            f"| {r['model']} | {r['tool']} | {r['opset']} | {r['units_kept']} | {r['casts_next_to_qdq']} "
            f"| {r['casts_added']} | {r['scales']} | {r['remainder_low']} | {r['units_low']} | {err} "
            f"| {_fused(r['fused_before'])} → {_fused(r['fused_after'])} |"
        )
    return head + "\n".join(lines) + "\n"


BEGIN, END = "<!-- bench_quantized table -->\n", "<!-- end bench_quantized table -->"


def write_table(path: Path, table: str) -> None:
    """The table into `path`: between its markers when the file has them (docs/quantized.md),
    else as the whole file."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        path.write_text(head + BEGIN + table + rest[rest.index(END) :])
    else:
        path.write_text(table)


def run_model(name: str, work: Path, peer_python: str) -> list:
    quantized = quantize(name, work / f"{name}.q.onnx")
    before = fused_int8_ops(quantized).ops
    rows = []
    jobs = [(label, flags) for label, flags, only in OURS if only is None or name in only]
    for label, flags in jobs + [(peer, None) for peer in PEERS]:
        out = work / f"{name}.{label.replace(' ', '_').replace('-', '')}.onnx"
        skipped = (
            convert_ours(quantized, out, flags)
            if flags is not None
            else convert_peer(peer_python, label, quantized, out)
        )
        row = {"model": name, "tool": label}
        if skipped:
            print(f"{name}: {label} skipped: {skipped}", file=sys.stderr)
            row["skipped"] = skipped
        else:
            row.update(measure(quantized, out, before))
        rows.append(row)
        print(json.dumps(row, default=float), file=sys.stderr)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_peer = str(PEERS_VENV_PYTHON) if PEERS_VENV_PYTHON.exists() else sys.executable
    parser.add_argument("--peer-python", default=default_peer, help="interpreter with the peers installed")
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--markdown", help="write the table here too")
    parser.add_argument("--json", help="write every row as JSON here")
    parser.add_argument("--keep", help="keep the models in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-quantized-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = [row for name in args.models for row in run_model(name, work, args.peer_python)]
    table = markdown(rows)
    print(table)
    if args.markdown:
        write_table(Path(args.markdown), table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
