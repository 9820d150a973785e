"""Write autocast_onnx/data/kernels_cuda.json: the kernels ONNX Runtime's CUDA execution provider registers.

The table comes from the provider's registration sources, read from a git copy of the ONNX Runtime tree:
``onnxruntime/core/providers/cuda/cuda_execution_provider.cc`` (ONNX domain) and
``onnxruntime/contrib_ops/cuda/cuda_contrib_kernels.cc`` (com.microsoft and the few ONNX-domain kernels the
contrib file adds). Every ``BuildKernelCreateInfo<...>`` entry of their registration functions becomes one
(domain, op, since, until, type) registration; registrations of the same (domain, op, since, until) are merged
into one row listing their types. Kernels declared without a type in their class name
(``ONNX_OPERATOR_KERNEL_CLASS_NAME``) take their types from the kernel definition; for those the script reads
the type constraint from the repository's generated docs/OperatorKernels.md at the same commit
(``"types_from": "docs"``), and the same docs cross-check every row.

Preprocessor blocks are resolved as in a release build of onnxruntime-gpu: contrib ops and float8 types on;
training ops, ATen, NCCL collectives, Triton kernels, the minimal build and Windows-only code off. The NHWC
internal domain (com.ms.internal.nhwc) is left out: the provider adds it for its own layout rewrite only.

``--check-wheel WHEEL`` opens the provider library of an onnxruntime-gpu wheel (``pip download
onnxruntime-gpu==VERSION --no-deps -d DIR``). The release library is stripped, so the kernel class names are
not in it; the op names are (each kernel definition keeps its op name as a string). The check lists the
op-name strings of the library that name an ONNX or contrib op, writes them to
tests/data/kernels/cuda_wheel_ops.txt and reports ops of the table missing from the library and ops in the
library missing from the table.

Run by hand:
    python tools/kernel_tables.py --git-dir /path/to/onnxruntime/.git --ref <commit> [--check-wheel WHEEL]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = ROOT / "autocast_onnx" / "data" / "kernels_cuda.json"
WHEEL_LIST = ROOT / "tests" / "data" / "kernels" / "cuda_wheel_ops.txt"
FILES = (
    "onnxruntime/core/providers/cuda/cuda_execution_provider.cc",
    "onnxruntime/contrib_ops/cuda/cuda_contrib_kernels.cc",
)
DOCS = "docs/OperatorKernels.md"
LIBRARY = "onnxruntime/capi/libonnxruntime_providers_cuda.so"

DOMAINS = {"kOnnxDomain": "", "kMSDomain": "com.microsoft", "kOnnxDomainAlias": ""}
DOC_DOMAINS = {"ai.onnx": "", "com.microsoft": "com.microsoft"}
# C++ element types of the class names, by their ONNX names (TensorProto.DataType names, lower case).
TYPES = {
    "float": "float",
    "double": "double",
    "double_t": "double",
    "float_t": "float",
    "int8": "int8",
    "MLFloat16": "float16",
    "BFloat16": "bfloat16",
    "bool": "bool",
    "int8_t": "int8",
    "uint8_t": "uint8",
    "int16_t": "int16",
    "uint16_t": "uint16",
    "int32_t": "int32",
    "uint32_t": "uint32",
    "int64_t": "int64",
    "uint64_t": "uint64",
    "Float8E4M3FN": "float8e4m3fn",
    "Float8E4M3FNUZ": "float8e4m3fnuz",
    "Float8E5M2": "float8e5m2",
    "Float8E5M2FNUZ": "float8e5m2fnuz",
    "Int4x2": "int4",
    "UInt4x2": "uint4",
    "Float4E2M1x2": "float4e2m1",
    "string": "string",
}
# Macros off in a release onnxruntime-gpu build (everything else is taken as on).
OFF = {
    "USE_CUDA_MINIMAL",
    "DISABLE_CONTRIB_OPS",
    "DISABLE_FLOAT8_TYPES",
    "ENABLE_TRAINING_OPS",
    "ENABLE_TRAINING",
    "ENABLE_ATEN",
    "ORT_USE_NCCL",
    "USE_MPI",
    "USE_TRITON_KERNEL",
    "ENABLE_CUDA_NHWC_OPS",
    "_WIN32",
    "USE_ROCM",
}
# Contrib shorthand macros: name -> (domain, has_until, has_type).
CONTRIB = {
    "CUDA_MS_OP_CLASS_NAME": ("kMSDomain", False, False),
    "CUDA_MS_OP_TYPED_CLASS_NAME": ("kMSDomain", False, True),
    "CUDA_MS_OP_VERSIONED_CLASS_NAME": ("kMSDomain", True, False),
    "CUDA_MS_OP_VERSIONED_TYPED_CLASS_NAME": ("kMSDomain", True, True),
    "CUDA_ONNX_OP_TYPED_CLASS_NAME": ("kOnnxDomain", False, True),
    "CUDA_ONNX_OP_VERSIONED_TYPED_CLASS_NAME": ("kOnnxDomain", True, True),
}
ENTRY = re.compile(r"BuildKernelCreateInfo<\s*([A-Z_]+)\(([^)]*)\)\s*>")


def git_show(git_dir: str, ref: str, path: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def active_lines(text: str) -> list[str]:
    """The lines a release build compiles: simple #if/#ifdef/#ifndef/#else blocks resolved with OFF."""
    stack: list[bool] = []
    out = []
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", s)
        if not m:
            if all(stack):
                out.append(line)
            continue
        kind, cond = m.group(1), m.group(2).strip()
        if kind in ("ifdef", "ifndef", "if"):
            stack.append(condition(kind, cond))
        elif kind == "else":
            stack[-1] = not stack[-1]
        elif kind == "elif":
            stack[-1] = (not stack[-1]) and condition("if", cond)
        else:
            stack.pop()
    return out


def condition(kind: str, cond: str) -> bool:
    """Value of a preprocessor condition in a release build; unknown expressions count as true."""
    if kind == "ifdef":
        return cond not in OFF
    if kind == "ifndef":
        return cond in OFF
    m = re.fullmatch(r"(!?)\s*defined\s*\(?\s*(\w+)\s*\)?", cond)
    if m:
        on = m.group(2) not in OFF
        return not on if m.group(1) else on
    return True


def registration(macro: str, args: list[str]) -> dict | None:
    """One registration from a class-name macro and its arguments, or None for the internal/default entries."""
    if macro in CONTRIB:
        dom, has_until, has_type = CONTRIB[macro]
        since = int(args[0])
        until = int(args[1]) if has_until else None
        rest = args[2:] if has_until else args[1:]
        types = [rest[0]] if has_type else []
        op = rest[-1]
    else:
        if args[0] != "kCudaExecutionProvider":
            return None
        dom = args[1]
        since = int(args[2])
        versioned = "VERSIONED" in macro
        until = int(args[3]) if versioned else None
        rest = args[4:] if versioned else args[3:]
        op = rest[-1]
        types = rest[:-1]
    if dom not in DOMAINS:
        return None
    names = [name for t in types for name in split_types(t, f"{macro}({', '.join(args)})")]
    return {"domain": DOMAINS[dom], "op": op, "since": since, "until": until, "types": names}


def split_types(spec: str, where: str) -> list[str]:
    """ONNX names of a class-name type, which may join several C++ types with '_' (OneHot's int64_t_int64_t_float)."""
    out = []
    while spec:
        head = max((t for t in TYPES if spec == t or spec.startswith(t + "_")), key=len, default=None)
        if head is None:
            raise SystemExit(f"unknown C++ type {spec!r} in {where}")
        out.append(TYPES[head])
        spec = spec[len(head) + 1 :]
    return out


def parse(text: str) -> list[dict]:
    joined = "\n".join(active_lines(text))
    regs = []
    for m in ENTRY.finditer(joined):
        args = [a.strip() for a in m.group(2).split(",")]
        reg = registration(m.group(1), args)
        if reg is not None:
            regs.append(reg)
    return regs


KERNEL_DEF = re.compile(r"ONNX_OPERATOR_(VERSIONED_)?\w*?KERNEL_EX\(")
CONSTRAINT = re.compile(r'TypeConstraint\(\s*"(\w+)"\s*,\s*DataTypeImpl::GetTensorType<(\w+)>\(\)\s*\)')
KERNEL_DIRS = ("onnxruntime/core/providers/cuda", "onnxruntime/contrib_ops/cuda")


def call_args(text: str, start: int) -> tuple[list[str], str]:
    """The top-level comma-separated arguments of the macro call whose "(" is at `start`, and its whole text."""
    depth, k = 0, start
    while k < len(text):
        depth += {"(": 1, ")": -1}.get(text[k], 0)
        if depth == 0:
            break
        k += 1
    body = text[start + 1 : k]
    args, level, cur = [], 0, []
    for ch in body:
        if ch == "," and level == 0:
            args.append("".join(cur).strip())
            cur = []
            continue
        level += {"(": 1, "<": 1, ")": -1, ">": -1}.get(ch, 0)
        cur.append(ch)
    args.append("".join(cur).strip())
    return args, body


def kernel_ties(text: str) -> list[tuple[str, str | None, int | None, int | None, list[list[str]]]]:
    """(op, domain or None, since or None, until or None, tied groups) of each kernel definition in `text`
    (a kernel .cc file) whose builder binds several type constraints to one template type: BatchNormalization's
    ``.TypeConstraint("T", GetTensorType<T>()).TypeConstraint("T1", GetTensorType<T>())`` means the kernel
    exists only where T1 is the data's type. None where a macro parameter stands for the value."""
    text = re.sub(r"\\\s*\n", " ", "\n".join(active_lines(text)))
    out = []
    for m in KERNEL_DEF.finditer(text):
        args, body = call_args(text, m.end() - 1)
        by_var: dict[str, list[str]] = {}
        for name, var in CONSTRAINT.findall(body):
            if var not in TYPES:  # a template parameter, not a concrete C++ type
                by_var.setdefault(var, []).append(name)
        groups = [sorted(set(names)) for names in by_var.values() if len(set(names)) > 1]
        if not groups or len(args) < 3:
            continue
        number = lambda a: int(a) if a.isdigit() else None  # noqa: E731
        until = number(args[3]) if m.group(1) else None
        out.append((args[0], DOMAINS.get(args[1]), number(args[2]), until, groups))
    return out


def tie_rows(kernels: list[dict], ties: list) -> None:
    """Mark each row of `kernels` that a tied kernel definition covers with its groups ("tied")."""
    for op, domain, since, until, groups in ties:
        for row in kernels:
            if row["op"] != op or (domain is not None and row["domain"] != domain):
                continue
            if since is not None and (row["since"] != since or (until is not None and row["until"] != until)):
                continue
            for group in groups:
                if group not in row.setdefault("tied", []):
                    row["tied"].append(group)


def doc_entries(text: str, provider: str, sequences: bool = True):
    """(domain, op, version cell, {constraint: types}) of each kernel row of `provider`'s section of the
    generated docs/OperatorKernels.md ("CUDAExecutionProvider", "DmlExecutionProvider"): the ONNX and contrib
    domains only; a row without an op name continues the op above it. `sequences` False leaves out the element
    types of seq(tensor(...)) constraints."""
    tensor = re.compile(r"tensor\((\w+)\)" if sequences else r"(?<!seq\()tensor\((\w+)\)")
    section = text.split(f"## Operators implemented by {provider}", 1)[1].split("\n## ", 1)[0]
    domain, op = None, None
    for line in section.splitlines():
        m = re.match(r"\|\*\*Operator Domain:\*\* \*([\w.]+)\*", line)
        if m:
            domain = DOC_DOMAINS.get(m.group(1))
            continue
        cells = line.split("|")
        if domain is None or len(cells) < 5 or not re.match(r"\[?\d", cells[3].strip()):
            continue
        op = cells[1].strip() or op
        constraints = {
            c.group(1): set(tensor.findall(c.group(2))) for c in re.finditer(r"\*\*(\w+)\*\* = ([^*]*)", cells[4])
        }
        yield domain, op, cells[3].strip(), constraints


def data_types(constraints: dict[str, set[str]]) -> list[str]:
    """The types of the constraint named T where there is one (the data type of most ops), else the union."""
    return sorted(constraints.get("T") or set().union(*constraints.values()))


def doc_rows(text: str) -> dict[tuple, list[str]]:
    """(domain, op, since, until) -> types, from the CUDA section of OperatorKernels.md (data_types)."""
    rows: dict[tuple, list[str]] = {}
    for domain, op, ver, constraints in doc_entries(text, "CUDAExecutionProvider"):
        vm = re.fullmatch(r"\[(\d+), (\d+)\]", ver)
        if vm:
            since, until = int(vm.group(1)), int(vm.group(2))
        else:  # "13+" is open-ended; a bare "13" is a kernel for that one opset
            since, until = int(ver.rstrip("+")), (None if ver.endswith("+") else int(ver))
        rows[(domain, op, since, until)] = data_types(constraints)
    return rows


def build(git_dir: str, ref: str) -> dict:
    commit = subprocess.run(
        ["git", "--git-dir", git_dir, "rev-parse", f"{ref}^{{commit}}"], check=True, capture_output=True, text=True
    ).stdout.strip()
    date = subprocess.run(
        ["git", "--git-dir", git_dir, "show", "-s", "--format=%cI", commit], check=True, capture_output=True, text=True
    ).stdout.strip()
    version = git_show(git_dir, commit, "VERSION_NUMBER").strip()
    merged: dict[tuple, dict] = {}
    for path in FILES:
        for reg in parse(git_show(git_dir, commit, path)):
            key = (reg["domain"], reg["op"], reg["since"], reg["until"])
            row = merged.setdefault(key, {**reg, "types": set()})
            row["types"].update(reg["types"])
    docs = doc_rows(git_show(git_dir, commit, DOCS))
    kernels = []
    for key in sorted(merged, key=lambda k: (k[0], k[1], k[2])):
        row = merged[key]
        entry = {"domain": row["domain"], "op": row["op"], "since": row["since"], "until": row["until"]}
        if row["types"]:
            entry["types"] = sorted(row["types"])
        else:
            entry["types"] = docs.get(key, [])
            entry["types_from"] = "docs" if key in docs else "unknown"
        kernels.append(entry)
    listing = subprocess.run(
        ["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", commit, *KERNEL_DIRS],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for path in (p for p in listing if p.endswith(".cc")):
        tie_rows(kernels, kernel_ties(git_show(git_dir, commit, path)))
    only_src = sorted(k for k in merged if k not in docs)
    only_doc = sorted(k for k in docs if k not in merged)
    print(f"{len(kernels)} rows; in sources not docs: {only_src}; in docs not sources: {only_doc}")
    return {
        "runtime": "cuda",
        "onnxruntime": version,
        "source": {
            "repo": "microsoft/onnxruntime",
            "commit": commit,
            "commit_date": date,
            "files": list(FILES),
            "tied_from": [f"{d}/**/*.cc" for d in KERNEL_DIRS],
        },
        "cross_checked_with": DOCS,
        "generated_by": "tools/kernel_tables.py",
        "kernels": kernels,
    }


def wheel_ops(wheel: str, known: set[str]) -> list[str]:
    """Op names of `known` that the wheel's provider library holds as strings.

    The linker merges a string into the tail of a longer one ("Add" lives in "BiasAdd"), so a name counts when
    it ends a string (a NUL right after it). A name can therefore also be found as the tail of another op name
    (Mean in ReduceMean): the check reads absences from the table as real, extras as candidates only.
    """
    with zipfile.ZipFile(wheel) as zf:
        data = zf.read(LIBRARY)
    ends = {m.group(1) for m in re.finditer(rb"([A-Za-z0-9_]{2,80})\x00", data)}
    tails = {e[i:] for e in ends for i in range(len(e))}
    return sorted(n for n in known if n.encode() in tails)


def check_wheel(wheel: str, table: dict) -> None:
    import onnx.defs

    with zipfile.ZipFile(wheel) as zf:
        version = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")).split("-")[1].split(".dist")[0]
    ops = {k["op"] for k in table["kernels"]}
    known = {s.name for s in onnx.defs.get_all_schemas_with_history()} | ops
    found = wheel_ops(wheel, known)
    # A name tail-merged into a longer string (Add in BiasAdd) is still there: search with its NUL only.
    missing = sorted(ops - set(found))
    extra = sorted(set(found) - ops)
    WHEEL_LIST.parent.mkdir(parents=True, exist_ok=True)
    header = f"# onnxruntime-gpu {version}: {LIBRARY} op-name strings (ONNX schema names and table ops)\n"
    WHEEL_LIST.write_text(header + "".join(f"{n}\n" for n in found))
    print(
        f"wheel {version}: {len(found)} op names; table ops not in library: {missing}; "
        f"library ops not in table: {extra}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--git-dir", required=True, help="git directory of an ONNX Runtime clone")
    ap.add_argument("--ref", required=True, help="commit or tag to read")
    ap.add_argument("--check-wheel", help="an onnxruntime-gpu wheel to check the table against")
    args = ap.parse_args()
    table = build(args.git_dir, args.ref)
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    if args.check_wheel:
        check_wheel(args.check_wheel, table)
    return None


if __name__ == "__main__":
    sys.exit(main())
