"""The pre-commit hooks run as pre-commit would run them (the GitHub Actions example and the
action it uses: tests/tools/test_action.py).

The manifest is read with a small line parser; it keeps to one `key: value` per line for that
(see the comment at the top of .pre-commit-hooks.yaml)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[2]
HOOKS = ROOT / ".pre-commit-hooks.yaml"
CI_README = ROOT / "examples" / "ci" / "README.md"


# ---- tiny parsers ---------------------------------------------------------------------------


def _scalar(text: str):
    """A YAML scalar or flow list as these files write them: plain, 'single' or "double"
    quoted, true/false, or [a, b]."""
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_scalar(part) for part in inner.split(",")] if inner else []
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if text in ("true", "false"):
        return text == "true"
    return text


def _strip_comment(line: str) -> str:
    """Drop a trailing ` # comment` outside quotes."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip()
    return line.rstrip()


def parse_hooks(text: str) -> list[dict]:
    """A pre-commit manifest: a top-level list of flat mappings."""
    hooks = []
    for raw in text.splitlines():
        line = _strip_comment(raw)
        if not line.strip():
            continue
        item = re.match(r"^-\s+(.*)$", line)
        if item:
            hooks.append({})
            line = item.group(1)
        else:
            assert raw.startswith(" "), f"unexpected top-level line: {raw!r}"
            assert hooks, f"a key before the first hook: {raw!r}"
        key, sep, value = line.strip().partition(":")
        assert sep and value.strip(), f"not a one-line `key: value`: {raw!r}"
        assert key not in hooks[-1], f"duplicate key {key!r}"
        hooks[-1][key] = _scalar(value)
    return hooks


def test_parser_reads_flow_lists_quotes_and_comments():
    hooks = parse_hooks("- id: a  # x\n  files: '\\.onnx$'\n  stages: [manual, 'pre-push']\n  on: true\n- id: b\n")
    assert hooks == [{"id": "a", "files": r"\.onnx$", "stages": ["manual", "pre-push"], "on": True}, {"id": "b"}]


# The GitHub Actions example uses the action at the repository root: tests/tools/test_action.py runs it.


# ---- the pre-commit hooks -------------------------------------------------------------------


def hooks() -> dict:
    parsed = parse_hooks(HOOKS.read_text(encoding="utf-8"))
    by_id = {h["id"]: h for h in parsed}
    assert len(by_id) == len(parsed)
    for hook in parsed:
        assert {"id", "name", "entry", "language"} <= set(hook), hook
    return by_id


def test_hook_manifest():
    found = hooks()
    lint = found["autocast-onnx-lint"]
    assert lint["entry"] == "autocast-onnx lint"
    assert lint["language"] == "python"
    assert lint["files"] == r"\.onnx$"
    assert lint.get("pass_filenames", True) is True
    assert lint["require_serial"] is True  # one lint run over all the files, as the tests below run it
    assert "stages" not in lint  # runs at every commit
    check = found["autocast-onnx-check"]
    assert check["entry"] == "autocast-onnx check"
    assert check["language"] == "python"
    assert check["stages"] == ["manual"]
    assert check["pass_filenames"] is False  # check takes exactly one model, named in args
    regex = re.compile(lint["files"])
    assert regex.search("examples/models/bert_tiny.onnx")
    assert not regex.search("examples/models/digits_cnn.json")
    assert not regex.search("model.onnx.data")


def run_hook(hook: dict, files) -> subprocess.CompletedProcess:
    """Run a hook as pre-commit does: its entry, split like a shell, then the file names."""
    argv = shlex.split(hook["entry"])
    assert argv[0] == "autocast-onnx"
    argv = [sys.executable, "-m", "autocast_onnx", *argv[1:], *hook.get("args", []), *map(str, files)]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_lint_hook_passes_on_the_example_models():
    lint = hooks()["autocast-onnx-lint"]
    regex = re.compile(lint["files"])
    files = sorted(
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "examples" / "models").iterdir()
        if p.is_file() and regex.search(p.relative_to(ROOT).as_posix())
    )
    assert files == sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples" / "models").glob("*.onnx"))
    assert len(files) >= 5
    proc = run_hook(lint, files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # fp32 models: the findings the default rules protect are info; nothing is an error
    assert re.search(r"^\d+ finding\(s\): 0 error, ", proc.stdout, re.M), proc.stdout
    for f in files:
        assert f"{f}: " in proc.stdout and "fp32 model, checked as if" in proc.stdout


def fp16_softmax_model(path: Path) -> Path:
    node = helper.make_node("Softmax", ["scores"], ["probs"], name="attention/Softmax", axis=-1)
    graph = helper.make_graph(
        [node],
        "fp16_softmax",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT16, [2, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT16, [2, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


@pytest.mark.slow
def test_lint_hook_fails_on_softmax_in_fp16(tmp_path):
    lint = hooks()["autocast-onnx-lint"]
    bad = fp16_softmax_model(tmp_path / "fp16_softmax.onnx")
    assert re.compile(lint["files"]).search(bad.as_posix())
    proc = run_hook(lint, [ROOT / "examples" / "models" / "bert_tiny.onnx", bad])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "AC101 softmax-in-low-precision [error]" in proc.stdout
    assert "attention/Softmax (Softmax): Softmax computed in fp16" in proc.stdout


def test_ci_readme_pre_commit_snippet_names_the_shipped_hooks():
    text = CI_README.read_text(encoding="utf-8")
    snippet = re.search(r"```yaml\n(repos:\n.*?)```", text, re.S)
    assert snippet, "examples/ci/README.md has no .pre-commit-config.yaml snippet"
    ids = re.findall(r"-\s+id:\s*(\S+)", snippet.group(1))
    assert ids and set(ids) <= set(hooks())
