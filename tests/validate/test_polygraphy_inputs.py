"""Polygraphy's JSON input files (issue 31, item 2): `--inputs` (validate, convert --validate,
diagnose, --calibration-data) reads the files `polygraphy run --save-inputs` writes, a list of feed
dicts or a folder of per-iteration files, checked as an .npz is and never unpickled; `--save-inputs
FILE.json` writes one that Polygraphy reads back. The files under tests/data/polygraphy/ were
written by Polygraphy itself (its README gives the commands)."""

from __future__ import annotations

import base64
import io
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from bad_input_helpers import assert_ok, assert_one_error, invoke, isolated_cwd

import autocast_onnx
from autocast_onnx.errors import AutocastError
from autocast_onnx.validate import inputs as inputs_module
from autocast_onnx.validate.inputs import check_batches, describe_inputs, load_batches

isolated = pytest.fixture(autouse=True)(isolated_cwd)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "polygraphy"
DIGITS = ROOT / "examples" / "models" / "digits_cnn.onnx"
BERT = ROOT / "examples" / "models" / "bert_tiny.onnx"


def decoded(path: Path) -> list[dict]:
    """The feed dicts of a Polygraphy file, decoded here independently of the project's reader:
    each array is the .npy that numpy.save wrote, base64-encoded (polygraphy/json/serde.py)."""
    loaded = json.loads(path.read_text())
    dicts = loaded if isinstance(loaded, list) else [loaded]
    return [
        {name: np.load(io.BytesIO(base64.b64decode(entry["array"])), allow_pickle=False) for name, entry in d.items()}
        for d in dicts
    ]


def encoded(array: np.ndarray, allow_pickle: bool = False) -> dict:
    """One array as Polygraphy's JSON encoder writes it."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return {"array": base64.b64encode(buffer.getvalue()).decode(), "polygraphy_class": "ndarray"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """digits_cnn and bert_tiny converted to fp16 once for the module."""
    folder = tmp_path_factory.mktemp("converted")
    out = {}
    for source in (DIGITS, BERT):
        target = folder / f"{source.stem}.fp16.onnx"
        autocast_onnx.convert_file(source, target)
        out[source.stem] = target
    return out


# ---- reading Polygraphy's own files -----------------------------------------------------------
@pytest.mark.parametrize(
    "model, data, batches, shape",
    [
        (DIGITS, DATA / "digits_cnn_inputs.json", 1, [1, 1, 8, 8]),
        (BERT, DATA / "bert_tiny_inputs.json", 2, [2, 8]),
        (DIGITS, DATA / "digits_cnn_iters", 2, [1, 1, 8, 8]),
    ],
)
def test_validate_reads_polygraphy_written_inputs(converted, tmp_path, model, data, batches, shape):
    report = tmp_path / "r.json"
    assert_ok(invoke(["validate", model, converted[model.stem], "--inputs", data, "--report-json", report]))
    inputs = json.loads(report.read_text())["inputs"]
    assert inputs["source"] == str(data) and inputs["batches"] == batches
    assert {s["shape"][0] for s in inputs["specs"]} == {shape[0]} and inputs["specs"][0]["shape"] == shape


def test_api_batches_are_polygraphy_arrays(converted):
    specs = describe_inputs(onnx.load(BERT))
    batches = load_batches(DATA / "bert_tiny_inputs.json", specs)
    expected = decoded(DATA / "bert_tiny_inputs.json")
    assert len(batches) == 2
    for got, want in zip(batches, expected):
        assert sorted(got) == sorted(want)
        for name in want:
            assert got[name].dtype == np.int64
            np.testing.assert_array_equal(got[name], want[name])
    folder = load_batches(DATA / "digits_cnn_iters", describe_inputs(onnx.load(DIGITS)))
    files = sorted((DATA / "digits_cnn_iters").glob("*.json"))
    for got, f in zip(folder, files, strict=True):
        np.testing.assert_array_equal(got["pixels"], decoded(f)[0]["pixels"])
    report = autocast_onnx.validate(BERT, converted["bert_tiny"], inputs=DATA / "bert_tiny_inputs.json")
    assert report.passed and report.data["inputs"]["batches"] == 2


def test_calibration_convert_validate_diagnose_and_check_read_json(converted, tmp_path):
    data = DATA / "digits_cnn_inputs.json"
    plan = tmp_path / "plan.json"
    out = tmp_path / "cal.onnx"
    args = [
        "convert",
        DIGITS,
        "-o",
        out,
        "--calibration-data",
        data,
        "--plan-out",
        plan,
        "--validate",
        "--inputs",
        data,
    ]
    assert_ok(invoke(args))
    assert out.is_file() and plan.is_file()
    from autocast_onnx.validate.on_data import plan_on_data

    pixels = decoded(data)[0]["pixels"]
    calibration = plan_on_data(DIGITS, calibration_data=data).calibration
    assert calibration is not None and calibration["pixels"].max_abs == float(np.abs(pixels).max())
    report = tmp_path / "d.json"
    assert_ok(invoke(["diagnose", DIGITS, converted["digits_cnn"], "--inputs", data, "--report-json", report]))
    gate = tmp_path / "c.json"
    assert_ok(invoke(["check", DIGITS, "--inputs", DATA / "digits_cnn_iters", "--report-json", gate]))
    assert json.loads(gate.read_text())["validation"]["inputs"]["batches"] == 2
    with pytest.raises(AutocastError, match="missing input"):
        autocast_onnx.convert(BERT, calibration_data=data)


def test_stacked_samples_in_a_feed_dict_are_split_as_in_an_npz(tmp_path):
    specs = describe_inputs(onnx.load(DIGITS))
    fixed = [inputs_module.InputSpec("pixels", onnx.TensorProto.FLOAT, [1, 1, 8, 8])]
    x = np.random.default_rng(0).random((3, 1, 8, 8)).astype(np.float32)
    f = tmp_path / "stacked.json"
    f.write_text(json.dumps([{"pixels": encoded(x)}]))
    assert len(load_batches(f, specs)) == 1  # a symbolic batch axis takes the array whole
    split = load_batches(f, fixed)
    assert len(split) == 3 and all(b["pixels"].shape == (1, 1, 8, 8) for b in split)


# ---- bad files: one line, exit code 2 ---------------------------------------------------------
def _pickled() -> str:
    return base64.b64encode(pickle.dumps({"pixels": [1.0, 2.0]})).decode()


def _object_npy() -> dict:
    return encoded(np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


def _truncated() -> dict:
    entry = encoded(np.zeros((1, 1, 8, 8), np.float32))
    return {**entry, "array": entry["array"][:-7]}


def _cut_at_a_quad() -> dict:
    entry = encoded(np.zeros((1, 1, 8, 8), np.float32))
    return {**entry, "array": entry["array"][:-40]}


PIXELS = np.zeros((1, 1, 8, 8), np.float32)
BAD_FILES = [
    ("not-a-list", "5", "holds a number, not a list of feed dicts"),
    ("not-json", "[{", "is not JSON"),
    ("empty-list", "[]", "holds no feed dicts"),
    ("list-of-lists", "[[1]]", "feed dict 0 is a list, not an object"),
    ("wrong-name", json.dumps([{"image": encoded(PIXELS)}]), "missing input(s) pixels; feed dict 0 holds image"),
    ("pickle", json.dumps([{"pixels": {"array": _pickled(), "polygraphy_class": "ndarray"}}]), "a Python pickle"),
    ("object-npy", json.dumps([{"pixels": _object_npy()}]), "an object array"),
    ("truncated-base64", json.dumps([{"pixels": _truncated()}]), "is not valid base64"),
    ("truncated-data", json.dumps([{"pixels": _cut_at_a_quad()}]), "but its base64 holds"),
    ("text-dtype", json.dumps([{"pixels": encoded(np.array([["a"]]))}]), "has dtype <U1 (text)"),
    ("wrong-shape", json.dumps([{"pixels": encoded(np.zeros((1, 8, 8), np.float32))}]), "has 3 dimension(s)"),
    ("torch", json.dumps([{"pixels": {"tensor": "UEsDBA==", "polygraphy_class": "Tensor"}}]), "torch.save pickles"),
    ("plain-list", json.dumps([{"pixels": [[1.0]]}]), "array 'pixels' of feed dict 0 is a list"),
    ("unknown-key", json.dumps([{"pixels": {**encoded(PIXELS), "extra": 1}}]), "unexpected key 'extra'"),
    ("duplicate", '[{"pixels": 1, "pixels": 2}]', "names 'pixels' twice"),
]


@pytest.mark.parametrize("text, fragment", [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES])
def test_bad_polygraphy_files_give_one_line(converted, tmp_path, text, fragment):
    f = tmp_path / "bad.json"
    f.write_text(text)
    line = assert_one_error(invoke(["validate", DIGITS, converted["digits_cnn"], "--inputs", f]), fragment)
    assert str(f) in line
    with pytest.raises(AutocastError) as caught:
        check_batches(f, describe_inputs(onnx.load(DIGITS)))
    assert fragment in str(caught.value)


def test_pickles_are_refused_without_being_loaded(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append(a))
    f = tmp_path / "p.json"
    f.write_text(json.dumps([{"pixels": _object_npy()}]))
    with pytest.raises(AutocastError, match="never unpickles"):
        load_batches(f, describe_inputs(onnx.load(DIGITS)))
    assert calls == []


def test_a_batch_over_the_size_limit_is_refused_as_an_npz_is(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs_module, "GENERATED_LIMIT", 100)
    line = assert_one_error(
        invoke(["validate", DIGITS, DIGITS, "--inputs", DATA / "digits_cnn_inputs.json"]),
        "the inputs of this batch would take",
        "over the",
    )
    assert "feed dict 0" in line


def test_a_file_over_the_file_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from autocast_onnx.validate import polygraphy_json

    monkeypatch.setattr(polygraphy_json, "FILE_LIMIT", 100)
    reads = []
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: reads.append(self))
    with pytest.raises(AutocastError, match=r"over the .* a file may take") as caught:
        load_batches(DATA / "digits_cnn_inputs.json", describe_inputs(onnx.load(DIGITS)))
    assert "per-iteration files" in caught.value.hint and reads == []


def test_older_polygraphy_encodings_are_read(tmp_path):
    """The type marker of older Polygraphy versions, and .npy bytes held as latin-1 text."""
    x = np.random.default_rng(1).random((1, 1, 8, 8)).astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, x, allow_pickle=False)
    legacy = {
        "array": buffer.getvalue().decode("latin-1"),
        "__polygraphy_encoded_ndarray": "polygraphy_serialized_json_type",
    }
    f = tmp_path / "old.json"
    f.write_text(json.dumps([{"pixels": legacy}]))
    (batch,) = load_batches(f, describe_inputs(onnx.load(DIGITS)))
    np.testing.assert_array_equal(batch["pixels"], x)


def test_a_folder_of_both_npz_and_json_is_refused(tmp_path):
    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(DATA / "digits_cnn_inputs.json", folder / "a.json")
    np.savez(folder / "b.npz", pixels=PIXELS)
    assert_one_error(invoke(["validate", DIGITS, DIGITS, "--inputs", folder]), "both .npz and .json files")


# ---- writing: --save-inputs FILE.json ---------------------------------------------------------
def test_save_inputs_json_round_trip_gives_the_same_figures(converted, tmp_path):
    saved, first, second = tmp_path / "x.json", tmp_path / "a.json", tmp_path / "b.json"
    conv = converted["bert_tiny"]
    args = ["validate", BERT, conv, "--seed", "5", "--batches", "2", "--save-inputs", saved, "--report-json", first]
    assert_ok(invoke(args))
    written = json.loads(saved.read_text())
    assert isinstance(written, list) and len(written) == 2
    assert set(written[0]["input_ids"]) == {"array", "polygraphy_class"}
    assert written[0]["input_ids"]["polygraphy_class"] == "ndarray"
    assert_ok(invoke(["validate", BERT, conv, "--inputs", saved, "--report-json", second]))
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["outputs"] == b["outputs"] and b["inputs"]["batches"] == 2
    assert a["inputs"]["specs"] == b["inputs"]["specs"]


def test_save_inputs_npz_still_writes_one_batch(converted, tmp_path):
    args = ["validate", DIGITS, converted["digits_cnn"], "--batches", "2", "--save-inputs", tmp_path / "s.npz"]
    assert_one_error(invoke(args), "--save-inputs writes one batch, and --batches is 2", "FILE.json")


def test_saved_json_is_read_by_polygraphy(converted, tmp_path):
    """Polygraphy's own decoder reads what --save-inputs wrote (skipped where Polygraphy is absent:
    it is no dependency of the project; the round trip above holds the format without it)."""
    serde = pytest.importorskip("polygraphy.json", reason="Polygraphy is not installed (no dependency of the project)")
    saved = tmp_path / "x.json"
    assert_ok(invoke(["validate", DIGITS, converted["digits_cnn"], "--save-inputs", saved]))
    feeds = serde.load_json(str(saved))
    np.testing.assert_array_equal(feeds[0]["pixels"], decoded(saved)[0]["pixels"])


# ---- a training step's data inputs -------------------------------------------------------------
def test_training_step_reads_one_feed_dict(tmp_path):
    """validate's training step (validate/training.py) reads its data inputs with load_arrays:
    every array of one feed dict, none checked against specs (its model has parameters too)."""
    arrays = inputs_module.load_arrays(DATA / "digits_cnn_inputs.json")
    np.testing.assert_array_equal(arrays["pixels"], decoded(DATA / "digits_cnn_inputs.json")[0]["pixels"])
    with pytest.raises(AutocastError, match="holds 2 feed dicts, and a training step runs one batch"):
        inputs_module.load_arrays(DATA / "bert_tiny_inputs.json")
    pickled = tmp_path / "p.json"
    pickled.write_text(json.dumps({"input": _object_npy()}))
    with pytest.raises(AutocastError, match="never unpickles"):
        inputs_module.load_arrays(pickled)
    archive = tmp_path / "a.npz"
    np.savez(archive, input=PIXELS)
    assert list(inputs_module.load_arrays(archive)) == ["input"]
