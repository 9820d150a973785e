"""The latency step of the peer benchmark (benchmarks/bench_latency.py) and how bench_peers.py
adds its figures to the table: real ONNX Runtime sessions on the CPU provider, since the CUDA
measurement itself needs a GPU machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import onnxruntime
import pytest

from autocast_onnx import convert_file

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "models" / "digits_cnn.onnx"


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def latency():
    return _module("bench_latency")


@pytest.fixture(scope="module")
def peers():
    return _module("bench_peers")


@pytest.fixture
def kept(tmp_path):
    """A folder as bench_peers.py --keep leaves it: the source, one output, the manifest."""
    (tmp_path / "sources").mkdir()
    shutil.copyfile(MODEL, tmp_path / "sources" / "digits_cnn.onnx")
    convert_file(MODEL, tmp_path / "digits_cnn.autocast-onnx.onnx")
    entry = {
        "model": "digits_cnn",
        "tool": "autocast-onnx",
        "source": "sources/digits_cnn.onnx",
        "output": "digits_cnn.autocast-onnx.onnx",
    }
    (tmp_path / "manifest.json").write_text(json.dumps([entry]))
    return tmp_path


def test_cpu_latency_of_source_and_output(latency, kept, tmp_path, capsys):
    out = tmp_path / "lat.json"
    rc = latency.main([str(kept), "--device", "cpu", "--iterations", "3", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["label"].startswith("CPU, onnxruntime ")
    base, conv = data["rows"]
    assert (base["tool"], conv["tool"]) == ("fp32", "autocast-onnx")
    assert base["ms"] > 0 and conv["ms"] > 0
    assert conv["vs_fp32"] == pytest.approx(conv["ms"] / base["ms"])
    assert 0 <= conv["error"] < 1e-2  # the converted model answers like the fp32 one
    printed = capsys.readouterr().out
    assert "| digits_cnn | autocast-onnx |" in printed and "not a GPU figure" in printed


def test_an_output_runtime_rejects_is_a_failed_row(latency, kept, tmp_path):
    (kept / "digits_cnn.autocast-onnx.onnx").write_bytes(b"not a model")
    out = tmp_path / "lat.json"
    assert latency.main([str(kept), "--device", "cpu", "--iterations", "1", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][1]
    assert row["ok"] is False and "cannot load" in row["failure"]


@pytest.mark.skipif(
    "CUDAExecutionProvider" in onnxruntime.get_available_providers(),
    reason="this machine's ONNX Runtime has the CUDA provider: the refusal cannot happen here",
)
def test_cuda_without_the_provider_is_one_error_line(latency, kept, capsys):
    assert latency.main([str(kept), "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --device cuda: ONNX Runtime has no CUDA execution provider")


def test_folder_without_manifest_or_with_a_missing_file(latency, kept, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert latency.main([str(empty), "--device", "cpu"]) == 2
    assert "no manifest.json here" in capsys.readouterr().err
    (kept / "digits_cnn.autocast-onnx.onnx").unlink()
    assert latency.main([str(kept), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "listed in" in err[0] and "missing" in err[0]


def test_unknown_model_selection_is_an_error(latency, kept, capsys):
    assert latency.main([str(kept), "--device", "cpu", "--models", "resnet"]) == 2
    assert "--models resnet: not in the manifest" in capsys.readouterr().err


def test_peers_table_gains_latency_columns(peers, capsys):
    rows = [
        {"model": "m", "nodes": 3, "tool": "floor", "ok": True, "seconds": 1.0},
        {
            "model": "m", "nodes": 3, "tool": "autocast-onnx", "ok": True, "seconds": 1.5, "peak_rss": 2**20,
            "checker": True, "ort_loads": True, "fp32_ops_in_fp16": 0, "casts_added": 2, "error": 1e-4,
        },
        {"model": "m", "nodes": 3, "tool": "ort-float16", "ok": False, "error": "crashed"},
    ]  # fmt: skip
    latency = {
        "label": "GPU X, onnxruntime 1.0 (cuda)",
        "rows": [
            {"model": "m", "tool": "fp32", "ok": True, "ms": 2.0},
            {"model": "m", "tool": "autocast-onnx", "ok": True, "ms": 1.0, "vs_fp32": 0.5},
            {"model": "other", "tool": "autocast-onnx", "ok": True, "ms": 1.0, "vs_fp32": 0.5},
        ],
    }
    peers.add_latency(rows, latency)
    assert "warning: latency of other/autocast-onnx matches no row" in capsys.readouterr().err
    text = peers.table(rows)
    header, _, ours, failed = text.splitlines()[:4]
    assert header.endswith("| latency ms | latency × fp32 |")
    assert ours.endswith("| 1.000 | 0.50 |")
    assert header.count("|") == ours.count("|") == failed.count("|")
    assert "median ms per run on GPU X, onnxruntime 1.0 (cuda)" in text


def test_peers_table_without_latency_has_no_latency_columns(peers):
    rows = [
        {
            "model": "m", "nodes": 3, "tool": "autocast-onnx", "ok": True, "seconds": 1.5, "peak_rss": 2**20,
            "checker": True, "ort_loads": True, "fp32_ops_in_fp16": 0, "casts_added": 2, "error": None,
        }
    ]  # fmt: skip
    assert "latency" not in peers.table(rows)
