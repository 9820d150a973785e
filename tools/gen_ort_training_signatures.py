"""Check autocast_onnx/data/ort_training_signatures.json: port signatures of the ONNX Runtime training ops
(gradient, loss, optimizer and pipeline ops that onnxruntime-training writes into training graphs).

onnxruntime-training's pybind module has no get_all_operator_schema, so tools/gen_ort_signatures.py cannot
see these ops. The entries were transcribed by hand from orttraining/orttraining/core/graph/training_op_defs.cc
of microsoft/onnxruntime (a post-1.17 main-branch copy of the file, the one with ResizeGrad, ConvTransposeGrad,
ScaledSum/BatchScale and FlattenAndUnpad; the v1.19.2 tag itself could not be read), then checked against the
onnxruntime-training 1.19.2 wheel: for every op, graph resolution was asked for its input/output count range,
which ports may be left empty, and which element types each input-bound type parameter accepts. Where file and
wheel differed the wheel won: BinaryCrossEntropy(Grad) are not registered in 1.19.2 and are left out.
Also: of LambOptimizer's 1024 repeated groups (AddRepeatedInputs/Outputs) only the first is written (later
ports have no signature; the op is kept fp32 whole); the bare "float"
and "int64" constraints of SGDOptimizer and AdamOptimizer are written as the tensor types ORT resolves them to;
the default-domain GatherND (since 1) is left to the onnx package, as in ort_signatures.json; TritonOp is
registered only in builds with ENABLE_TRITON (the 1.19.2 wheel is one). To update, edit the JSON by hand from
the newer file, then run this script:  python tools/gen_ort_training_signatures.py
"""

import json
import pathlib
import re
import sys

DATA = pathlib.Path(__file__).resolve().parent.parent / "autocast_onnx" / "data"
OPTIONS = {"single", "optional", "variadic"}
TYPE_RE = re.compile(r"(seq\()?tensor\([a-z0-9]+\)\)?")


def problems(table: dict, ort: dict) -> list[str]:
    out = []
    for key, entry in table.items():
        domain, _, name = key.rpartition(":")
        if domain not in ("", "com.microsoft") or not name:
            out.append(f"{key}: key must be 'com.microsoft:Op' or a default-domain 'Op'")
        if key in ort:
            out.append(f"{key}: already in ort_signatures.json")
        if set(entry) != {"inputs", "outputs", "params", "since_version"}:
            out.append(f"{key}: keys {sorted(entry)}")
            continue
        if not isinstance(entry["since_version"], int) or entry["since_version"] < 1:
            out.append(f"{key}: since_version {entry['since_version']!r}")
        params, used = entry["params"], set()
        for param, types in params.items():
            if not types or types != sorted(types) or not all(TYPE_RE.fullmatch(t) for t in types):
                out.append(f"{key}: param {param} types {types}")
        for side in ("inputs", "outputs"):
            ports = entry[side]
            for i, port in enumerate(ports):
                if not (isinstance(port, list) and len(port) == 3 and all(isinstance(p, str) for p in port)):
                    out.append(f"{key}: {side}[{i}] is not [name, type, option]")
                    continue
                _, ptype, option = port
                if option not in OPTIONS or (option == "variadic" and i != len(ports) - 1):
                    out.append(f"{key}: {side}[{i}] option {option!r}")
                if ptype in params:
                    used.add(ptype)
                elif not TYPE_RE.fullmatch(ptype) or ptype.startswith("seq("):
                    out.append(f"{key}: {side}[{i}] type {ptype!r} is neither a param nor a tensor(...) type")
        if used != set(params):
            out.append(f"{key}: params not used by any port: {sorted(set(params) - used)}")
    if list(table) != sorted(table):
        out.append("keys are not sorted")
    return out


def main() -> int:
    path = DATA / "ort_training_signatures.json"
    text = path.read_text()
    table = json.loads(text)
    ort = json.loads((DATA / "ort_signatures.json").read_text())
    found = problems(table, ort)
    if text != json.dumps(table, indent=1, sort_keys=True) + "\n":
        found.append("not written as json.dumps(table, indent=1, sort_keys=True) + newline")
    sys.stderr.write("".join(line + "\n" for line in found))
    print(f"{len(table)} training-op signatures in {path.name}, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
