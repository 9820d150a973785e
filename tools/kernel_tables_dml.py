"""Write autocast_onnx/data/kernels_dml.json: the kernels ONNX Runtime's DirectML execution provider registers.

Source: ``onnxruntime/core/providers/dml/DmlExecutionProvider/src/Operators/OperatorRegistration.cpp`` read from a
git copy of the ONNX Runtime tree. Its ``operatorRegistrationInformationTable`` holds one ``REG_INFO*(set, Op,
typeNames, supportedTypes, ...)`` row per registration. ``set`` names an ONNX (or com.microsoft) operator set; the
registered opset is ``OnnxOperatorSet<set>::sc_sinceVer_<Op>`` from ``OperatorAuthorHelper/OperatorVersions.h``.
The type lists (``supportedTypeList*``) are flag sets of ``SupportedTensorDataTypes``, expanded as the file's own
``RegisterDmlOperators`` does (only the scalar types it pushes; sequence types are left out). A row's types are
those of its constraint named T, else the union of its constraints, as in the CUDA table (tools/kernel_tables.py).
The kernels registered outside that table (DFT, STFT, GridSample, and the CPU kernels registered as DML ones:
Sequence*, Optional*, If) take their opset from the sources and their types from docs/OperatorKernels.md at the
same commit (``"types_from": "docs"``); the DML section of that file cross-checks every row.

Opset ranges. A DML registration has a start opset and no end, and ONNX Runtime matches a kernel without an end
only to a node whose schema ``since_version`` equals that start (kernel_registry.cc, VerifyVersion). A
registration therefore serves the opsets up to the next version of the op's schema: ``until`` is one below the
next schema version of the op (ONNX domain, from the installed onnx package's schema history, limited to the
opsets of the onnx release ONNX Runtime vendors at that commit, cmake/deps.txt) or below the next registration of
the op, whichever comes first; ``null`` when neither exists. So Conv, registered at 1 and 11, is listed [1, 10]
and [11, 21]: a Conv-22 node finds no DML kernel. Ops outside the onnx package (com.microsoft, the ORT-only
ONNX-domain ops) end at their next registration. The EP's own fused-op domain (com.microsoft.dml) is left out: only
its graph fusion creates those nodes. ``#if DML_TARGET_VERSION`` blocks are taken as on (a release build targets
the newest DirectML).

Version gap: the newest ONNX Runtime tree stored here is onnxruntime 1.23.0 (VERSION_NUMBER at upstream commit
7e59947dc of 2025-07-25), not the 1.31 the project pins for GPU. At that commit the DML registration table last
changed in November 2024 (opset 21 registrations); registrations added between 1.23 and 1.31 are missing here, so
the table errs towards "no kernel". (A stored copy named for 1.31.1 holds 1.14.0 code: check VERSION_NUMBER.)

Not modelled: a registration's support-query function (QueryScatter, ...) and its required-CPU-constant inputs
(Range, Slice, ...), which can still send a single node to the CPU provider although its type is registered.

Run by hand:
    python tools/kernel_tables_dml.py --git-dir /path/to/onnxruntime/.git --ref <commit>
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

from kernel_tables import data_types, doc_entries  # the same docs table format as the CUDA section

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "autocast_onnx" / "data" / "kernels_dml.json"
OPS_DIR = "onnxruntime/core/providers/dml/DmlExecutionProvider/src/Operators/"
REGISTRATION = OPS_DIR + "OperatorRegistration.cpp"
VERSIONS = "onnxruntime/core/providers/dml/OperatorAuthorHelper/OperatorVersions.h"
SIDE_FILES = {"STFT": OPS_DIR + "DmlSTFT.h", "GridSample": OPS_DIR + "DmlGridSample.h"}
DOCS = "docs/OperatorKernels.md"
DEPS = "cmake/deps.txt"
FILES = (REGISTRATION, VERSIONS, SIDE_FILES["STFT"], SIDE_FILES["GridSample"])
GAP = (
    "Read from onnxruntime {version} (VERSION_NUMBER at the commit), the newest ONNX Runtime tree stored here; the "
    "project pins onnxruntime-gpu 1.31 for GPU, so DML registrations added between {version} and 1.31 are missing "
    "and the table may say 'no kernel' where 1.31 has one. DirectML registers no bfloat16 kernel (the only bfloat16 "
    "rows are control-flow and sequence kernels that move tensors, not compute). A DML registration has a start "
    "opset only and ONNX Runtime matches it to nodes whose schema version equals that start: until is one below the "
    "op's next schema version (onnx {onnx}, the release ONNX Runtime vendors, opsets <= {opset}) or its next "
    "registration. Per-node support queries and required-CPU-constant inputs are not modelled."
)

# Macro -> (domain, set-namespace prefix); REG_INFO_MSDML (com.microsoft.dml, the EP's fused ops) is left out.
MACROS = {
    "REG_INFO": ("", "OnnxOperatorSet"),
    "REG_INFO_VER": ("", "OnnxOperatorSet"),
    "REG_INFO_COPY": ("", "OnnxOperatorSet"),
    "REG_INFO_DYNAMIC_OUTPUTS": ("", "OnnxOperatorSet"),
    "REG_INFO_MS": ("com.microsoft", "MsftOperatorSet"),
    "REG_INFO_MS_ALIAS": ("com.microsoft", "MsftOperatorSet"),
}
# The scalar flags RegisterDmlOperators turns into tensor types, by their ONNX names (String is commented out there).
SCALARS = {
    "Float32": "float",
    "UInt4": "uint4",
    "Int4": "int4",
    "UInt8": "uint8",
    "Int8": "int8",
    "UInt16": "uint16",
    "Int16": "int16",
    "Int32": "int32",
    "Int64": "int64",
    "Bool": "bool",
    "Float16": "float16",
    "Float64": "double",
    "UInt32": "uint32",
    "UInt64": "uint64",
}
ROW = re.compile(r"\{\s*(REG_INFO\w*)\(\s*(\d+)\s*,\s*(\w+)\s*,(.*?)\)\s*\}\s*,", re.S)
CPU_KERNEL = re.compile(
    r"BuildKernelCreateInfo<ONNX_OPERATOR_KERNEL_CLASS_NAME\(kDmlExecutionProvider, (\w+), (\d+), (\w+)\)>"
)


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def active(text: str) -> str:
    """The text without comments and with ``#if``/``#endif`` lines dropped (their blocks count as on)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    lines = [re.sub(r"//.*", "", line) for line in text.splitlines()]
    return "\n".join(line for line in lines if not re.match(r"\s*#\s*(if|endif|else)", line))


def since_versions(text: str) -> dict[tuple[str, str], int]:
    """(namespace, op) -> sinceVer, from OperatorVersions.h."""
    out: dict[tuple[str, str], int] = {}
    namespace = ""
    for line in text.splitlines():
        m = re.match(r"\s*namespace (\w+)", line)
        if m:
            namespace = m.group(1)
        m = re.match(r"\s*static const int sc_sinceVer_(\w+) = (\d+);", line)
        if m:
            out[(namespace, m.group(1))] = int(m.group(2))
    return out


def flag_values(text: str) -> dict[str, set[str]]:
    """SupportedTensorDataTypes member -> the scalar types RegisterDmlOperators pushes for it."""
    body = text.split("enum class SupportedTensorDataTypes", 1)[1].split("};", 1)[0]
    values: dict[str, set[str]] = {}
    for member in filter(str.strip, body.strip().strip("{").split(",")):
        name, expr = (part.strip() for part in member.split("=", 1))
        if name == "All":
            values[name] = set(SCALARS.values())
        elif name in SCALARS:
            values[name] = {SCALARS[name]}
        elif "<<" in expr:
            values[name] = set()  # a sequence, complex or string flag: no tensor type is registered for it
        else:
            values[name] = set().union(*(values[part.strip()] for part in expr.split("|")))
    return values


def type_lists(text: str, flags: dict[str, set[str]]) -> tuple[dict[str, list[str]], dict[str, list[set[str]]]]:
    """The constraint-name lists (typeNameList*) and supported-type lists (supportedTypeList*) of the file."""
    names: dict[str, list[str]] = {}
    types: dict[str, list[set[str]]] = {}
    decl = re.compile(r"constexpr static std::array<([^>]*)>\s*(\w+)\s*=\s*(\{.*?\}|\w+)\s*;", re.S)
    for m in decl.finditer(text):
        kind, name, body = m.group(1), m.group(2), m.group(3)
        if body.strip().isidentifier():  # supportedTypeListResize13 = supportedTypeListResize11;
            types[name] = types[body.strip()]
        elif "char" in kind:
            names[name] = re.findall(r'"(\w+)"', body)
        elif "SupportedTensorDataTypes" in kind:
            items = [i for i in body.strip("{} \n").split(",") if i.strip()]
            types[name] = [set().union(*(flags[f.split("::")[1].strip()] for f in i.split("|"))) for i in items]
    return names, types


def chosen(names: list[str], sets: list[set[str]]) -> list[str]:
    """The types of the constraint named T, else the union of all constraints (as the CUDA table does)."""
    if "T" in names:
        return sorted(sets[names.index("T")])
    return sorted(set().union(*sets))


def table_rows(reg: str, versions: dict[tuple[str, str], int]) -> list[dict]:
    """One row per REG_INFO* entry of operatorRegistrationInformationTable (no `until` yet)."""
    flags = flag_values(reg)
    names, types = type_lists(reg, flags)
    body = reg.split("operatorRegistrationInformationTable[] =", 1)[1].split("\n};", 1)[0]
    rows = []
    for m in ROW.finditer(body):
        macro, opset, op, rest = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        if macro not in MACROS:
            if macro != "REG_INFO_MSDML":
                raise SystemExit(f"unknown registration macro {macro} for {op}")
            continue
        domain, prefix = MACROS[macro]
        args = [a.strip() for a in re.sub(r"Aliases\(.*?\)\)", "", rest).split(",")]
        name_list = next(a for a in args if a.startswith("typeName"))
        type_list = next(a for a in args if a.startswith("supportedTypeList"))
        since = versions[(f"{prefix}{opset}", op)]
        rows.append({"domain": domain, "op": op, "since": since, "types": chosen(names[name_list], types[type_list])})
    return rows


def side_rows(git_dir: str, commit: str, reg: str) -> list[dict]:
    """Kernels registered outside the table: DFT/STFT/GridSample factories and CPU kernels registered as DML."""
    rows = [
        {"domain": "", "op": "DFT", "since": int(v)} for v in re.findall(r"RegisterDFTKernel\(registry, (\d+)\)", reg)
    ]
    for op, path in SIDE_FILES.items():
        text = git(git_dir, "show", f"{commit}:{path}")
        m = re.search(
            rf'kernelDescription\.name = "{op}";\s*kernelDescription\.minimumOperatorSetVersion = (\d+);', text
        )
        if m is None:
            raise SystemExit(f"no registration of {op} in {path}")
        rows.append({"domain": "", "op": op, "since": int(m.group(1))})
    for domain, since, op in CPU_KERNEL.findall(reg):
        if domain != "kOnnxDomain":
            raise SystemExit(f"unexpected domain {domain} for {op}")
        rows.append({"domain": "", "op": op, "since": int(since)})
    return rows


def doc_rows(text: str) -> dict[tuple, list[str]]:
    """(domain, op, since) -> types, from the DML section of OperatorKernels.md (constraint T, else the union).
    DML registrations have a start version only: rows read "N+"."""
    return {
        (domain, op, int(ver.rstrip("+"))): data_types(constraints)
        for domain, op, ver, constraints in doc_entries(text, "DmlExecutionProvider", sequences=False)
        if re.fullmatch(r"\d+\+", ver)
    }


def schema_versions(op: str, max_opset: int) -> list[int]:
    """The since_versions of ONNX-domain `op` up to `max_opset`, from the installed onnx package ([] if unknown)."""
    import onnx.defs

    return sorted(
        {s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op and s.domain == ""}
        & set(range(1, max_opset + 1))
    )


def close_ranges(rows: list[dict], max_opset: int) -> None:
    """Set each row's `until`: one below the op's next schema version or its next registration."""
    by_op: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by_op.setdefault((row["domain"], row["op"]), []).append(row)
    for (domain, op), regs in by_op.items():
        regs.sort(key=lambda r: r["since"])
        history = schema_versions(op, max_opset) if domain == "" else []
        for i, row in enumerate(regs):
            ends = [v for v in history if v > row["since"]]
            if i + 1 < len(regs):
                ends.append(regs[i + 1]["since"])
            row["until"] = min(ends) - 1 if ends else None


def build(git_dir: str, ref: str) -> dict:
    import onnx
    import onnx.helper

    commit = git(git_dir, "rev-parse", f"{ref}^{{commit}}").strip()
    date = git(git_dir, "show", "-s", "--format=%cI", commit).strip()
    version = git(git_dir, "show", f"{commit}:VERSION_NUMBER").strip()
    vendored = re.search(r"^onnx;.*?/v([\d.]+)\.zip", git(git_dir, "show", f"{commit}:{DEPS}"), re.M)
    if vendored is None:
        raise SystemExit(f"no onnx entry in {DEPS}")
    max_opset = next(r[2] for r in onnx.helper.VERSION_TABLE if r[0] == vendored.group(1))
    reg = active(git(git_dir, "show", f"{commit}:{REGISTRATION}"))
    rows = table_rows(reg, since_versions(git(git_dir, "show", f"{commit}:{VERSIONS}")))
    docs = doc_rows(git(git_dir, "show", f"{commit}:{DOCS}"))
    for row in side_rows(git_dir, commit, reg):
        key = (row["domain"], row["op"], row["since"])
        rows.append({**row, "types": docs.get(key, []), "types_from": "docs" if key in docs else "unknown"})
    close_ranges(rows, max_opset)
    rows.sort(key=lambda r: (r["domain"], r["op"], r["since"]))
    keys = {(r["domain"], r["op"], r["since"]): r["types"] for r in rows}
    if len(keys) != len(rows):
        raise SystemExit("duplicate registrations")
    only_src = sorted(k for k in keys if k not in docs)
    only_doc = sorted(k for k in docs if k not in keys)
    differ = sorted(k for k in keys if k in docs and keys[k] != docs[k])
    print(f"{len(rows)} rows; in sources not docs: {only_src}; in docs not sources: {only_doc}; types differ: {differ}")
    kernels = [{k: r[k] for k in ("domain", "op", "since", "until", "types", "types_from") if k in r} for r in rows]
    return {
        "runtime": "dml",
        "onnxruntime": version,
        "source": {"repo": "microsoft/onnxruntime", "commit": commit, "commit_date": date, "files": list(FILES)},
        "cross_checked_with": DOCS,
        "onnx_schemas": {"onnx": onnx.__version__, "vendored_onnx": vendored.group(1), "max_opset": max_opset},
        "note": GAP.format(version=version, onnx=vendored.group(1), opset=max_opset),
        "generated_by": "tools/kernel_tables_dml.py",
        "kernels": kernels,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", required=True, help="git directory of an ONNX Runtime clone")
    ap.add_argument("--ref", required=True, help="commit or tag to read")
    ap.add_argument("--out", default=str(TABLE), help="where to write the table (default: the shipped one)")
    args = ap.parse_args()
    table = build(args.git_dir, args.ref)
    pathlib.Path(args.out).write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
