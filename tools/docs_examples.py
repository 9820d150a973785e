"""Keep the documented example outputs and option lists current.

Examples: in the pages listed in PAGES, a ```sh block followed by a ```text block is an example:
the commands and what they print. This tool runs every ```sh and ```python block of a page in
order (a block with no output after it, such as `mkdir -p out`, only prepares the next ones), in
a scratch folder
that holds the repository's examples/ and an empty out/, with the project's environment first on
PATH, and compares what each prints (stdout and stderr) with the ```text block after it. Timings
and check's measured errors are masked: they may differ from machine to machine, nothing else
may.

Option lists: every `--option` a usage block (a ``` block whose lines start `autocast-onnx
COMMAND`) of a page gives for COMMAND must be an option of COMMAND, and every option of a command
the page shows a usage block for must appear in the page (README.md, docs/lint.md: the
commands' reference pages).

    python tools/docs_examples.py            # check: list what drifted, exit 1 if anything did
    python tools/docs_examples.py --write    # rewrite the ```text blocks with what the commands print now

tests/contracts/test_docs_current.py runs the check, so a change of output or options that the docs do not
follow fails the suite."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("docs/summary.md", "docs/lint.md")  # pages whose examples are run
USAGE_PAGES = ("README.md", "docs/lint.md")  # pages whose usage blocks are checked against the commands
FENCE = re.compile(r"^( *)```(\w*)\s*$")
SECONDS = re.compile(r"\d+(?:\.\d+)? s\b")
TIME_LINE = re.compile(r"^time: .*$", re.M)
# a measured error depends on the CPU's kernels (its last digit may differ between machines)
MEASURED = re.compile(r"(worst relative error) [-+.\deE]+")


@dataclass
class Block:
    lang: str
    indent: str
    start: int  # line index of the first line inside the fence
    end: int  # line index of the closing fence
    text: str  # the content, dedented by the fence's indent


def blocks(lines: list[str]) -> list[Block]:
    """The fenced blocks of a page, in order."""
    out, k = [], 0
    while k < len(lines):
        opening = FENCE.match(lines[k])
        if opening is None:
            k += 1
            continue
        indent, lang = opening.groups()
        end = k + 1
        while end < len(lines) and not re.match(rf"^{indent}```\s*$", lines[end]):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line for line in lines[k + 1 : end]]
        out.append(Block(lang, indent, k + 1, end, "\n".join(body)))
        k = end + 1
    return out


RUNNABLE = ("sh", "python")


def examples(lines: list[str]) -> list[tuple[Block, Block | None]]:
    """(sh or python block, the text block right after it or None), in page order."""
    found = blocks(lines)
    pairs = []
    for k, block in enumerate(found):
        if block.lang not in RUNNABLE:
            continue
        after = found[k + 1] if k + 1 < len(found) else None
        between = lines[block.end + 1 : after.start - 1] if after is not None else []
        shown = after if after is not None and after.lang == "text" and not any(x.strip() for x in between) else None
        pairs.append((block, shown))
    return pairs


def masked(text: str) -> str:
    """Output with what may differ from run to run or machine to machine masked: seconds, the
    whole time line, and the measured error of check's summary."""
    text = MEASURED.sub(r"\1 <measured>", TIME_LINE.sub("time: <masked>", text))
    return SECONDS.sub("<seconds>", text).rstrip("\n")


def scratch() -> Path:
    """A folder to run examples in: the repository's examples/ (linked) and an empty out/."""
    folder = Path(tempfile.mkdtemp(prefix="docs-examples."))
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / "out").mkdir()
    return folder


def run(command: str, cwd: Path) -> str:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("AUTOCAST_ONNX_DEBUG", None)
    env["NO_COLOR"] = "1"
    done = subprocess.run(  # one pipe: stdout and stderr in the order they were written
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout.rstrip("\n")


def check_examples(page: str, write: bool = False) -> list[str]:
    """Run the examples of `page`; returns a diff per example whose output drifted (and with
    `write`, puts the new outputs in the page)."""
    path = ROOT / page
    lines = path.read_text(encoding="utf-8").split("\n")
    drifted, replacements = [], []
    folder = scratch()
    try:
        for command, shown in examples(lines):
            script = command.text if command.lang == "sh" else f"python - <<'PYTHON'\n{command.text}\nPYTHON"
            got = run(script, folder)
            if shown is None:
                continue
            if masked(got) != masked(shown.text):
                diff = difflib.unified_diff(
                    masked(shown.text).split("\n"), masked(got).split("\n"), "documented", "printed", lineterm=""
                )
                drifted.append(f"{page}:{command.start + 1}: {command.text.splitlines()[0]}\n" + "\n".join(diff))
                replacements.append((shown, got))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if write and replacements:
        for shown, got in sorted(replacements, key=lambda r: -r[0].start):
            lines[shown.start : shown.end] = [(shown.indent + x).rstrip() if x else "" for x in got.split("\n")]
        path.write_text("\n".join(lines), encoding="utf-8")
    return drifted


def command_options() -> dict[str, list[set[str]]]:
    """Every command's options, each as the set of its spellings (--format, --output-format; -o,
    --output), from the program itself; --help left out."""
    import click

    from autocast_onnx.cli.main import cli

    out = {}
    for name, command in cli.commands.items():
        out[name] = [
            set(param.opts + param.secondary_opts)
            for param in command.params
            if isinstance(param, click.Option) and "--help" not in param.opts
        ]
    return out


def _spellings(options: list[set[str]]) -> set[str]:
    return set().union(*options) if options else set()


def abbreviations(options: dict[str, list[set[str]]]) -> dict[str, set[str]]:
    """What a usage block's shorthand stands for: the validation options (validate's), the plan
    options (plan/options.py declares each planning option's flag)."""
    from autocast_onnx.plan.options import planning_fields

    flags = {f.metadata["flag"] for f in planning_fields()}
    plan = _spellings([o for o in options["convert"] if o & flags])
    validation = _spellings(options["validate"])
    return {"[plan options]": plan, "[validation options]": validation, "[same options]": validation}


USAGE = re.compile(r"^autocast-onnx (\w+)\b")
OPTION = re.compile(r"(?<![\w-])--?[a-zA-Z][a-z0-9-]*")


def check_usage(page: str) -> list[str]:
    """Usage blocks of `page` (plain ``` blocks of lines `autocast-onnx COMMAND ...`) against the
    commands: an option a block gives that its command lacks, and an option of a command the page
    has a usage block for that the page mentions nowhere (in any spelling, or through a block's
    `[plan options]`, `[validation options]` or `[same options]`)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    options = command_options()
    short = abbreviations(options)
    problems, shown = [], set()
    mentioned = set(OPTION.findall(text))
    for block in blocks(text.split("\n")):
        if block.lang:  # ```sh examples run (check_examples); usage blocks have no language
            continue
        command = None
        for line in block.text.split("\n"):
            head = USAGE.match(line)
            if head is not None:
                command = head.group(1) if head.group(1) in options else None
                shown.update([command] if command else [])
            elif not line.startswith(" "):
                command = None
            if command is None:
                continue
            known = _spellings(options[command])
            for word, spelled in short.items():
                if word in line:
                    mentioned |= spelled
            for option in OPTION.findall(line):
                if option.startswith("--") and option not in known:
                    problems.append(f"{page}:{block.start + 1}: {command} has no option {option}")
    for command in sorted(shown):
        missing = [max(o, key=len) for o in options[command] if not o & mentioned]
        if missing:
            problems.append(f"{page}: the options of {command} not mentioned: {', '.join(sorted(missing))}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the drifted ```text blocks")
    parser.add_argument("pages", nargs="*", default=list(PAGES), help="pages whose examples to run")
    args = parser.parse_args(argv)
    usage = [p for page in USAGE_PAGES for p in check_usage(page)]
    drifted = [p for page in args.pages for p in check_examples(page, write=args.write)]
    for problem in usage + drifted:
        print(problem)
    if drifted and not args.write:
        print(f"{len(drifted)} example(s) drifted; `python tools/docs_examples.py --write` refreshes their outputs")
    elif drifted:
        print(f"{len(drifted)} example output(s) rewritten: review the diff")
    if usage:
        print(f"{len(usage)} option list(s) to fix by hand")
    return 1 if usage or (drifted and not args.write) else 0


if __name__ == "__main__":
    sys.exit(main())
