"""Scaffold a new lint check: catalog entry, implementation stub, tests and docs in one step.

    python tools/add_check.py --code AC405 --name some-kebab-name --severity warning \\
        --summary "One line" [--kind KIND] [--root PATH]

It checks the arguments first and changes nothing when one is wrong (one line on stderr, exit 2):
  - the code looks like AC123, is not in rules/lint.toml and was never used before (a code that
    the git history of rules/lint.toml shows but the file no longer has is retired: codes are
    never reused);
  - the name is kebab-case and no other check has it; the severity is one the catalog accepts;
  - --kind (default: the name) is either an existing kind of autocast_onnx/lint/checks.py, reused
    as it is, or a new kebab-case kind that gets a stub.

Then it
  1. inserts a [[check]] entry into rules/lint.toml in code order, with TODO text for why, fix and
     example (a trailing period of the summary is dropped: docs/rules.md adds its own);
  2. for a new kind, adds a stub to autocast_onnx/lint/checks.py (a generator that yields nothing,
     with a TODO docstring) and registers it in KINDS;
  3. appends a section to tests/lint/test_lint_checks.py: a bad-case test that FAILS until the check
     is implemented and finds the problem in the bad model, and a good-case test;
  4. regenerates docs/rules.md with `python -m autocast_onnx rules --format markdown`, run on the
     package under --root (the files it wrote are restored if that fails).

--root (default: the repository holding this script) makes it work on a copy of the repository.
Run it with the project's Python (.venv/bin/python), which has the package's dependencies.
"""

from __future__ import annotations

import argparse
import ast
import json
import keyword
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LINT_TOML = Path("rules/lint.toml")
CHECKS_PY = Path("autocast_onnx/lint/checks.py")
DIAGNOSTICS_PY = Path("autocast_onnx/diagnostics.py")
TESTS_PY = Path("tests/lint/test_lint_checks.py")
RULES_MD = Path("docs/rules.md")

CODE = re.compile(r"^AC\d{3}$")
KEBAB = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
HISTORY_CODE = re.compile(r'^[+-]\s*code\s*=\s*"(AC\d{3})"', re.MULTILINE)


class UsageError(Exception):
    """Bad arguments or a repository the scaffold cannot edit: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of argparse's usage + message
        raise UsageError(f"{message} (see --help)")


def parse_args(argv):
    parser = Parser(prog="add_check.py", description="Scaffold a new lint check (see the module docstring).")
    parser.add_argument("--code", required=True, help="new, never used code, e.g. AC405")
    parser.add_argument("--name", required=True, help="kebab-case name, e.g. some-kebab-name")
    parser.add_argument("--severity", required=True, help="error, warning or info")
    parser.add_argument("--summary", required=True, help="one line (docs/rules.md and `autocast-onnx rules`)")
    parser.add_argument("--kind", help="implementation: an existing kind to reuse, or a new one (default: the name)")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="repository to edit (default: the one holding this script)",
    )
    return parser.parse_args(argv)


# ---- reading the repository -----------------------------------------------------------------
def read(root: Path, rel: Path) -> str:
    path = root / rel
    if not path.is_file():
        raise UsageError(f"{path} not found (--root must be an autocast-onnx checkout)")
    return path.read_text(encoding="utf-8")


def severities(root: Path) -> tuple[str, ...]:
    """SEVERITIES of autocast_onnx/diagnostics.py, read without importing the package."""
    tree = ast.parse(read(root, DIAGNOSTICS_PY))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SEVERITIES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise UsageError(f"{root / DIAGNOSTICS_PY}: no SEVERITIES tuple found")


def kinds_dict(tree: ast.Module, where: Path) -> ast.Dict:
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id == "KINDS" for t in node.targets)
        ):
            return node.value
    raise UsageError(f"{where}: no `KINDS = {{...}}` dict found")


def known_kinds(tree: ast.Module, where: Path) -> dict[str, str]:
    """kind -> function name, from the KINDS dict literal."""
    out = {}
    kinds = kinds_dict(tree, where)
    for key, value in zip(kinds.keys, kinds.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            out[key.value] = value.id if isinstance(value, ast.Name) else ast.unparse(value)
    return out


def top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def git_history(root: Path) -> str:
    """`git log -p` of rules/lint.toml when --root is the top of a git work tree, else ""."""
    try:
        top = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if top.returncode or Path(top.stdout.strip()).resolve() != root.resolve():
            return ""
        log = subprocess.run(
            ["git", "-C", str(root), "log", "--format=", "-p", "--", str(LINT_TOML)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return log.stdout if log.returncode == 0 else ""


def retired_codes(history: str, current: set[str]) -> set[str]:
    """Codes that rules/lint.toml once had and no longer has."""
    return set(HISTORY_CODE.findall(history)) - current


# ---- validation ---------------------------------------------------------------------------
def validate(args, root: Path) -> dict:
    text = read(root, LINT_TOML)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{root / LINT_TOML} is not valid TOML ({exc}); fix it first") from None
    entries = data.get("check", [])
    codes = {e.get("code") for e in entries}
    names = {e.get("name"): e.get("code") for e in entries}

    code = args.code.strip()
    if not CODE.match(code):
        raise UsageError(
            f"--code {args.code!r} is not of the form AC123 (AC1xx ops, AC2xx constants, "
            "AC3xx graph and types, AC4xx performance, AC9xx the linter itself)"
        )
    if code in codes:
        raise UsageError(f"--code {code} is already used in {LINT_TOML} (codes are unique: pick an unused one)")
    if code in retired_codes(git_history(root), codes):
        raise UsageError(
            f"--code {code} was used before and is retired (the git history of {LINT_TOML} has it; "
            "codes are never reused: pick a new one)"
        )
    name = args.name.strip()
    if not KEBAB.match(name):
        raise UsageError(
            f"--name {args.name!r} is not kebab-case (lowercase words joined by '-', e.g. softmax-in-low-precision)"
        )
    if name in names:
        raise UsageError(f"--name {name} is already the name of {names[name]} (names are unique: pick another)")
    allowed = severities(root)
    if args.severity not in allowed:
        raise UsageError(f"--severity {args.severity!r} is not one of {', '.join(allowed)}")
    summary = " ".join(args.summary.split()).rstrip(".").rstrip()
    if not summary or "\n" in args.summary.strip():
        raise UsageError("--summary must be one non-empty line")

    checks_src = read(root, CHECKS_PY)
    tree = ast.parse(checks_src)
    kinds = known_kinds(tree, root / CHECKS_PY)
    kind = (args.kind or name).strip()
    if not KEBAB.match(kind):
        raise UsageError(f"--kind {kind!r} is not kebab-case (existing kinds: {', '.join(sorted(kinds))})")
    new_kind = kind not in kinds
    if not new_kind and args.kind is None:
        raise UsageError(
            f"kind {kind!r} already exists: pass --kind {kind} to reuse it, or --kind NEW-KIND for a new implementation"
        )
    func = kind.replace("-", "_")
    if new_kind and (keyword.iskeyword(func) or func in top_level_names(tree)):
        raise UsageError(f"{CHECKS_PY} already defines {func!r}: choose another --kind")
    tests = read(root, TESTS_PY)
    if re.search(rf"^def test_{code.lower()}_", tests, re.MULTILINE):
        raise UsageError(f"{TESTS_PY} already has tests named test_{code.lower()}_*: remove them first")
    read(root, RULES_MD)
    params = sorted(
        {
            k
            for e in entries
            if e.get("kind") == kind
            for k in e
            if k not in ("code", "name", "severity", "kind", "summary", "why", "fix", "example")
        }
    )
    return {
        "code": code,
        "name": name,
        "severity": args.severity,
        "summary": summary,
        "kind": kind,
        "new_kind": new_kind,
        "func": func,
        "params": params,
        "lint_text": text,
        "entries": entries,
        "checks_src": checks_src,
        "tree": tree,
        "tests": tests,
    }


# ---- edits (pure functions: old text -> new text) -----------------------------------------------
def toml_str(value: str) -> str:
    """A TOML basic string (JSON's escapes are valid TOML once non-ASCII is kept as is)."""
    return json.dumps(value, ensure_ascii=False)


def catalog_entry(spec: dict) -> str:
    lines = [
        "[[check]]",
        f"code = {toml_str(spec['code'])}",
        f"name = {toml_str(spec['name'])}",
        f"severity = {toml_str(spec['severity'])}",
        f"kind = {toml_str(spec['kind'])}",
    ]
    if spec["params"]:
        lines.append(
            f"# TODO: the parameters of kind {spec['kind']!r} ({', '.join(spec['params'])}); "
            "see the other checks of this kind"
        )
    lines += [
        f"summary = {toml_str(spec['summary'])}",
        'why = """TODO: why is this a problem? What goes wrong in fp16/bf16 (overflow, flush to zero, lost',
        'precision, slower kernels), and what PyTorch autocast, TensorFlow or ONNX Runtime do about it."""',
        'fix = "TODO: what to do about it (and whether autocast-onnx convert does it by default)."',
        'example = "TODO: the smallest graph that shows it, e.g. x (fp16) -> Op (fp16) -> y"',
    ]
    return "\n".join(lines) + "\n"


def insert_entry(text: str, spec: dict) -> tuple[str, int]:
    """rules/lint.toml with the entry inserted before the first check with a higher code (else at
    the end), and the 1-based line of its [[check]] header."""
    entry = catalog_entry(spec)
    lines = text.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.strip() == "[[check]]"]
    later = [i for i, e in zip(headers, spec["entries"]) if str(e.get("code", "")) > spec["code"]]
    if later:
        at = later[0]
        while at > 0 and lines[at - 1].lstrip().startswith("#"):  # keep a comment with its entry
            at -= 1
        new = lines[:at] + [entry, "\n"] + lines[at:]
        return "".join(new), at + 1
    body = text if text.endswith("\n") else text + "\n"
    return body + "\n" + entry, body.count("\n") + 2


def stub_function(spec: dict) -> str:
    summary = spec["summary"].replace("\\", "\\\\").replace('"', '\\"')
    return f'''def {spec["func"]}(ctx: LintContext, check):
    """TODO({spec["code"]} {spec["name"]}): {summary}.

    Scaffolded by tools/add_check.py: it finds nothing yet, so test_{spec["code"].lower()}_bad in
    tests/lint/test_lint_checks.py fails. Yield ctx.diag(check, node, message, value=..., tensor=...) for
    each node at fault (see op_family and masking_constant above); read parameters from check.params."""
    yield from ()
'''


def add_stub(src: str, spec: dict) -> str:
    """checks.py with the stub defined before KINDS and registered as its last entry."""
    kinds = kinds_dict(spec["tree"], CHECKS_PY)
    assign = next(n for n in spec["tree"].body if isinstance(n, ast.Assign) and n.value is kinds)
    lines = src.splitlines(keepends=True)
    assert kinds.end_lineno is not None
    close = kinds.end_lineno - 1  # 0-based line of the closing brace
    if lines[close].strip() != "}":
        raise UsageError(f"{CHECKS_PY}: expected KINDS to end with a '}}' line; register {spec['func']} by hand")
    last = close - 1
    while last > assign.lineno - 1 and not lines[last].strip():
        last -= 1
    if not lines[last].rstrip().endswith(("{", ",")):
        lines[last] = lines[last].rstrip("\n").rstrip() + ",\n"
    lines.insert(close, f'    "{spec["kind"]}": {spec["func"]},\n')
    start = assign.lineno - 1
    lines.insert(start, stub_function(spec) + "\n\n")
    return "".join(lines)


def test_section(spec: dict) -> str:
    code, low = spec["code"], spec["code"].lower()
    where = (
        f"implement kind {spec['kind']!r} ({spec['func']} in autocast_onnx/lint/checks.py)"
        if spec["new_kind"]
        else f"set the parameters of kind {spec['kind']!r} in rules/lint.toml"
    )
    title = f"# ---- {code}: {spec['name']} "
    intro = textwrap.fill(
        f"Scaffolded by tools/add_check.py. TODO({code}): make _{low}_model(bad=True) the "
        f"smallest graph that shows the problem and _{low}_model(bad=False) the same graph "
        f"fixed, then {where} until test_{low}_bad passes with the real node, op type and "
        "message words.",
        width=100,
        initial_indent="# ",
        subsequent_indent="# ",
        break_on_hyphens=False,
    )
    failure = textwrap.wrap(
        f"TODO({code}): scaffold, not implemented yet: {where} so that it flags the bad model",
        width=80,
        break_on_hyphens=False,
        drop_whitespace=False,
    )
    failure_lines = f"\n{' ' * 29}".join(toml_str(part) for part in failure)
    return f'''

{title}{"-" * max(4, 96 - len(title))}
{intro}
def _{low}_model(bad):
    """TODO({code}): placeholder graph. bad=True: x (fp16) -> Identity (fp16) -> Cast -> y;
    bad=False: x (fp16) -> Cast -> Identity (fp32) -> y."""
    return L.wrap_op("Identity", low=bad, name="n/op")


def test_{low}_bad():
    diags = L.findings(_{low}_model(bad=True), "{code}")
    assert len(diags) == 1, ({failure_lines})
    # TODO({code}): the real node, op type and words of the message (the placeholders always fail).
    L.assert_diag(diags[0], "{code}", node="n/op", op_type="TODO", words=("TODO",))


def test_{low}_good():
    result = L.run_check(_{low}_model(bad=False), "{code}")
    assert result.mode == "actual"
    assert "{code}" not in L.codes(result)
'''


def regenerate_docs(root: Path) -> bytes:
    """`autocast-onnx rules --format markdown`, run on the package under `root`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run(
        [sys.executable, "-m", "autocast_onnx", "rules", "--format", "markdown"],
        cwd=root,
        env=env,
        check=False,
        capture_output=True,
        timeout=300,
    )
    if proc.returncode:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(err[-1] if err else f"exit code {proc.returncode}")
    return proc.stdout


# ---- main -----------------------------------------------------------------------------------
def scaffold(args) -> list[str]:
    root = args.root.resolve()
    spec = validate(args, root)
    originals = {rel: (root / rel).read_bytes() for rel in (LINT_TOML, CHECKS_PY, TESTS_PY, RULES_MD)}
    changes = []
    try:
        lint_text, line = insert_entry(spec["lint_text"], spec)
        added = [e for e in tomllib.loads(lint_text)["check"] if e.get("code") == spec["code"]]
        assert len(added) == 1 and added[0]["name"] == spec["name"], "the generated entry does not parse back"
        (root / LINT_TOML).write_text(lint_text, encoding="utf-8")
        changes.append(
            f"{LINT_TOML}:{line}: added {spec['code']} {spec['name']} ({spec['severity']}, "
            f"kind {spec['kind']}) with TODO why/fix/example"
        )
        if spec["new_kind"]:
            src = add_stub(spec["checks_src"], spec)
            ast.parse(src)
            (root / CHECKS_PY).write_text(src, encoding="utf-8")
            changes.append(
                f"{CHECKS_PY}: added stub {spec['func']}() (yields nothing) and registered KINDS[{spec['kind']!r}]"
            )
        else:
            changes.append(
                f"{CHECKS_PY}: unchanged (reuses kind {spec['kind']!r}, "
                f"{known_kinds(spec['tree'], CHECKS_PY)[spec['kind']]})"
            )
        tests = spec["tests"].rstrip("\n") + "\n" + test_section(spec)
        (root / TESTS_PY).write_text(tests, encoding="utf-8")
        low = spec["code"].lower()
        changes.append(
            f"{TESTS_PY}: appended test_{low}_bad (fails until the check is implemented) and test_{low}_good"
        )
        (root / RULES_MD).write_bytes(regenerate_docs(root))
        changes.append(f"{RULES_MD}: regenerated (autocast-onnx rules --format markdown)")
    except BaseException:
        for rel, data in originals.items():
            (root / rel).write_bytes(data)
        raise
    return changes


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        changes = scaffold(args)
    except UsageError as exc:
        print(f"add_check.py: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        hint = (
            "run this script with the project's .venv/bin/python"
            if "No module named" in str(exc)
            else "fix `autocast-onnx rules --format markdown` first"
        )
        print(
            f"add_check.py: error: regenerating docs/rules.md failed, nothing was changed: {exc} ({hint})",
            file=sys.stderr,
        )
        return 3
    for line in changes:
        print(line)
    code = args.code.strip().lower()
    print(
        f"next: implement the check, fill in the TODOs (grep -rn 'TODO({args.code.strip()}' and the catalog "
        f"entry), run `.venv/bin/python -m pytest -q tests/lint/test_lint_checks.py -k {code} "
        "tests/contracts/test_rules_doc.py` and regenerate docs/rules.md once why/fix/example are written"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
