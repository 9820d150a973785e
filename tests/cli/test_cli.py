"""The command line: README commands, summary, outputs, external data, exit codes."""

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from helpers import F32, init, model, run, tensor
from onnx import helper

from autocast_onnx.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "examples" / "models" / "bert_tiny.onnx"


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.slow
def test_readme_quick_start_convert_command_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)\n```", text, re.S).group(1)
    command = first.split("&&")[-1].strip()
    argv = shlex.split(command)
    assert argv[0].endswith("autocast-onnx") and argv[1] == "convert"
    # run it as the README does, from the repository root, with outputs redirected to tmp_path
    argv = [sys.executable, "-m", "autocast_onnx"] + argv[1:]
    for flag in ("-o", "--plan-out"):
        k = argv.index(flag)
        argv[k + 1] = str(tmp_path / argv[k + 1])
    before = sha(BERT)
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "converted to fp16" in proc.stdout and "casts added" in proc.stdout
    assert (tmp_path / "bert_tiny.fp16.onnx").is_file()
    assert json.loads((tmp_path / "bert_tiny.plan.json").read_text())["target"] == "fp16"
    assert sha(BERT) == before


def test_readme_test_command_is_what_ci_runs():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", text, re.S)
    assert blocks[1].strip() in (ROOT / ".ci" / "run").read_text()


def small(tmp_path, name="m.onnx"):
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Softmax", ["h"], ["y"], name="softmax"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [2, 8])],
        [tensor("y", F32, [2, 8])],
        [init("w", np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32))],
    )
    path = tmp_path / name
    onnx.save(m, path)
    return path


def test_default_output_beside_input_and_summary(tmp_path):
    path = small(tmp_path)
    result = invoke("convert", path)
    assert result.exit_code == 0
    out = tmp_path / "m.fp16.onnx"
    onnx.checker.check_model(onnx.load(out), full_check=True)
    assert "nodes: 2  fp16: 1  fp32: 1" in result.output
    assert "weights: initializers 256 B -> 128 B" in result.output
    assert re.search(r"time: [0-9.]+ s", result.output)


def test_bf16_and_no_keep_io_types(tmp_path):
    path = small(tmp_path)
    result = invoke("convert", path, "--precision", "bf16", "--no-keep-io-types", "-q")
    assert result.exit_code == 0 and result.output == ""
    out = onnx.load(tmp_path / "m.bf16.onnx")
    assert out.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


def test_plan_out_and_excludes(tmp_path):
    path = small(tmp_path)
    plan = tmp_path / "plan.json"
    result = invoke("convert", path, "-o", tmp_path / "o.onnx", "--exclude-op", "MatMul", "--plan-out", plan)
    assert result.exit_code == 0
    nodes = {n["name"]: n for n in json.loads(plan.read_text())["nodes"]}
    assert nodes["fc"]["precision"] == "fp32"


def error_line(proc):
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("autocast-onnx: error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


def cli_proc(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "autocast_onnx", *map(str, args)], capture_output=True, text=True, cwd=cwd
    )


@pytest.mark.slow
def test_output_equal_to_input_is_refused(tmp_path):
    path = small(tmp_path)
    before = sha(path)
    proc = cli_proc("convert", path, "-o", path)
    assert proc.returncode == 2
    assert "output path is the input" in error_line(proc)
    assert sha(path) == before


def test_unwritable_output_folder(tmp_path, monkeypatch):
    # Tests run as root in CI, where permission bits do not stop writes; simulate the folder check.
    import autocast_onnx.io as aio
    from autocast_onnx.errors import AutocastError
    from autocast_onnx.pipeline import convert_file

    path = small(tmp_path)
    monkeypatch.setattr(aio.os, "access", lambda p, mode: False)
    with pytest.raises(AutocastError, match="output folder is not writable"):
        convert_file(path, tmp_path / "o.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.slow
def test_missing_output_folder(tmp_path):
    path = small(tmp_path)
    proc = cli_proc("convert", path, "-o", tmp_path / "nope" / "o.onnx")
    assert proc.returncode == 2 and "output folder does not exist" in error_line(proc)


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    import autocast_onnx.io as aio

    path = small(tmp_path)
    real_replace = os.replace

    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(aio.os, "replace", disk_full)
    from autocast_onnx.errors import AutocastError
    from autocast_onnx.pipeline import convert_file

    with pytest.raises(AutocastError, match="No space left"):
        convert_file(path, tmp_path / "o.onnx")
    monkeypatch.setattr(aio.os, "replace", real_replace)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.slow
def test_bad_regex_flag(tmp_path):
    proc = cli_proc("convert", small(tmp_path), "--exclude-node", "([")
    assert proc.returncode == 2 and "bad regex" in error_line(proc)


@pytest.mark.slow
def test_unknown_option_is_a_usage_error(tmp_path):
    proc = cli_proc("convert", small(tmp_path), "--precision", "fp8")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def external_model(tmp_path):
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
    ]
    m = model(
        nodes,
        [tensor("x", F32, [2, 64])],
        [tensor("y", F32, [2, 64])],
        [
            init("w1", rng.standard_normal((64, 64)).astype(np.float32) * 0.1),
            init("w2", rng.standard_normal((64, 64)).astype(np.float32) * 0.1),
        ],
    )
    src = tmp_path / "src"
    src.mkdir()
    stored = onnx.ModelProto()
    stored.CopyFrom(m)  # onnx.save moves the weights of the model it saves out to the data file
    onnx.save(stored, src / "ext.onnx", save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    return m, src / "ext.onnx"


def test_external_data_round_trip(tmp_path):
    original, path = external_model(tmp_path)
    before = sha(path), sha(path.with_name("ext.onnx.data"))
    out = tmp_path / "out" / "ext.fp16.onnx"
    out.parent.mkdir()
    result = invoke("convert", path, "-o", out, "--check", "full")
    assert result.exit_code == 0, result.output
    assert (out.parent / "ext.fp16.onnx.data").is_file()
    loaded = onnx.load(out)  # loads the external data from beside the output
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in loaded.graph.initializer)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(run(loaded, {"x": x})[0], run(original, {"x": x})[0], atol=5e-3)
    assert (sha(path), sha(path.with_name("ext.onnx.data"))) == before


@pytest.mark.slow
def test_missing_external_data(tmp_path):
    _, path = external_model(tmp_path)
    path.with_name("ext.onnx.data").unlink()
    proc = cli_proc("convert", path, "-o", tmp_path / "o.onnx")
    assert proc.returncode == 2 and "external data file 'ext.onnx.data' is missing" in error_line(proc)
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.slow
def test_external_data_outside_model_folder_is_refused(tmp_path):
    _, path = external_model(tmp_path)
    m = onnx.load(path, load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../secret.data"
    (tmp_path / "secret.data").write_bytes(b"\0" * 64 * 64 * 8)
    onnx.save(m, path)
    proc = cli_proc("convert", path, "-o", tmp_path / "o.onnx")
    assert proc.returncode == 2 and "outside the model's folder" in error_line(proc)


@pytest.mark.slow
def test_cycle_is_reported(tmp_path):
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="first"),
        helper.make_node("Relu", ["a"], ["b"], name="second"),
        helper.make_node("Relu", ["a"], ["y"], name="out"),
    ]
    m = model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])])
    path = tmp_path / "cycle.onnx"
    path.write_bytes(m.SerializeToString())
    proc = cli_proc("convert", path)
    assert proc.returncode == 2 and "cycle" in error_line(proc)


@pytest.mark.slow
def test_dangling_input_is_reported(tmp_path):
    nodes = [helper.make_node("Relu", ["ghost"], ["y"], name="reads_nothing")]
    m = model(nodes, [tensor("x", F32, [2])], [tensor("y", F32, [2])])
    path = tmp_path / "dangling.onnx"
    path.write_bytes(m.SerializeToString())
    proc = cli_proc("convert", path)
    assert proc.returncode == 2 and "reads tensor 'ghost', which nothing produces" in error_line(proc)


def test_unsorted_graph_is_written_sorted(tmp_path):
    nodes = [
        helper.make_node("MatMul", ["h", "w"], ["y"], name="late"),
        helper.make_node("Relu", ["x"], ["h"], name="early"),
    ]
    m = model(nodes, [tensor("x", F32, [2, 8])], [tensor("y", F32, [2, 8])], [init("w", np.eye(8, dtype=np.float32))])
    path = tmp_path / "unsorted.onnx"
    path.write_bytes(m.SerializeToString())
    result = invoke("convert", path, "--check", "full")
    assert result.exit_code == 0, result.output
    assert "not topologically sorted and were written sorted: main" in result.output
    out = onnx.load(tmp_path / "unsorted.fp16.onnx")
    names = [n.name for n in out.graph.node if n.op_type != "Cast"]
    assert names == ["early", "late"]


@pytest.mark.slow
def test_output_whose_data_file_is_the_inputs_data_is_refused(tmp_path):
    # input ext.onnx keeps its weights in ext.onnx.data; "-o ext.onnx.data" would write the
    # model over them, and "-o ext" would write its own data file ext.data... both must be safe
    _, path = external_model(tmp_path)
    data = path.with_name("ext.onnx.data")
    before = sha(data)
    proc = cli_proc("convert", path, "-o", data)
    assert proc.returncode == 2 and "would overwrite a file of the input model" in error_line(proc)
    proc = cli_proc("convert", path, "-o", path.with_name("ext"), "--external-data")
    assert proc.returncode == 0, proc.stderr  # writes ext and ext.data: different files
    assert sha(data) == before
