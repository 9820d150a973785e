"""The compute tables (autocast_onnx/data/compute_<runtime>.json, tools/kernel_compute.py) and their accessor
(catalog/compute.py): how each runtime's kernel computes at fp16 and bf16, read from its source at the kernel
tables' commit (issue 37, item 1)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from onnx import TensorProto

from autocast_onnx.catalog import compute, kernels
from autocast_onnx.catalog.compute import ComputeFact, computes_in_fp32
from autocast_onnx.errors import AutocastError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "autocast_onnx" / "data"
ORT_TREE = pathlib.Path("/work/.mirror/gedoensmax+onnxruntime/repo")
TRT_TREE = pathlib.Path("/work/.mirror/onnx+onnx-tensorrt/repo")
F16, BF16 = TensorProto.FLOAT16, TensorProto.BFLOAT16
SOURCE = re.compile(r"^(?P<path>[\w./+-]+):(?P<first>\d+)(-(?P<last>\d+))?$")


def tool():
    spec = importlib.util.spec_from_file_location("kernel_compute", ROOT / "tools" / "kernel_compute.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def load(runtime: str) -> dict:
    return json.loads((DATA / f"compute_{runtime}.json").read_text(encoding="utf-8"))


# --- the tables ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("runtime", ["cuda", "dml", "tensorrt"])
def test_every_row_cites_recorded_files_at_the_kernel_tables_commit(runtime):
    table = load(runtime)
    assert table["commit"] == kernels.kernel_table(runtime)["source"]["commit"]
    assert re.fullmatch(r"[0-9a-f]{40}", table["commit"]) and table["date"][:4] in ("2024", "2025")
    assert all(re.fullmatch(r"[0-9a-f]{40}", blob) for blob in table["files"].values())
    sources = [e["source"] for r in table["ops"] for e in r["evidence"]]
    sources += [e["source"] for r in table["ops"] for k in r["conditions"] for e in k["evidence"]]
    sources += [e["source"] for e in table.get("provider", {}).get("evidence", [])]
    assert sources
    for source in sources:
        m = SOURCE.match(source)
        assert m, source
        assert m["path"] in table["files"], source
        assert int(m["first"]) <= int(m["last"] or m["first"]), source
    for row in table["ops"]:
        if row["compute"] is not None:
            assert row["source"] == row["evidence"][0]["source"] and row["note"], row["op"]


def test_the_cuda_table_is_of_the_cuda_kernel_tables_version():
    table = load("cuda")
    assert table["runtime"] == "onnxruntime-cuda" and table["version"] == kernels.kernel_table("cuda")["onnxruntime"]
    assert table["commit"].startswith("577eac9") and table["repo"] == "microsoft/onnxruntime"


@pytest.mark.slow
def test_the_script_check_passes_on_the_shipped_tables():
    """`python tools/kernel_compute.py --check`, without the sources: the shipped tables are what the script's rows
    write, well formed, and every (op, type) they list has a kernel in the runtime's kernel table."""
    assert tool().check() == []
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "kernel_compute.py"), "--check"], capture_output=True)
    assert run.returncode == 0, run.stderr.decode()


def _tampered(tmp_path, monkeypatch, edit) -> list[str]:
    module = tool()
    for name in ("compute_cuda.json", "compute_dml.json", "compute_tensorrt.json"):
        shutil.copy(DATA / name, tmp_path / name)
    for name in ("kernels_cuda.json", "kernels_dml.json", "kernels_tensorrt.json"):
        shutil.copy(DATA / name, tmp_path / name)
    table = json.loads((tmp_path / "compute_cuda.json").read_text())
    edit(table)
    (tmp_path / "compute_cuda.json").write_text(json.dumps(table, indent=1) + "\n")
    monkeypatch.setattr(module, "DATA", tmp_path)
    return module.check()


def test_the_check_refuses_a_hand_edited_row(tmp_path, monkeypatch):
    def edit(table):
        next(r for r in table["ops"] if r["op"] == "SkipLayerNormalization")["compute"] = "float"

    problems = _tampered(tmp_path, monkeypatch, edit)
    assert any("compute_cuda.json: not what the rows write" in p and "SkipLayerNormalization" in p for p in problems)


def test_the_check_refuses_a_type_without_a_kernel(tmp_path, monkeypatch):
    """Conv has no bfloat16 CUDA kernel in kernels_cuda.json: a row claiming one is flagged."""

    def edit(table):
        next(r for r in table["ops"] if r["op"] == "Conv")["types"] = ["bfloat16", "float16"]

    problems = _tampered(tmp_path, monkeypatch, edit)
    assert any("('', 'Conv') ['bfloat16'] has no kernel in kernels_cuda.json" in p for p in problems)


def test_the_check_refuses_a_cite_of_an_unrecorded_file(tmp_path, monkeypatch):
    def edit(table):
        table["files"].pop(next(iter(table["files"])))

    problems = _tampered(tmp_path, monkeypatch, edit)
    assert any("cites a file the table does not record" in p for p in problems)


def _repo(tmp_path) -> tuple[str, str]:
    """A one-file git tree: kernel.cu with three lines."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "kernel.cu").write_text("float x = a;\nhalf y = half(expf((float)x));\nreturn y;\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "kernel.cu"], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=tree, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True, check=True)
    return str(tree / ".git"), commit.stdout.strip()


def test_verify_holds_each_cite_to_its_file_lines_and_text(tmp_path):
    """The script's citation check: a quote at its lines passes (the blob id is recorded); a quote on other lines,
    lines past the end, and a file the commit lacks each fail the run, all named."""
    module = tool()
    git_dir, commit = _repo(tmp_path)
    good = module.c("kernel.cu", 2, 2, "half(expf((float)x))")
    files = module.verify(git_dir, commit, [good])
    assert list(files) == ["kernel.cu"] and re.fullmatch(r"[0-9a-f]{40}", files["kernel.cu"])
    bad = [
        module.c("kernel.cu", 1, 1, "half(expf"),
        module.c("kernel.cu", 3, 9, "return"),
        module.c("nope.cu", 1, 1, "x"),
    ]
    with pytest.raises(SystemExit) as err:
        module.verify(git_dir, commit, [good, *bad])
    text = str(err.value)
    assert "kernel.cu:1: 'half(expf' is not there (its start is on lines [2])" in text
    assert "kernel.cu:3-9: the file has 3 lines" in text and "nope.cu:1: no such file" in text


@pytest.mark.skipif(
    not (ORT_TREE.is_dir() and TRT_TREE.is_dir()), reason="needs the stored source trees (absent in CI)"
)
def test_shipped_tables_are_what_the_script_writes_from_the_sources(tmp_path, monkeypatch):
    """With the trees: every citation holds at its commit, and the tables written are the shipped ones, byte for
    byte."""
    module = tool()
    argv = ["kernel_compute.py", "--git-dir", str(ORT_TREE), "--trt-git-dir", str(TRT_TREE), "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    assert module.main() == 0
    for name in ("compute_cuda.json", "compute_dml.json", "compute_tensorrt.json"):
        assert (tmp_path / name).read_text(encoding="utf-8") == (DATA / name).read_text(encoding="utf-8"), name


def test_the_tables_ship_as_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["autocast_onnx"]
    for name in ("compute_cuda.json", "compute_dml.json", "compute_tensorrt.json"):
        assert any((DATA / name).relative_to(DATA.parent).match(p) for p in patterns), name


# --- the accessor -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("low", [F16, BF16])
def test_softmax_computes_in_float_and_rounds_once(low):
    fact = computes_in_fp32(None, "", "Softmax", low)
    assert isinstance(fact, ComputeFact)
    assert (fact.op, fact.compute, fact.rounds, fact.fp32_once) == ("Softmax", "float", "once", True)
    assert fact.label == "onnxruntime-cuda 1.23.0" and fact.low_type == low
    assert fact.source == "onnxruntime/core/providers/cuda/math/softmax.cc:31-39@577eac9a9"
    # the path for rows of 1025..2048 in large batches rounds inside the kernel: listed, not hidden
    [lean] = fact.conditions
    assert "1024 < D <= 2048" in lean.when and lean.rounds == "per-step" and not fact.fp32_once_on_every_path


def test_none_is_the_cuda_provider_and_ai_onnx_the_default_domain():
    assert computes_in_fp32(None, "", "LayerNormalization", F16) == computes_in_fp32(
        "cuda", "ai.onnx", "LayerNormalization", F16
    )


@pytest.mark.parametrize(
    "domain, op, low, compute, rounds",
    [
        ("", "Add", F16, "native", "once"),
        ("", "Add", BF16, "float", "once"),
        ("", "LayerNormalization", F16, "float", "once"),
        ("", "LayerNormalization", BF16, "float", "once"),
        ("", "ReduceSum", F16, "float", "once"),
        ("", "ReduceMean", F16, "float", "per-step"),
        ("", "MatMul", BF16, "float", "once"),
        ("", "Exp", F16, "float", "once"),
        ("", "Sigmoid", F16, "float", "once"),
        ("", "Sigmoid", BF16, "native", "per-step"),
        ("", "InstanceNormalization", F16, "native", "per-step"),
        ("", "Gelu", F16, "float", "once"),
        ("com.microsoft", "SkipLayerNormalization", F16, "native", "per-step"),
        ("com.microsoft", "FastGelu", F16, "native", "per-step"),
        ("com.microsoft", "BiasGelu", BF16, "native", "per-step"),
        ("com.microsoft", "GroupNorm", F16, "float", "once"),
        ("com.microsoft", "MultiHeadAttention", F16, "float", "per-step"),
    ],
)
def test_the_cuda_facts(domain, op, low, compute, rounds):
    fact = computes_in_fp32(None, domain, op, low)
    assert fact is not None and (fact.compute, fact.rounds) == (compute, rounds)
    assert fact.fp32_once == (compute == "float" and rounds == "once")


def test_skip_layer_norm_is_float_once_only_in_strict_mode():
    fact = computes_in_fp32(None, "com.microsoft", "SkipLayerNormalization", F16)
    assert fact is not None and "in T" in fact.note
    [strict] = fact.conditions
    assert "enable_skip_layer_norm_strict_mode" in strict.when and strict.fp32_once


def test_gelu_tanh_is_listed_as_another_path():
    fact = computes_in_fp32(None, "", "Gelu", F16)
    assert fact is not None and fact.fp32_once
    [tanh] = fact.conditions
    assert tanh.when == "approximate = 'tanh'" and (tanh.compute, tanh.rounds) == ("native", "per-step")


def test_what_the_table_does_not_list_is_none():
    assert computes_in_fp32(None, "", "NoSuchOp", F16) is None
    assert computes_in_fp32(None, "", "Conv", BF16) is None  # no bf16 CUDA kernel
    assert computes_in_fp32(None, "", "Softmax", TensorProto.FLOAT) is None  # not a low type
    assert computes_in_fp32(None, "com.microsoft", "Softmax", F16) is None  # another domain


def test_runtime_any_counts_on_nothing():
    assert computes_in_fp32("any", "", "Softmax", F16) is None


def test_an_unknown_runtime_is_refused():
    with pytest.raises(AutocastError, match="no compute table for runtime 'rocm'"):
        computes_in_fp32("rocm", "", "Softmax", F16)


def test_directml_knows_nothing_per_op_and_says_why():
    assert computes_in_fp32("dml", "", "Softmax", F16) is None
    table = compute.compute_table("dml")
    assert table["ops"] and all(r["compute"] is None and "nothing known" in r["note"] for r in table["ops"])
    assert "DML_EXECUTION_FLAG_ALLOW_HALF_PRECISION_COMPUTATION" in table["provider"]["note"]


def test_tensorrt_layer_norm_computes_in_float_at_an_unknown_rounding():
    fact = computes_in_fp32("tensorrt", "", "LayerNormalization", F16)
    assert fact is not None and fact.label == "TensorRT 10.0"
    assert (fact.compute, fact.rounds, fact.fp32_once) == ("float", "unknown", False)
    assert fact.source.startswith("onnxOpImporters.cpp:2781-2782@96e781103")
    assert computes_in_fp32("tensorrt", "", "Softmax", F16) is None
