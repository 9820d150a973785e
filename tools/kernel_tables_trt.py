"""Write autocast_onnx/data/kernels_tensorrt.json: which ONNX ops TensorRT's ONNX parser
accepts, and at which tensor types, as its operator support matrix (docs/operators.md in
the onnx-tensorrt repository) states them.

TensorRT builds strongly typed engines: the types written in the graph are the types that
run, and a layer given a type it does not support fails the build. The converter therefore
needs, per op, the types TensorRT accepts; this table records them with the commit they
were read from, so that a reader can check the source and regenerate it.

Run by hand against a git copy of onnx-tensorrt (no network access is needed here):

    python tools/kernel_tables_trt.py --git-dir PATH/TO/onnx-tensorrt/.git --ref 10.1-GA

The matrix's type names (FP32, FP16, BF16, ...) are written as ONNX tensor type names
("float", "float16", "bfloat16", ...). The matrix's own text is kept in "types_raw".
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess

DOC_PATH = "docs/operators.md"
REPO = "onnx/onnx-tensorrt"
OUT = pathlib.Path(__file__).resolve().parent.parent / "autocast_onnx" / "data" / "kernels_tensorrt.json"

# The matrix's type names, as ONNX tensor type names. TensorRT's FP8 is E4M3 (FN variant).
TYPE_NAMES = {
    "DOUBLE": "double",
    "FP32": "float",
    "FP16": "float16",
    "BF16": "bfloat16",
    "FP8": "float8e4m3fn",
    "INT64": "int64",
    "INT32": "int32",
    "INT8": "int8",
    "INT4": "int4",
    "UINT8": "uint8",
    "BOOL": "bool",
}
# Misspellings found in the matrix, read as the type they plainly mean (recorded in "types_raw").
TYPOS = {"INF64": "INT64"}


def git(git_dir: str, *args: str) -> str:
    """Run one read-only git command against the onnx-tensorrt copy and return its output."""
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def parse_types(cell: str) -> list[str]:
    """Turn a 'Supported Types' cell ('FP32, FP16, BF16') into sorted ONNX type names."""
    names = set()
    for token in cell.split(","):
        token = token.strip().upper()
        if not token:
            continue
        token = TYPOS.get(token, token)
        if token not in TYPE_NAMES:
            raise SystemExit(f"unknown type {token!r} in the support matrix; add it to TYPE_NAMES")
        names.add(TYPE_NAMES[token])
    return sorted(names)


def parse_matrix(text: str) -> list[dict]:
    """Read the rows of the '## Operator Support Matrix' table: operator, supported, types, restrictions."""
    section = text.split("## Operator Support Matrix", 1)[1]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cells += [""] * (4 - len(cells))
        op, supported, types, restrictions = cells[0], cells[1], cells[2], "|".join(cells[3:]).strip()
        if op == "Operator" or set(op) <= {"-"}:
            continue
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", op):
            raise SystemExit(f"unexpected operator cell {op!r}")
        flag = supported.split()[0] if supported else ""
        if flag not in ("Y", "N"):
            raise SystemExit(f"unexpected 'Supported' cell {supported!r} for {op}")
        rows.append(
            {
                "op": op,
                "supported": flag == "Y",
                "supported_note": supported[1:].strip(),
                "types": parse_types(types),
                "types_raw": types,
                "restrictions": restrictions,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--git-dir", required=True, help="git directory of an onnx-tensorrt copy")
    parser.add_argument("--ref", default="10.1-GA", help="branch, tag or commit to read (default 10.1-GA)")
    args = parser.parse_args()
    commit = git(args.git_dir, "rev-parse", f"{args.ref}^{{commit}}").strip()
    date = git(args.git_dir, "log", "-1", "--format=%cI", commit).strip()
    text = git(args.git_dir, "show", f"{commit}:{DOC_PATH}")
    stated = re.search(r"TensorRT (\d+(?:\.\d+)*) supports operators", text)
    cmake = git(args.git_dir, "show", f"{commit}:CMakeLists.txt")
    parser_version = ".".join(re.findall(r"set\(ONNX2TRT_(?:MAJOR|MINOR|PATCH) (\d+)\)", cmake))
    opsets = re.search(r"opset (\d+) to opset (\d+)", text)
    rows = parse_matrix(text)
    ops = [r["op"] for r in rows]
    if len(set(ops)) != len(ops):
        raise SystemExit(f"duplicate operators in the matrix: {sorted({o for o in ops if ops.count(o) > 1})}")
    table = {
        "runtime": "tensorrt",
        "tensorrt": stated.group(1) if stated else None,
        "parser_version": parser_version,
        "opset_range": [int(opsets.group(1)), int(opsets.group(2))] if opsets else None,
        "source": {"repo": REPO, "ref": args.ref, "commit": commit, "commit_date": date, "file": DOC_PATH},
        "generated_by": "tools/kernel_tables_trt.py",
        "ops": sorted(rows, key=lambda r: r["op"]),
    }
    OUT.write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {len(rows)} ops ({sum(r['supported'] for r in rows)} supported) from {commit[:12]} to {OUT}")


if __name__ == "__main__":
    main()
