"""The steps of the GitHub Action (action.yml at the repository root), as a script a test can run.

    python tools/action_run.py install           # pip install the package the action names
    python tools/action_run.py run [--defer-exit]

Both read the action's inputs from INPUT_* environment variables, which action.yml sets from its
`with:` values (INPUT_MODELS, INPUT_COMMAND, INPUT_PRECISION, INPUT_CONFIG, INPUT_FAIL_ON,
INPUT_SARIF, INPUT_REPORT_JSON, INPUT_SPEED, INPUT_ARGS, INPUT_PACKAGE); examples/ci/README.md
documents them.

`run` runs `autocast-onnx check` on each model (or one `autocast-onnx lint` over all of them) and
writes one SARIF file (one run: code scanning takes one run per tool and category) and one JSON
report. Its exit code is the gate's verdict: the worst of the commands' (0 pass, 1 findings or a
failed threshold, 2 bad input). With --defer-exit it exits 0 once the verdict is written to
$GITHUB_OUTPUT (`exit-code`), so that the action uploads the SARIF before a later step fails the
job on that code. Only the standard library is imported before the package is installed."""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

COMMANDS = ("check", "lint")
GLOB_CHARS = set("*?[")
# the exit codes autocast-onnx gives; any other (a negative one: killed by a signal) is a check
# that did not end normally, and fails the gate as an unexpected failure
EXIT_CODES = (0, 1, 2, 3)
EXIT_INTERNAL = 3


class InputError(Exception):
    """A bad action input: `input` names it, the message says what is wrong and what to do."""

    def __init__(self, name: str, what: str, hint: str):
        super().__init__(f"autocast-onnx: error: {name}: {what} ({hint})")


def env(name: str, default: str = "") -> str:
    """An action input as the runner passes it: INPUT_ and the name in upper case, '-' as '_'."""
    return os.environ.get("INPUT_" + name.upper().replace("-", "_"), default).strip()


def printable(text: str) -> str:
    """`text` with each character that is not printable written as its Python escape (as
    autocast-onnx's own messages are): a model's file name holding a newline, `::` commands or a
    terminal escape reaches the job's log as visible text, never as a line of its own."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def annotation(kind: str, message: str) -> None:
    """A workflow annotation (`::warning::...`) of the action's own, its message escaped as the
    runner reads it (%, CR and LF as %25, %0D, %0A), so that text from a path stays one message."""
    data = printable(message).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    print(f"::{kind}::{data}", file=sys.stderr, flush=True)


def flag(name: str, default: bool) -> bool:
    value = env(name, "true" if default else "false").lower()
    if value not in ("true", "false"):
        raise InputError(name, f"{value!r} is not true or false", "write true or false")
    return value == "true"


# ---- install --------------------------------------------------------------------------------------


def pip_command() -> list[str]:
    """pip install of the `package` input (a pip requirement, or several separated by spaces),
    by default the action's own checkout with the CPU runtime that validation needs."""
    spec = env("package")
    if spec:
        return [sys.executable, "-m", "pip", "install", *shlex.split(spec)]
    action_path = os.environ.get("GITHUB_ACTION_PATH") or str(Path(__file__).resolve().parent.parent)
    return [sys.executable, "-m", "pip", "install", f"{action_path}[cpu]"]


# ---- models ---------------------------------------------------------------------------------------


def expand_models(text: str, command: str) -> list[str]:
    """The `models` input: paths or globs separated by spaces or newlines (quote a path with
    spaces), globs expanded (** included) in sorted order without following a link to a folder
    (a loop would repeat the models, or never end). `lint` reads folders itself; for `check`,
    which takes one model per run, a folder stands for its .onnx files (the links to folders under
    it not followed, as lint's own walk does). A model reached twice (through a link, or two
    patterns) is checked once, with a warning."""
    try:
        patterns = shlex.split(text)
    except ValueError as e:
        raise InputError("models", f"cannot split {text!r}: {e}", "close the quote") from None
    if not patterns:
        raise InputError("models", "no model named", "name a model file, a folder or a glob such as models/**/*.onnx")
    models: list[str] = []
    for pattern in patterns:
        if GLOB_CHARS & set(pattern):
            found = sorted(expand_glob(pattern))
            if not found:
                raise InputError("models", f"{pattern!r} matches no file", "check the pattern against the checkout")
            models += found
        else:
            models.append(pattern)
    if command == "check":
        models = [str(f) for m in models for f in (sorted(Path(m).rglob("*.onnx")) if Path(m).is_dir() else [m])]
    return once_each(models)


def expand_glob(pattern: str) -> list[str]:
    """glob.glob(pattern, recursive=True), except that `**` does not descend into a link to a
    folder: glob follows them, so one link back up repeats every model below it dozens of times
    and two never end. Hidden folders are skipped, as glob skips them."""
    parts = pattern.split("/")
    if "**" not in parts:
        return glob.glob(pattern)  # each component matched once: a link is followed at most once
    k = parts.index("**")
    head, rest = "/".join(parts[:k]), "/".join(parts[k + 1 :])
    bases = glob.glob(head) if GLOB_CHARS & set(head) else [head]
    found: list[str] = []
    for base in bases if head else [""]:
        if head and not os.path.isdir(base):
            continue
        for folder, dirs, files in os.walk(base or ".", followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            shown = os.path.relpath(folder, ".") if not base else folder
            prefix = "" if shown == "." and not base else shown.rstrip("/") + "/"
            if rest:
                found += expand_glob(glob.escape(prefix) + rest)
            elif parts[k + 1 :] == [""]:  # `**/`: the folders, each with its slash
                found += [prefix] if base or folder != "." else []
            else:  # a last `**` matches the folder itself too, as glob's does
                found += [prefix] if base and folder == base else []
                found += [prefix + name for name in sorted(dirs + files) if not name.startswith(".")]
    return found


def once_each(models: list[str]) -> list[str]:
    """`models` in order, each file once: a later name of a file already listed (the same path,
    or another path to it through a link) is dropped with a warning naming both."""
    seen: dict[str, str] = {}
    kept = []
    for model in models:
        key = os.path.realpath(model)
        if key in seen:
            if seen[key] != model:
                annotation("warning", f"models: {model} is {seen[key]} (through a link); checked once")
            continue
        seen[key] = model
        kept.append(model)
    return kept


# ---- run ------------------------------------------------------------------------------------------


def common_args(command: str) -> list[str]:
    """The options every command gets from the inputs, then `args` (split as a shell would)."""
    out = []
    for option, value in (
        ("--precision", env("precision")),
        ("--config", env("config")),
        ("--fail-on", env("fail-on")),
    ):
        if value:
            out += [option, value]
    try:
        extra = shlex.split(env("args"))
    except ValueError as e:
        raise InputError("args", f"cannot split {env('args')!r}: {e}", "close the quote") from None
    speed = flag("speed", False)
    if command == "check" and not speed and "--no-validate" not in extra:
        out.append("--no-speed")  # CPU timings of fp16 say nothing about a GPU
    elif command == "lint" and speed:
        annotation("warning", "speed: lint measures nothing; the input applies to check only")
    elif speed and "--no-validate" in extra:
        raise InputError("speed", "true, but args has --no-validate: nothing is timed", "drop one of them")
    return out + extra


def docs_url() -> str | None:
    """The URL of docs/ at the action's revision, for the SARIF rules' helpUri: the action's
    repository and ref, or, when the workflow runs the action from its own checkout (uses: ./),
    the workflow's repository at the commit being checked. None outside Actions."""
    server = os.environ.get("GITHUB_SERVER_URL")
    repository, ref = os.environ.get("AUTOCAST_ONNX_ACTION_REPOSITORY"), os.environ.get("AUTOCAST_ONNX_ACTION_REF")
    if server and repository and ref:
        return f"{server}/{repository}/blob/{ref}/docs/"
    workspace, action_path = os.environ.get("GITHUB_WORKSPACE"), os.environ.get("GITHUB_ACTION_PATH")
    if server and workspace and action_path and Path(action_path).resolve() == Path(workspace).resolve():
        return f"{server}/{os.environ['GITHUB_REPOSITORY']}/blob/{os.environ['GITHUB_SHA']}/docs/"
    return None


def autocast(args: list[str]) -> int:
    """One autocast-onnx command with this Python; its output goes to the job's log. In Actions,
    the runner's workflow commands are stopped while it runs (`::stop-commands::` with a token no
    one can guess), so that nothing a model holds and the command prints can be taken for an
    annotation or an output; the command line echoed is escaped."""
    token = secrets.token_hex(16) if os.environ.get("GITHUB_ACTIONS") == "true" else None
    if token:
        print(f"::stop-commands::{token}", flush=True)
    try:
        print(printable("autocast-onnx " + shlex.join(args)), flush=True)
        return subprocess.run([sys.executable, "-m", "autocast_onnx", *args], check=False).returncode
    finally:
        if token:
            print(f"::{token}::", flush=True)


def gate_code(code: int) -> int:
    """A command's exit code as the gate's: 0, 1, 2 and 3 as autocast-onnx gives them; any other
    (killed by a signal, a crash of the interpreter) is a check that did not end normally: 3."""
    return code if code in EXIT_CODES else EXIT_INTERNAL


def how_it_ended(code: int) -> str:
    """Words for an exit code that autocast-onnx does not give."""
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}, which autocast-onnx does not give"


def run_lint(models: list[str], common: list[str], sarif: Path, report: Path) -> int:
    """One lint over all the models: the JSON report, and the SARIF made from its findings."""
    code = autocast(["lint", *models, "--format", "json", "-o", str(report), *common])
    if code not in EXIT_CODES:
        annotation("error", f"autocast-onnx lint did not end normally: {how_it_ended(code)}")
        report.unlink(missing_ok=True)  # a report a killed run may have left is not its verdict
        return EXIT_INTERNAL
    if report.is_file():
        from autocast_onnx.diagnostics import Diagnostic
        from autocast_onnx.lint.report import sarif_json

        findings = [Diagnostic(**d) for d in json.loads(report.read_text(encoding="utf-8"))["diagnostics"]]
        sarif.write_text(sarif_json(findings) + "\n", encoding="utf-8")
    return code


def merge_sarif(parts: list[dict]) -> dict:
    """One SARIF run from the runs of several checks: the results in order, the artifacts listed
    once, locations relative to the first %SRCROOT% a run gives (a run with another root keeps
    its locations as absolute file URIs)."""
    bases: dict[str, dict] = {}
    artifacts: list[dict] = []
    results = []
    for part in parts:
        own = part["runs"][0]
        for result in own["results"]:
            location = result["locations"][0]["physicalLocation"]["artifactLocation"]
            if "uriBaseId" in location:
                base = own["originalUriBaseIds"][location["uriBaseId"]]
                if bases.setdefault(location["uriBaseId"], base) != base:
                    del location["uriBaseId"]
                    location["uri"] = base["uri"] + location["uri"]
            key = {k: location[k] for k in ("uri", "uriBaseId") if k in location}
            if key not in artifacts:
                artifacts.append(key)
            location["index"] = artifacts.index(key)
            results.append(result)
    run = {"tool": parts[0]["runs"][0]["tool"]} | ({"originalUriBaseIds": bases} if bases else {})
    run |= {"artifacts": [{"location": a} for a in artifacts], "results": results}
    return {**parts[0], "runs": [run]}


def run_check(models: list[str], common: list[str], sarif: Path, report: Path) -> int:
    """`check` on each model (it takes one), one after the other; the SARIF files merged into one
    run and the reports gathered in one JSON file (each model's check report, or null when the
    check stopped before writing one)."""
    codes, parts, reports = [], [], []
    with tempfile.TemporaryDirectory(prefix="autocast-onnx-action-") as tmp:
        for k, model in enumerate(models):
            part_sarif, part_json = Path(tmp) / f"{k}.sarif", Path(tmp) / f"{k}.json"
            code = autocast(["check", model, "--sarif", str(part_sarif), "--report-json", str(part_json), *common])
            codes.append(gate_code(code))
            entry: dict = {"model": model, "exit_code": code, "report": None}
            if code not in EXIT_CODES:
                entry["ended"] = how_it_ended(code)
                annotation("error", f"autocast-onnx check of {model} did not end normally: {entry['ended']}")
            else:  # a killed check's files, if any, are not its verdict
                if part_sarif.is_file():
                    parts.append(json.loads(part_sarif.read_text(encoding="utf-8")))
                if part_json.is_file():
                    entry["report"] = json.loads(part_json.read_text(encoding="utf-8"))
            reports.append(entry)
    if parts:
        sarif.write_text(json.dumps(merge_sarif(parts), indent=1) + "\n", encoding="utf-8")
    summary = {"command": "check", "exit_code": max(codes), "models": reports}
    report.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return max(codes)


def write_outputs(**values: str) -> None:
    """Step outputs for the later steps of the action ($GITHUB_OUTPUT; nothing outside Actions),
    each in the runner's multiline form (`key<<DELIMITER`, the value, `DELIMITER`) with a fresh
    random delimiter: a value holding a newline (a path from the inputs) stays one value, and
    cannot add an output line (`exit-code=0`) of its own."""
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        return
    text = ""
    for key, value in values.items():
        delimiter = f"autocast_onnx_{secrets.token_hex(16)}"
        if delimiter in value or "\r" in value:  # run() refuses a CR in the paths before any work
            raise InputError(key, f"{value!r} cannot be written as a step output", "name a file without one")
        text += f"{key}<<{delimiter}\n{value}\n{delimiter}\n"
    with open(path, "a", encoding="utf-8", errors="surrogateescape") as out:
        out.write(text)


def run(defer_exit: bool) -> int:
    flag("upload-sarif", True)  # read by action.yml; a value that is not true or false is refused here
    command = env("command", "check") or "check"
    if command not in COMMANDS:
        raise InputError("command", f"{command!r} is not one of {', '.join(COMMANDS)}", "write check or lint")
    models = expand_models(env("models"), command)
    common = common_args(command)
    if command == "check" and len(models) > 1 and {"-o", "--output"} & {a.split("=", 1)[0] for a in common}:
        raise InputError("args", "-o with several models: every check would write the same file", "drop -o")
    sarif = Path(env("sarif") or "autocast-onnx.sarif")
    report = Path(env("report-json") or "autocast-onnx-report.json")
    for name, path in (("sarif", sarif), ("report-json", report)):
        if "\r" in str(path):  # the runner ends an output's line at a carriage return
            raise InputError(name, f"{str(path)!r} holds a carriage return", "name a file without one")
    for path in (sarif, report):
        path.unlink(missing_ok=True)  # never upload a previous run's file as this run's
        path.parent.mkdir(parents=True, exist_ok=True)
    url = docs_url()
    if url and "AUTOCAST_ONNX_DOCS_URL" not in os.environ:
        os.environ["AUTOCAST_ONNX_DOCS_URL"] = url
    code = (run_check if command == "check" else run_lint)(models, common, sarif, report)
    verdict = {0: "pass", 1: "fail"}.get(code, "error")
    named = f"{len(models)} model(s)" if command == "check" else f"{len(models)} path(s)"
    print(f"autocast-onnx {command}: {named}, exit code {code} ({verdict})", flush=True)
    write_outputs(
        **{
            "exit-code": str(code),
            "sarif": str(sarif) if sarif.is_file() else "",
            "report-json": str(report) if report.is_file() else "",
        }
    )
    return 0 if defer_exit else code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("install", help="pip install the package input")
    run_parser = sub.add_parser("run", help="run the command over the models")
    run_parser.add_argument("--defer-exit", action="store_true", help="exit 0; the verdict goes to GITHUB_OUTPUT")
    options = parser.parse_args(argv)
    try:
        if options.step == "install":
            return subprocess.run(pip_command(), check=False).returncode
        return run(options.defer_exit)
    except InputError as e:
        print(e, file=sys.stderr)
        write_outputs(**{"exit-code": "2", "sarif": "", "report-json": ""})
        return 0 if getattr(options, "defer_exit", False) else 2


if __name__ == "__main__":
    sys.exit(main())
