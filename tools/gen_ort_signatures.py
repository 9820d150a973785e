"""Write autocast_onnx/data/ort_signatures.json: port signatures of ONNX Runtime ops
that the `onnx` package has no schema for (com.microsoft contrib ops and the few
default-domain ops ONNX Runtime adds). The converter uses them to infer tensor types
and to tell which ports follow a node's precision, without needing onnxruntime at
run time.

Run with onnxruntime installed:  python tools/gen_ort_signatures.py
"""

import json
import pathlib

import onnx.defs
import onnxruntime.capi.onnxruntime_pybind11_state as ort_c

OPTION = {0: "single", 1: "optional", 2: "variadic"}


def main() -> None:
    table = {}
    for schema in ort_c.get_all_operator_schema():
        domain = "" if schema.domain in ("", "ai.onnx") else schema.domain
        if domain in ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"):
            if onnx.defs.has(schema.name, domain):
                continue
        key = f"{domain}:{schema.name}" if domain else schema.name
        prev = table.get(key)
        if prev is not None and prev["since_version"] >= schema.since_version:
            continue
        table[key] = {
            "since_version": schema.since_version,
            "inputs": [[p.name, p.typeStr, OPTION[int(p.option.value)]] for p in schema.inputs],
            "outputs": [[p.name, p.typeStr, OPTION[int(p.option.value)]] for p in schema.outputs],
            "params": {c.type_param_str: sorted(c.allowed_type_strs) for c in schema.type_constraints},
        }
    out = pathlib.Path(__file__).resolve().parent.parent / "autocast_onnx" / "data" / "ort_signatures.json"
    out.write_text(json.dumps(dict(sorted(table.items())), indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} signatures to {out}")


if __name__ == "__main__":
    main()
