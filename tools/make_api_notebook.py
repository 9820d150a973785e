"""Write docs/api.ipynb: convert -> validate -> explain on an example model, with the outputs
of running each cell here (so the notebook shows real results; tests/api/test_python_api.py runs
its code again).

    python tools/make_api_notebook.py
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    (
        "markdown",
        "# autocast-onnx from Python\n\nConvert the BERT example, validate it, and ask why nodes got "
        "their precision. Every function takes the CLI's options as keywords (see [api.md](api.md)). Run from "
        "the repository root.",
    ),
    ("code", 'import autocast_onnx\n\nresult = autocast_onnx.convert("examples/models/bert_tiny.onnx")\nresult'),
    ("code", "print(result.summary())"),
    (
        "markdown",
        "Validate the converted model against the fp32 one, on generated inputs (no GPU here: the "
        "fp16 rounding is emulated on CPU).",
    ),
    (
        "code",
        'report = autocast_onnx.validate("examples/models/bert_tiny.onnx", result.model, speed=False)\nreport',
    ),
    ("code", "[(o.name, o.relative_error, o.cosine) for o in report.outputs]"),
    ("markdown", "Why is each softmax fp32? `explain` takes a node name, a regex, or an op type."),
    ("code", 'entries = autocast_onnx.explain("examples/models/bert_tiny.onnx", op="Softmax")\nentries'),
    ("code", "print(entries[0].explain())"),
    (
        "markdown",
        "And what would lint say about a model converted by another tool? Lint the fp32 model as if "
        "everything ran in fp16:",
    ),
    ("code", 'autocast_onnx.lint("examples/models/bert_tiny.onnx")'),
]


def run_cell(source: str, scope: dict) -> list[dict]:
    """Run one cell like a notebook kernel: its prints, then the value of a last bare expression."""
    import ast

    tree = ast.parse(source)
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    body = ast.Module(tree.body[:-1] if last else tree.body, type_ignores=[])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(body, "<cell>", "exec"), scope)
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), scope) if last else None
    outputs = []
    if out.getvalue():
        outputs.append({"output_type": "stream", "name": "stdout", "text": out.getvalue().splitlines(True)})
    if value is not None:
        outputs.append(
            {
                "output_type": "execute_result",
                "execution_count": None,
                "metadata": {},
                "data": {"text/plain": repr(value).splitlines(True)},
            }
        )
    return outputs


def main() -> None:
    import os

    os.chdir(ROOT)
    scope: dict = {}
    cells = []
    count = 0
    for kind, source in CELLS:
        cell = {"cell_type": kind, "metadata": {}, "source": source.splitlines(True)}
        if kind == "code":
            count += 1
            cell["execution_count"] = count
            cell["outputs"] = run_cell(source, scope)
            for o in cell["outputs"]:
                if o["output_type"] == "execute_result":
                    o["execution_count"] = count
        cells.append(cell)
    notebook = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (ROOT / "docs" / "api.ipynb").write_text(json.dumps(notebook, indent=1) + "\n", encoding="utf-8")
    print("wrote docs/api.ipynb")


if __name__ == "__main__":
    main()
